"""How a study spends its real trials: all real (with the recheck), or twin-first
(:mod:`.twin_first`)."""

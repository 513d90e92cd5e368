"""What a study found, by job: the result model read back from a study's trials
(:mod:`.model`), repeated measurements of one behaviour merged (:mod:`.merge`), the host's noise
told from the engine's (:mod:`.noise`), the twin's error as its trust check judges it
(:mod:`.trust`), the text ``chunktune tune`` and ``chunktune results`` print (:mod:`.text`), and
the files ``--out`` writes: ``result.json`` and the plots (:mod:`.files`, :mod:`.plots`).

Pure functions of the study's trials (read back from storage), so ``chunktune results`` prints
the same table from storage alone.
"""

"""The twin of one user's engine: the step-time model fitted to the engine's own per-step log
(:mod:`.step_fit`), kept as a calibration profile (:mod:`.profile`, ``chunktune calibrate``),
and measured runs replayed through the simulator to state its error (:mod:`.fidelity`)."""

"""What one engine step costs on a GPU: the step-time model (:mod:`.step_time`), tensor-parallel
collectives (:mod:`.collectives`), the measured kernel data (:mod:`.kernel_data`) and the fit
of the model's efficiencies to it (:mod:`.kernel_fit`, ``python -m
chunktune.sim.cost.kernel_fit fit|report``)."""

"""The offline kernel fit: what regenerates the step-time model's committed coefficients and
tables (``chunktune/sim/cost/data``) from the measured kernels in the shared data, and reports
the model's error on them. ``python -m chunktune.sim.cost.fit.kernel_fit fit|report``
(:mod:`.kernel_fit`: the per-GPU fit, its families :mod:`.family_fit`, NCCL's curve
:mod:`.nccl_fit`, the error report :mod:`.kernel_report`, over the measured kernels of
:mod:`.measurements`, read by :mod:`.aic_kernels` and :mod:`.kernel_data`);
``python -m chunktune.sim.cost.fit.moe_derive`` and ``.mla_derive`` rewrite the MoE and MLA
tables. Nothing here runs in a simulation: the runtime (:mod:`chunktune.sim.cost`) never
imports this package (``.importlinter``)."""

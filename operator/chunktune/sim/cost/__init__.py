"""What one engine step costs on a GPU, as a simulation reads it at run time: the step-time
model (:mod:`.step_time`), tensor-parallel collectives (:mod:`.collectives`), the committed
coefficients and measured tables it looks up (:mod:`.coefficients`, :mod:`.gemm_table`,
:mod:`.moe_table`, :mod:`.mla_table`, read from ``data/``), and where each GPU's figures come
from (:mod:`.provenance`). The offline fit that regenerates those committed files from the
shared data lives apart, in :mod:`.fit`, and the runtime never imports it."""

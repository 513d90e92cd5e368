"""GPU data-sheet figures: memory as the CUDA runtime reports it, HBM bandwidth, dense bf16
tensor FLOP/s and the bandwidth of the link tensor-parallel all-reduces run over.

Sources: NVIDIA data sheets (A100, H100, H200, L40S, L4, A10) and AWS's G5 page for the A10G.
``memory_gib`` is what ``torch.cuda.mem_get_info`` reports as total (a little under the marketing
figure), which is what vLLM multiplies by ``gpu_memory_utilization``. ``family`` picks the
fitted efficiency coefficients of the step-time model (Ampere or Hopper; Ada GPUs use the
Ampere fit, the closest measured architecture).
"""

from __future__ import annotations

from dataclasses import dataclass

from chunktune.core.errors import SpecError


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    hbm_tb_s: float
    bf16_tflops: float
    link_gb_s: float
    family: str
    #: The name as ``torch.cuda.get_device_name`` gives it (vLLM keys its defaults on it).
    device_name: str

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("a100-sxm", 79.15, 2.039, 312.0, 600.0, "ampere", "NVIDIA A100-SXM4-80GB"),
        GPU("a100-pcie", 79.15, 1.935, 312.0, 64.0, "ampere", "NVIDIA A100 80GB PCIe"),
        GPU("a100-40g", 39.39, 1.555, 312.0, 600.0, "ampere", "NVIDIA A100-SXM4-40GB"),
        GPU("h100-sxm", 79.19, 3.35, 989.0, 900.0, "hopper", "NVIDIA H100 80GB HBM3"),
        GPU("h100-pcie", 79.19, 2.0, 756.0, 128.0, "hopper", "NVIDIA H100 PCIe"),
        GPU("h200", 139.8, 4.8, 989.0, 900.0, "hopper", "NVIDIA H200"),
        GPU("l40s", 44.39, 0.864, 362.0, 64.0, "ampere", "NVIDIA L40S"),
        GPU("l4", 22.04, 0.300, 121.0, 64.0, "ampere", "NVIDIA L4"),
        GPU("a10g", 22.06, 0.600, 70.0, 64.0, "ampere", "NVIDIA A10G"),
    )
}

_ALIASES = {
    "a100": "a100-sxm", "a100-80g": "a100-sxm", "a100-80g-sxm": "a100-sxm",
    "a100-sxm4-80gb": "a100-sxm", "a100-80g-pcie": "a100-pcie", "h100": "h100-sxm",
    "h100-80g": "h100-sxm", "h100-80g-sxm": "h100-sxm", "h100-sxm5": "h100-sxm",
    "h200-141g": "h200", "h200-sxm": "h200", "nvidia-h100-80gb-hbm3": "h100-sxm",
    "nvidia-a100-sxm4-80gb": "a100-sxm", "nvidia-l4": "l4", "nvidia-l40s": "l40s",
    "nvidia-a10g": "a10g", "nvidia-h200": "h200",
}


def gpu_names() -> list[str]:
    return sorted(GPUS)


def resolve_gpu(name: str, field: str = "--gpu") -> GPU:
    """The GPU for a short name (``h100-sxm``), an alias (``H100``) or a device name."""
    key = name.strip().lower().replace(" ", "-").replace("_", "-")
    key = key if key in GPUS else _ALIASES.get(key, key)
    if key not in GPUS:
        raise SpecError(f"unknown GPU {name!r}; use one of {', '.join(gpu_names())}", field=field)
    return GPUS[key]

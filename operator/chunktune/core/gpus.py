"""GPU data-sheet figures: memory as the CUDA runtime reports it, HBM bandwidth, dense bf16
tensor FLOP/s and the bandwidth of the link tensor-parallel all-reduces run over.

Sources: NVIDIA data sheets (A100, H100, H200, L40S, L4, A10, A40, GeForce RTX 4090, RTX PRO
6000 Blackwell Server Edition) and AWS's G5 page for the A10G; SM counts from the same sheets
(the attention term's occupancy depends on them). The RTX 4090's memory is the total its CUDA
runtime reported in LLMServingSim's vLLM 0.19 run (25,250,627,584 bytes).
``memory_gib`` is what ``torch.cuda.mem_get_info`` reports as total (a little under the marketing
figure), which is what vLLM multiplies by ``gpu_memory_utilization``. ``family`` is the
architecture (``ampere``, ``hopper``, ``ada``, ``blackwell``): the step-time model's per-step
overheads and the NVSwitch generation of an SXM board follow it; its efficiency coefficients are
per GPU (``chunktune.sim.cost.coefficients``), fitted on that GPU's own measured kernels or
borrowed from the nearest GPU that has them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chunktune.core.errors import SpecError

#: Links at least this fast (GB/s, both directions) are NVLink; slower ones PCIe.
NVLINK_MIN_GB_S = 200.0


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    hbm_tb_s: float
    bf16_tflops: float
    link_gb_s: float
    family: str
    #: Streaming multiprocessors (data sheet).
    sm_count: int
    #: The name as ``torch.cuda.get_device_name`` gives it (vLLM keys its defaults on it).
    device_name: str
    #: L2 cache, MiB (data sheet / architecture whitepaper; see ``_L2_MIB``).
    l2_mib: float = 0.0
    #: SM boost clock, MHz (data sheet; see ``_BOOST_MHZ``).
    boost_mhz: float = 0.0
    #: The FlashAttention generation vLLM's attention backend runs here (see
    #: ``_FLASH_ATTENTION``): 2 issues the softmax beside the MMAs of the same warps, 3 and
    #: later overlap them (warp-specialised).
    flash_attention: int = 2
    #: Dense FP8 tensor FLOP/s (data sheet, TFLOP/s, FP32 accumulate; see ``_FP8_TFLOPS``). 0:
    #: no FP8 tensor cores (Ampere), where vLLM runs FP8 checkpoints weight-only (Marlin).
    fp8_tflops: float = 0.0
    #: Whether the node's GPUs reach each other peer to peer over PCIe (``nvidia-smi topo -p2p
    #: r`` says OK between every two a server uses), as its operator states it
    #: (``spec.engine.gpu.peerToPeer``); None: not stated. A property of the host, not the
    #: card: it decides which all-reduce vLLM runs over PCIe
    #: (:func:`chunktune.sim.cost.collectives.pcie_allreduce_s`). NVLink GPUs always have it.
    peer_to_peer: bool | None = None
    #: Dense FP4 tensor FLOP/s (data sheet, TFLOP/s; see ``_FP4_TFLOPS``). 0: not stated.
    fp4_tflops: float = 0.0
    #: The memory the data sheet's bandwidth is of (see ``_MEMORY``): ``hbm`` (stacked, the
    #: datacenter parts), ``gddr`` (the workstation and GeForce boards), ``ddr`` (the CPU).
    memory: str = "hbm"

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    @property
    def nvlink(self) -> bool:
        """Whether tensor-parallel ranks talk over NVLink (a link of ``NVLINK_MIN_GB_S`` or
        more), else PCIe."""
        return self.link_gb_s >= NVLINK_MIN_GB_S


#: L2 cache per GPU, MiB. Sources: NVIDIA A100 Tensor Core GPU Architecture whitepaper (A100:
#: 40 MB), NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5 and PCIe: 50 MB; the
#: H200 is the same GH100 configuration), NVIDIA Ampere GA102 GPU Architecture whitepaper (GA102
#: boards A40 and A10/A10G: 6,144 KB), NVIDIA Ada GPU Architecture whitepaper v2.01 (GeForce RTX
#: 4090: 73,728 KB = 72 MB of the full AD102's 96 MB; L40S: 96 MB; L4: 48 MB), NVIDIA RTX
#: Blackwell GPU Architecture whitepaper (GB202: 128 MB, all of it on the RTX PRO 6000; the
#: RTX 5090 has 96 MB), NVIDIA Blackwell datacenter architecture (B200: 126 MB over its two
#: dies; B300 and GB200 publish none: the B200's, the same two-die design). The CPU entry's
#: figure is nominal (a server's last-level cache).
_L2_MIB = {"a100-sxm": 40, "a100-pcie": 40, "a100-40g": 40, "h100-sxm": 50, "h100-pcie": 50,
           "h200": 50, "l40s": 96, "l4": 48, "a10g": 6, "a40": 6, "rtx4090": 72,
           "rtx-pro-6000": 128, "b200": 126, "b300": 126, "gb200": 126, "cpu": 32}

#: SM boost clock per GPU, MHz, from the NVIDIA data sheets and whitepapers: A100 1410, A40 1740,
#: A10 1695 (AWS publishes none for the A10G; the A10's), L40S 2520, L4 2040, GeForce RTX 4090
#: 2520 (Ada whitepaper). Where the sheet gives a FP32 peak but no clock, the clock is that peak
#: over SMs x 128 FP32 lanes x 2: H100 SXM and H200 67 TF / 132 SMs = 1980, H100 PCIe 51 TF /
#: 114 SMs = 1750, RTX PRO 6000 Blackwell Server Edition 120 TF / 188 SMs = 2493. B200: no
#: published clock or FP32 peak; 1965 MHz is the maximum SM clock its driver reports (an
#: estimate; it only enters the FlashAttention-2 terms, which the B200 does not run); B300 and
#: GB200 publish none either: the B200's. The CPU entry's figure is nominal.
_BOOST_MHZ = {"a100-sxm": 1410, "a100-pcie": 1410, "a100-40g": 1410, "h100-sxm": 1980,
              "h100-pcie": 1750, "h200": 1980, "l40s": 2520, "l4": 2040, "a10g": 1695,
              "a40": 1740, "rtx4090": 2520, "rtx-pro-6000": 2493, "b200": 1965, "b300": 1965,
              "gb200": 1965, "cpu": 2000}

#: The memory kind per GPU where it is not HBM (data sheets: A40, A10G, L40S, L4 GDDR6; GeForce
#: RTX 4090 GDDR6X; RTX PRO 6000 Blackwell GDDR7; the A100, H100, H200, B200, B300 and GB200
#: HBM2e / HBM3 / HBM3e).
_MEMORY = {"a40": "gddr", "a10g": "gddr", "l40s": "gddr", "l4": "gddr", "rtx4090": "gddr",
           "rtx-pro-6000": "gddr", "cpu": "ddr"}

#: Dense FP8 tensor TFLOP/s with FP32 accumulate (what vLLM's CUTLASS scaled-mm kernels use):
#: NVIDIA H100 data sheet (SXM 1,979, PCIe 1,513; H200 as the SXM), L40S data sheet (733), L4
#: (242), Ada whitepaper (GeForce RTX 4090: 330.3 with FP32 accumulate, the half rate of its
#: 660.6 with FP16 accumulate), RTX PRO 6000 Server Edition (twice its bf16 483.6: 967.2) and
#: HGX B200 (4,500), HGX B300 (72 PF sparse over 8 GPUs: 4,500 dense each) and GB200 NVL72
#: (720 PF sparse over 72 GPUs: 5,000 dense each). Ampere has none.
_FP8_TFLOPS = {"h100-sxm": 1979.0, "h100-pcie": 1513.0, "h200": 1979.0, "l40s": 733.0,
               "l4": 242.0, "rtx4090": 330.3, "rtx-pro-6000": 967.2, "b200": 4500.0,
               "b300": 4500.0, "gb200": 5000.0}

#: Dense FP4 (NVFP4) tensor TFLOP/s where the GPU has FP4 tensor cores that vLLM's W4A4 GEMMs
#: run on (compute capability 10.x): HGX B200 (144 PF sparse over 8 GPUs: 9,000 dense each),
#: HGX B300 (108 PF dense over 8 GPUs: 13,500 each; Blackwell Ultra's FP4 rate is 1.5x the
#: B200's at the same FP8 rate) and GB200 NVL72 (1,440 PF sparse over 72 GPUs: 10,000 dense
#: each). Only the ratio of two GPUs' figures is used: a GPU without an NVFP4 GEMM grid of its
#: own borrows a neighbour's scaled by it (:func:`chunktune.sim.cost.gemm_table.nvfp4_lender`).
_FP4_TFLOPS = {"b200": 9000.0, "b300": 13500.0, "gb200": 10000.0}

#: FlashAttention generation per GPU where it is not 2: vLLM (0.32,
#: ``vllm/v1/attention/backends/fa_utils.py``, ``get_flash_attn_version``) runs FA3 on compute
#: capability 9 (Hopper), FA4 on 10 (B200; AIConfigurator's B200 timings
#: ran FlashInfer's TRT-LLM kernels, also warp-specialised) and FA2 on every other
#: card (Ampere 8.0/8.6, Ada 8.9, the RTX PRO 6000's Blackwell 12.0).
_FLASH_ATTENTION = {"h100-sxm": 3, "h100-pcie": 3, "h200": 3, "b200": 4, "b300": 4,
                    "gb200": 4}

GPUS: dict[str, GPU] = {
    g.name: replace(g, l2_mib=float(_L2_MIB[g.name]), boost_mhz=float(_BOOST_MHZ[g.name]),
                    flash_attention=_FLASH_ATTENTION.get(g.name, 2),
                    fp8_tflops=_FP8_TFLOPS.get(g.name, 0.0), memory=_MEMORY.get(g.name, "hbm"),
                    fp4_tflops=_FP4_TFLOPS.get(g.name, 0.0))
    for g in (
        GPU("a100-sxm", 79.15, 2.039, 312.0, 600.0, "ampere", 108, "NVIDIA A100-SXM4-80GB"),
        GPU("a100-pcie", 79.15, 1.935, 312.0, 64.0, "ampere", 108, "NVIDIA A100 80GB PCIe"),
        GPU("a100-40g", 39.39, 1.555, 312.0, 600.0, "ampere", 108, "NVIDIA A100-SXM4-40GB"),
        GPU("h100-sxm", 79.19, 3.35, 989.0, 900.0, "hopper", 132, "NVIDIA H100 80GB HBM3"),
        GPU("h100-pcie", 79.19, 2.0, 756.0, 128.0, "hopper", 114, "NVIDIA H100 PCIe"),
        GPU("h200", 139.8, 4.8, 989.0, 900.0, "hopper", 132, "NVIDIA H200"),
        # HGX B200 (per GPU): 180 GB HBM3e (CUDA total estimated as nvidia-smi's 183,359 MiB
        # less the ~0.5 GiB the H100's runtime keeps back), 8 TB/s, 2.25 PF dense bf16,
        # NVLink 5 at 1.8 TB/s, 148 SMs.
        GPU("b200", 178.6, 8.0, 2250.0, 1800.0, "blackwell", 148, "NVIDIA B200"),
        # No kernel timings here: every family is borrowed (chunktune.sim.cost.coefficients).
        # HGX B300 data sheet (nvidia.com/en-us/data-center/hgx, per GPU of the 8): 288 GB
        # HBM3e (CUDA total estimated with the B200's ratio of reported to marketed, 178.6 /
        # 180), 8 TB/s, FP16/BF16 36 PF sparse over 8 GPUs = 2.25 PF dense each, NVLink 5 at
        # 1.8 TB/s; 160 SMs (NVIDIA Blackwell Ultra technical blog, 2025).
        GPU("b300", 285.7, 8.0, 2250.0, 1800.0, "blackwell", 160, "NVIDIA B300 SXM6 AC"),
        # GB200 NVL72 data sheet (nvidia.com/en-us/data-center/gb200-nvl72, per GPU of the
        # 72): 186 GB HBM3e (13.4 TB / 72; CUDA total estimated as the B300's), 8 TB/s, FP16/
        # BF16 360 PF sparse / 72 = 2.5 PF dense each, NVLink 5 at 1.8 TB/s; 148 SMs as the
        # B200 (the sheet gives none). Tensor parallelism inside one NVL72 domain.
        GPU("gb200", 184.5, 8.0, 2500.0, 1800.0, "blackwell", 148, "NVIDIA GB200"),
        GPU("l40s", 44.39, 0.864, 362.0, 64.0, "ada", 142, "NVIDIA L40S"),
        GPU("l4", 22.04, 0.300, 121.0, 64.0, "ada", 58, "NVIDIA L4"),
        GPU("a10g", 22.06, 0.600, 70.0, 64.0, "ampere", 80, "NVIDIA A10G"),
        GPU("a40", 44.34, 0.696, 149.7, 112.5, "ampere", 84, "NVIDIA A40"),
        # GeForce: bf16 tensor math accumulates in fp32, which runs at half rate: 165.2 TF
        # (330.3 TF is fp16 with fp16 accumulate, which vLLM does not use). LLMServingSim's
        # vLLM 0.19 GEMMs reach 165 TF at 2048 tokens (boost clocks above the sheet's 2520 MHz).
        GPU("rtx4090", 23.5165, 1.008, 165.2, 32.0, "ada", 128, "NVIDIA GeForce RTX 4090"),
        # Server Edition (the device LLMServingSim measured): 1597 GB/s GDDR7 (the Workstation
        # Edition's 1792 GB/s is another SKU); 503.8 TF dense bf16 with fp32 accumulate.
        # Link: 64 GB/s, PCIe Gen4 x16's figure, though the card is Gen5 x16 (128): the
        # engine prices a PCIe ring at 0.75 of the per-direction half (24 GB/s here), and the
        # measured box's NCCL at 4 and 8 ranks reaches 30 / 24 GB/s of bus bandwidth (Gen5
        # would price it twice as fast; bench/RESULTS.md, 2026-12-06, "the RTX PRO 6000 on
        # PCIe Gen5").
        GPU("rtx-pro-6000", 94.97, 1.597, 483.6, 64.0, "blackwell", 188,
            "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
        # vLLM's CPU engine: no data sheet applies. Nominal figures (DDR bandwidth, AVX-512
        # bf16 rate of a few cores) only give the step-time terms their shape; use it with a
        # calibration profile from `chunktune calibrate`, which scales every term to the
        # measured steps. Memory: the KV cache is VLLM_CPU_KVCACHE_SPACE (the profile carries
        # the capacity the engine logged).
        GPU("cpu", 16.0, 0.02, 1.0, 10.0, "ampere", 2, "cpu"),
    )
}

_ALIASES = {
    "a100": "a100-sxm", "a100-80g": "a100-sxm", "a100-80g-sxm": "a100-sxm",
    "a100-sxm4-80gb": "a100-sxm", "a100-80g-pcie": "a100-pcie", "h100": "h100-sxm",
    "h100-80g": "h100-sxm", "h100-80g-sxm": "h100-sxm", "h100-sxm5": "h100-sxm",
    "h200-141g": "h200", "h200-sxm": "h200", "nvidia-h100-80gb-hbm3": "h100-sxm",
    "nvidia-a100-sxm4-80gb": "a100-sxm", "nvidia-l4": "l4", "nvidia-l40s": "l40s",
    "nvidia-a10g": "a10g", "nvidia-h200": "h200", "nvidia-a40": "a40", "a40-48g": "a40",
    "rtx-4090": "rtx4090", "nvidia-geforce-rtx-4090": "rtx4090", "geforce-rtx-4090": "rtx4090",
    "rtxpro6000": "rtx-pro-6000", "rtx-pro-6000-blackwell": "rtx-pro-6000",
    "nvidia-rtx-pro-6000-blackwell-server-edition": "rtx-pro-6000",
    "nvidia-b200": "b200", "b200-sxm": "b200", "b200-180g": "b200",
    "nvidia-b300-sxm6-ac": "b300", "nvidia-b300": "b300", "b300-sxm": "b300",
    "b300-288g": "b300", "nvidia-gb200": "gb200", "gb200-nvl72": "gb200",
}


def gpu_names() -> list[str]:
    return sorted(GPUS)


def with_peer_to_peer(gpu: GPU, peer_to_peer: bool | None,
                      field: str = "spec.engine.gpu.peerToPeer") -> GPU:
    """``gpu`` on a node whose GPUs do (True) or do not (False) reach each other peer to peer
    (:attr:`GPU.peer_to_peer`); None: not stated, ``gpu`` as it is. NVLink GPUs always do: for
    them False is refused and True changes nothing."""
    if peer_to_peer is None:
        return gpu
    if gpu.nvlink:
        if not peer_to_peer:
            raise SpecError(f"{gpu.name}'s GPUs reach each other over NVLink, always peer "
                            f"to peer: only PCIe GPUs can lack a peer-to-peer path (leave it "
                            f"out)", field=field)
        return gpu
    return replace(gpu, peer_to_peer=peer_to_peer)


def resolve_gpu(name: str, field: str = "--gpu") -> GPU:
    """The GPU for a short name (``h100-sxm``), an alias (``H100``) or a device name."""
    key = name.strip().lower().replace(" ", "-").replace("_", "-")
    key = key if key in GPUS else _ALIASES.get(key, key)
    if key not in GPUS:
        raise SpecError(f"unknown GPU {name!r}; use one of {', '.join(gpu_names())}", field=field)
    return GPUS[key]

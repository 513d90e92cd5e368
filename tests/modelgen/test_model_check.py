"""``chunktune model check``: what the simulator makes of a model, or a clean refusal."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chunktune.cli import main
from chunktune.core.models import CATALOG_HF

CONFIGS = Path(__file__).resolve().parents[3] / "shared" / "data" / "aiconfigurator-vllm" \
    / "model-configs"
needs_configs = pytest.mark.skipif(not CONFIGS.is_dir(), reason="model configs not beside "
                                   "this checkout")


@needs_configs
def test_deepseek_v3_on_eight_h200(capsys):
    cfg = CONFIGS / "deepseek-ai--DeepSeek-V3_config.json"
    assert main(["model", "check", str(cfg), "--gpu", "h200",
                 "--tensor-parallel-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "model: deepseek-ai--DeepSeek-V3: 671.0 B parameters" in out
    assert "61 layers: 61 mla" in out and "58 MoE layers, 3 dense" in out
    assert "KV cache a token a layer on one rank: mla 1,152 B" in out  # 576 bf16 elements
    assert "weights: 79.29 GiB a rank at TP 8" in out
    assert "GPU KV cache size:" in out and "Maximum concurrency for 163,840 tokens" in out
    # the step-time line is the one sim run prints (sim.cost.provenance)
    assert "step time: h200:" in out and "approximated for" not in out


@needs_configs
def test_windowed_model_prints_its_groups(capsys):
    cfg = CONFIGS / "openai--gpt-oss-120b_config.json"
    assert main(["model", "check", str(cfg), "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "18 sliding_attention, 18 full_attention" in out
    assert "mxfp4 weights" in out and "left at bfloat16: attention 100%" in out
    assert "1 x 18 sliding_attention layers" in out and "1 x 18 full_attention layers" in out


@needs_configs
def test_gemma4_on_one_h100_says_what_step_time_approximates(capsys):
    cfg = CONFIGS / "google--gemma-4-26B-A4B_config.json"
    assert main(["model", "check", str(cfg), "--gpu", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    for expected in (
        "25 sliding_attention, 5 full_attention",
        "a dense MLP 2112 wide beside the experts",
        "8 KV heads of 256, sliding window 1024; full_attention layers: 2 KV heads of 512",
        "KV cache a token a layer on one rank: sliding_attention 8,192 B; full_attention "
        "4,096 B",
        # vLLM 0.33 unify_kv_cache_spec_page_size: the full layers' half pages hold 32 tokens
        "1 x 5 full_attention layers, 8,192 blocks a max-length request (blocks of 32",
        "GPU KV cache size:",
        # the step time's one attention shape is said, not hidden
        "approximated for google--gemma-4-26B-A4B: every layer's attention and QKV/O "
        "projections timed with 8 KV heads of 256 (the 5 full_attention layers' 2 of 512",
        "vision tower (0.57 B parameters) is in the weights but never timed",
    ):
        assert expected in out


def test_a_catalog_name_and_a_model_directory(tmp_path, capsys):
    assert main(["model", "check", "llama-3.1-8b"]) == 0
    assert "8.0 B parameters" in capsys.readouterr().out
    (tmp_path / "config.json").write_text(json.dumps(CATALOG_HF["qwen3-30b-a3b"]))
    assert main(["model", "check", str(tmp_path), "--kv-cache-dtype", "fp8"]) == 0
    out = capsys.readouterr().out
    assert f"model: {tmp_path.name}:" in out and "128 routed" in out
    assert "full_attention 1,024 B" in out  # 4 KV heads x 128 x K,V x 1 byte


@needs_configs
@pytest.mark.parametrize(("name", "text"), [
    ("Qwen--Qwen3.5-397B-A17B", "linear_attention layers (qwen3_5_moe) are not modelled"),
    ("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "mamba layers (nemotron_h) are not "
     "modelled"),
])
def test_unmodelled_layers_are_refused_by_name(name, text, capsys):
    assert main(["model", "check", str(CONFIGS / f"{name}_config.json")]) == 2
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err


@pytest.mark.parametrize(("content", "text", "lines"), [
    (None, "does not exist", 1),
    ("{not json", "not valid JSON", 1),
    ("[1, 2]", "is not a model config (a JSON object", 1),
    # one line a missing field: num_hidden_layers, num_attention_heads, vocab_size
    (json.dumps({"hidden_size": 8}), "num_hidden_layers: is missing", 3),
])
def test_bad_input_is_refused_line_by_line(tmp_path, capsys, content, text, lines):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    assert main(["model", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == lines and "Traceback" not in err


def test_bad_flags_are_refused(capsys):
    assert main(["model", "check", "llama-3.1-8b", "--gpu", "nope"]) == 2
    assert "unknown GPU 'nope'" in capsys.readouterr().err
    assert main(["model", "check", "llama-3.1-8b", "--tensor-parallel-size", "0"]) == 2
    assert "--tensor-parallel-size" in capsys.readouterr().err


@needs_configs
def test_an_int4_moe_says_its_experts_borrow_the_timed_marlin_shape(tmp_path, capsys):
    """Qwen3-235B-A22B with its experts in INT4 groups of 128 (an AWQ / GPTQ-style
    compressed-tensors export; attention left bf16): the B200's table times INT4 Marlin at
    Kimi-K2's shape only, so ``model check`` says the routed experts' curve is that shape's,
    scaled, with the borrowing's error; Kimi-K2.5's own experts say nothing of the kind."""
    cfg = json.loads((CONFIGS / "Qwen--Qwen3-235B-A22B_config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
            "symmetric": True}}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["model", "check", str(path), "--gpu", "b200",
                 "--tensor-parallel-size", "4"]) == 0
    out = capsys.readouterr().out
    assert ("routed experts (int4): b200's measured curve of 7168 x 2048, 384 experts, "
            "top 8 at TP 4, scaled to this model's shape") in out
    assert "within 14% at the median" in out
    # the H100 times this shape itself (vLLM 0.14's Marlin rows): nothing borrowed
    assert main(["model", "check", str(path), "--tensor-parallel-size", "4"]) == 0
    assert "routed experts (int4)" not in capsys.readouterr().out
    kimi = CONFIGS / "moonshotai--Kimi-K2.5_config.json"
    assert main(["model", "check", str(kimi), "--gpu", "h200",
                 "--tensor-parallel-size", "8"]) == 0
    assert "routed experts (int4)" not in capsys.readouterr().out


def test_the_nodes_peer_to_peer_path_says_which_allreduce_vllm_runs(capsys):
    """A PCIe GPU's all-reduce line follows the stated path: with one, vLLM's custom kernel at
    TP 2 from the GPU's own measured table; without, NCCL through host memory; not stated,
    the engine's default named with how to state it. An NVLink GPU cannot lack one."""
    lines, steps = {}, {}
    for flag in ("--gpu-peer-to-peer", "--no-gpu-peer-to-peer", None):
        args = ["model", "check", "qwen3-32b", "--gpu", "l40s", "--tensor-parallel-size", "2"]
        assert main(args + ([flag] if flag else [])) == 0
        out = capsys.readouterr().out.splitlines()
        lines[flag] = next(line for line in out if line.startswith("step time:"))
        steps[flag] = next(line for line in out if "simulated steps:" in line)
    # the steps it prices, the all-reduces' part of each: no path, NCCL through host memory
    ar = {f: [float(x) for x in re.findall(r"all-reduce ([0-9.]+) ms", line)]
          for f, line in steps.items()}
    assert all(len(v) == 2 for v in ar.values())
    assert ar["--no-gpu-peer-to-peer"][0] > ar["--gpu-peer-to-peer"][0]
    assert ar["--no-gpu-peer-to-peer"][1] > ar["--gpu-peer-to-peer"][1]
    assert main(["model", "check", "qwen3-32b", "--gpu", "l40s"]) == 0
    one = next(line for line in capsys.readouterr().out.splitlines() if "simulated steps:" in line)
    assert "16 decodes at 4,096 tokens of context" in one and "all-reduce" not in one
    assert "peer to peer (as stated): at TP 2 its measured vLLM custom all-reduce" \
        in lines["--gpu-peer-to-peer"]
    assert "without a peer-to-peer path (as stated): NCCL through host memory" \
        in lines["--no-gpu-peer-to-peer"]
    assert "the node's path not stated: spec.engine.gpu.peerToPeer or --gpu-peer-to-peer" \
        in lines[None]
    assert main(["model", "check", "llama-3.1-8b", "--no-gpu-peer-to-peer"]) == 2
    assert "only PCIe GPUs can lack a peer-to-peer path" in capsys.readouterr().err


def test_the_release_named_sets_the_start_up(capsys):
    """gpt-oss-120b on one H100 under vLLM 0.10.2: Marlin's padded MXFP4 experts, the 0.9
    memory fraction and a larger sampler warm-up leave a quarter of the current KV cache, as
    GPUStack's 0.10.2 runs were replayed (docs/simulator.md, "Published runs")."""
    def kv_tokens(*extra: str) -> int:
        assert main(["model", "check", "gpt-oss-120b", "--max-model-len", "32768",
                     *extra]) == 0
        out = capsys.readouterr().out
        found = re.search(r"GPU KV cache size: ([\d,]+) tokens", out)
        assert found is not None, out
        assert ("on h100-sxm x1, vLLM 0.10.2," in out) == bool(extra)
        return int(found[1].replace(",", ""))

    old, new = kv_tokens("--vllm-version", "0.10.2"), kv_tokens()
    assert old == 50_127 and new == 174_454
    assert main(["model", "check", "gpt-oss-120b", "--vllm-version", "0.8.0"]) == 2
    err = capsys.readouterr().err
    assert "--vllm-version" in err and "oldest modelled" in err

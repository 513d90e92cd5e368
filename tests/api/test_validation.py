"""Manifest validation: every bad spec gives exactly the expected problems, with field paths."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest

from chunktune.api import validate
from chunktune.core.engine_args import EngineArgs
from chunktune.core.errors import SpecError
from tests.api.factories import quickstart, vllm_manifest

Edit = Callable[[dict[str, Any]], None]


#: A ``spec.workload.fromPrometheus`` that parses.
FROM_PROM = {"url": "http://prometheus.monitoring:9090", "selector": '{model_name="llama"}',
             "window": "1h"}

#: Objectives and constraints a derived workload (classes short and long) has.
_UNCLASSED: dict[str, Any] = {"objectives": [{"metric": "ttft_p99"}],
                              "constraints": ["ttft_p99 <= 2s"]}


def spec(fn: Callable[[dict[str, Any]], Any]) -> Edit:
    """An edit of the quickstart's spec."""
    return lambda m: fn(m["spec"])


def _set(d: dict[str, Any], **kw: Any) -> None:
    d.update(kw)


def _vllm(m: dict[str, Any]) -> None:
    m["spec"]["engine"] = {"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"}


BAD: list[tuple[str, Edit, list[tuple[str, str]]]] = [
    ("unknown field with suggestion",
     spec(lambda s: s["engine"].update(imgae="vllm/vllm-openai")),
     [("spec.engine.imgae", "unknown field; did you mean 'image'?")]),
    ("snake_case field name",
     spec(lambda s: s["budget"].update(max_trials=5)),
     [("spec.budget.max_trials", "unknown field; did you mean 'maxTrials'?")]),
    ("unknown field without a close name",
     spec(lambda s: s["sampler"].update(flavour=1)),
     [("spec.sampler.flavour", "unknown field; allowed: name, seed")]),
    ("low > high",
     spec(lambda s: s["searchSpace"][1].update(type="int", low=8192, high=4096, choices=None)
          or s["searchSpace"][1].pop("choices")),
     [("spec.searchSpace[1].low", "must be <= high (got 8192 > 4096)")]),
    ("log with step",
     spec(lambda s: s["searchSpace"][0].update(log=True)),
     [("spec.searchSpace[0].log", "cannot be combined with step 512: Optuna samples a log scale "
       "only with step 1 (int) or no step (float); drop step or log")]),
    ("log with low 0",
     spec(lambda s: s["searchSpace"][0].update(log=True, low=0, step=1)),
     [("spec.searchSpace[0].low", "must be > 0 on a log scale (got 0)")]),
    ("unknown flag",
     spec(lambda s: s["searchSpace"].append({"name": "max-num-batched-token", "choices": [1]})),
     [("spec.searchSpace[3].name",
       "unknown flag 'max-num-batched-token'; did you mean 'max-num-batched-tokens'?")]),
    ("chunk size is not a vLLM flag",
     spec(lambda s: s["searchSpace"].append({"name": "prefill-chunk-size", "choices": [512]})),
     [("spec.searchSpace[3].name", "unknown flag 'prefill-chunk-size'; vLLM has no prefill "
       "chunk-size flag: search max-num-batched-tokens (the step token budget) and "
       "long-prefill-token-threshold (the per-request cap); SGLang's is chunked-prefill-size")]),
    ("flag with dashes",
     spec(lambda s: s["searchSpace"][2].update(name="--max-num-seqs")),
     [("spec.searchSpace[2].name", "give the flag without its leading dashes ('max-num-seqs')")]),
    ("duplicate parameter",
     spec(lambda s: s["searchSpace"].append({"name": "max-num-seqs", "choices": [32]})),
     [("spec.searchSpace[3].name", "duplicate parameter 'max-num-seqs' (also "
       "spec.searchSpace[2])")]),
    ("searched flag also in args",
     spec(lambda s: s["engine"].update(args=["--max-model-len", "32768", "--max-num-seqs=128"])),
     [("spec.searchSpace[2].name", "max-num-seqs is searched but also fixed in "
       "spec.engine.args[2] ('--max-num-seqs=128'); remove one of them")]),
    ("default search space flag in args",
     spec(lambda s: s.pop("searchSpace") and s["engine"].update(args=["--max-num-seqs", "64"])),
     [("spec.engine.args[0]", "--max-num-seqs is fixed here but the default search space "
       "searches it; remove it or give spec.searchSpace")]),
    ("choices and range both",
     spec(lambda s: s["searchSpace"][1].update(type="int", low=0, high=10)),
     [("spec.searchSpace[1]", "give either choices or type with low and high, not both "
       "(remove high, low, type)")]),
    ("neither choices nor range",
     spec(lambda s: s["searchSpace"].__setitem__(1, {"name": "long-prefill-token-threshold"})),
     [("spec.searchSpace[1]", "needs either type (int or float) with low and high, or "
       "choices")]),
    ("duplicate choice",
     spec(lambda s: s["searchSpace"][2].update(choices=[64, 128, 64])),
     [("spec.searchSpace[2].choices[2]", "must be distinct (64 is also choices[0])")]),
    ("float type for an integer flag",
     spec(lambda s: s["searchSpace"][0].update(type="float")),
     [("spec.searchSpace[0].type", "must be int for --max-num-batched-tokens (the engine takes "
       "an integer)")]),
    ("fraction out of range",
     spec(lambda s: s["searchSpace"].append({"name": "gpu-memory-utilization", "type": "float",
                                             "low": 0.8, "high": 1.2})),
     [("spec.searchSpace[3].high", "is not a valid --gpu-memory-utilization value (must be > 0 "
       "and <= 1; got 1.2)")]),
    ("unreachable high",
     spec(lambda s: s["searchSpace"][0].update(high=16000)),
     [("spec.searchSpace[0].high", "is not reachable from low 512 in steps of 512; use high "
       "15872")]),
    ("max-model-len above the model's limit",
     spec(lambda s: s["searchSpace"].append({"name": "max-model-len",
                                             "choices": [32768, 262144]})),
     [("spec.searchSpace[3].choices[1]", "exceeds the model's max_position_embeddings (131072);"
       " the engine refuses to start (got 262144)")]),
    ("sglang flag on vllm",
     spec(lambda s: s["searchSpace"].append({"name": "chunked-prefill-size",
                                             "choices": [2048]})),
     [("spec.searchSpace[3].name", "chunked-prefill-size is an SGLang flag (engine kind "
       "sglang); vLLM has no prefill chunk size: search max-num-batched-tokens (the step token "
       "budget) and long-prefill-token-threshold (the per-request cap)")]),
    ("unknown class in objective",
     spec(lambda s: s["objectives"][0].update({"class": "long"})),
     [("spec.objectives[0].class", "unknown class 'long'; the workload's classes are "
       "long-context, chat; did you mean 'long-context'?")]),
    ("unknown class in constraint",
     spec(lambda s: s["constraints"].__setitem__(0, "chatbot.itl_p99 <= 60ms")),
     [("spec.constraints[0].class", "unknown class 'chatbot'; the workload's classes are "
       "long-context, chat; did you mean 'chat'?")]),
    ("engine ITL without a step log",
     lambda m: (m["spec"].update(engine={"kind": "sglang", "image": "lmsysorg/sglang:v0.5.0",
                                         "model": "meta-llama/Llama-3.1-8B-Instruct"},
                                 searchSpace=[{"name": "chunked-prefill-size",
                                               "choices": [2048, 4096]}]),
                m["spec"]["objectives"].append({"metric": "engine_itl_p99"})),
     [("spec.objectives[1].metric", "engine_itl_p99 comes from vLLM's step log "
       "(--enable-logging-iteration-details), which engine kind sglang does not write; use "
       "itl_p99")]),
    ("class on an engine-wide metric",
     spec(lambda s: s["constraints"].append("chat.kv_cache_usage_peak <= 95%")),
     [("spec.constraints[2].class", "kv_cache_usage_peak is engine-wide; it has no per-class "
       "value")]),
    ("unknown metric",
     spec(lambda s: s["objectives"][0].update(metric="ttft_p999")),
     [("spec.objectives[0].metric", "unknown metric 'ttft_p999'; did you mean 'ttft_p99'?")]),
    ("duplicate objective",
     spec(lambda s: s["objectives"].append({"metric": "ttft_p99", "class": "long-context"})),
     [("spec.objectives[1]", "duplicate objective long-context.ttft_p99 (also "
       "spec.objectives[0])")]),
    ("bad duration",
     spec(lambda s: s["workload"].update(duration="2 minutes")),
     [("spec.workload.duration", "must be a duration such as '90s', '10m', '1h30m' or "
       "'250ms': numbers with a unit h, m, s or ms, no spaces (got '2 minutes')")]),
    ("fractional duration needs the string form",
     spec(lambda s: s["workload"].update(warmup=1.5)),
     [("spec.workload.warmup", "must be a duration such as 60, '90s' or '10m' (got 1.5)")]),
    ("warmup longer than duration",
     spec(lambda s: s["workload"].update(warmup="3m")),
     [("spec.workload.warmup", "must be shorter than the duration (180s >= 120s)")]),
    ("cmaes with several objectives and constraints",
     spec(lambda s: s.update(sampler={"name": "cmaes"}, objectives=[
         {"metric": "ttft_p99", "class": "long-context"},
         {"metric": "throughput_tokens_per_s"}])),
     [("spec.sampler.name", "cmaes optimizes a single objective (got 2); use tpe, gp or nsga2 "
       "for several"),
      ("spec.sampler.name", "cmaes ignores constraints (Optuna warns and optimizes without "
       "them); use tpe, gp or nsga2, which model them")]),
    ("a switch with choices",
     spec(lambda s: s["searchSpace"].append({"name": "async-scheduling", "choices": [1]})),
     [("spec.searchSpace[3]", "async-scheduling is a switch: give its name alone and both "
       "--async-scheduling and --no-async-scheduling are searched (remove choices)")]),
    ("a switch with a range",
     spec(lambda s: s["searchSpace"].append({"name": "scheduler-reserve-full-isl",
                                             "type": "int", "low": 0, "high": 1})),
     [("spec.searchSpace[3]", "scheduler-reserve-full-isl is a switch: give its name alone "
       "and both --scheduler-reserve-full-isl and --no-scheduler-reserve-full-isl are "
       "searched (remove high, low, type)")]),
    ("a switch on a log scale",  # log: false (a manifest with its defaults filled) is fine
     spec(lambda s: s["searchSpace"].extend([{"name": "async-scheduling", "log": True},
                                             {"name": "scheduler-reserve-full-isl",
                                              "log": False}])),
     [("spec.searchSpace[3]", "async-scheduling is a switch: give its name alone and both "
       "--async-scheduling and --no-async-scheduling are searched (remove log)")]),
    ("a switch newer than the named release",
     spec(lambda s: s["engine"].update(vllmVersion="0.18.0")
          or s["searchSpace"].append({"name": "scheduler-reserve-full-isl"})),
     [("spec.searchSpace[3].name", "vLLM 0.18 has no --scheduler-reserve-full-isl (since "
       "0.19); drop it or name vLLM 0.19 or later")]),
    ("a searched flag newer than the named release",
     spec(lambda s: s["engine"].update(vllmVersion="0.23.0")
          or s["searchSpace"].append({"name": "prefill-schedule-interval",
                                      "choices": [1, 4]})),
     [("spec.searchSpace[3].name", "vLLM 0.23 has no --prefill-schedule-interval (since "
       "0.24); drop it or name vLLM 0.24 or later")]),
    ("vLLM 0.19's gate over a sliding-window model, simulated",
     spec(lambda s: s["engine"].update(model="gpt-oss-120b", vllmVersion="0.19.1")),
     [("spec.engine.vllmVersion", "vLLM 0.19's whole-sequence admission gate budgets "
       "gpt-oss-120b's sliding-window layers for every token of a prompt, not their window "
       "(vLLM issue #39734, fixed in 0.20): long prompts wait, and one longer than about the "
       "KV cache divided by its groups is never admitted. The simulator does not model that "
       "gate; name vLLM 0.20 or later, or pass --no-scheduler-reserve-full-isl")]),
    ("vLLM 0.19's gate searched over a sliding-window model, simulated",
     spec(lambda s: s["engine"].update(model="gpt-oss-120b", vllmVersion="0.19.1")
          or s["searchSpace"].append({"name": "scheduler-reserve-full-isl"})),
     [("spec.searchSpace[3].name", "vLLM 0.19's whole-sequence admission gate budgets "
       "gpt-oss-120b's sliding-window layers for every token of a prompt, not their window "
       "(vLLM issue #39734, fixed in 0.20): long prompts wait, and one longer than about the "
       "KV cache divided by its groups is never admitted. The simulator does not model that "
       "gate; name vLLM 0.20 or later, or stop searching scheduler-reserve-full-isl and pass "
       "--no-scheduler-reserve-full-isl")]),
    ("cmaes on choices and switches only",
     spec(lambda s: s.update(sampler={"name": "cmaes"}, constraints=[],
                             searchSpace=[{"name": "max-num-seqs", "choices": [64, 128]},
                                          {"name": "async-scheduling"}])),
     [("spec.sampler.name", "cmaes searches int and float ranges, but every parameter here is a "
       "list of choices, which it samples at random; use tpe")]),
    ("cmaes on choices only",
     spec(lambda s: s.update(sampler={"name": "cmaes"}, constraints=[],
                             searchSpace=[{"name": "max-num-seqs", "choices": [64, 128]}])),
     [("spec.sampler.name", "cmaes searches int and float ranges, but every parameter here is a "
       "list of choices, which it samples at random; use tpe")]),
    ("grid on a continuous range",
     spec(lambda s: s.update(sampler={"name": "grid"}) or s["searchSpace"].append(
         {"name": "gpu-memory-utilization", "type": "float", "low": 0.85, "high": 0.95})),
     [("spec.sampler.name", "grid needs finitely many values, but spec.searchSpace[3] "
       "(gpu-memory-utilization) is a float range without step; add step or use choices")]),
    ("pruner with several objectives",
     spec(lambda s: s.update(pruner={"name": "median"}, objectives=[
         {"metric": "ttft_p99"}, {"metric": "itl_p99"}])),
     [("spec.pruner.name", "Optuna cannot prune a study with several objectives (got 2); set it "
       "to none")]),
    ("unknown sampler",
     spec(lambda s: s["sampler"].update(name="tpee")),
     [("spec.sampler.name", "must be one of tpe, gp, nsga2, random, grid, cmaes (got 'tpee'); "
       "did you mean 'tpe'?")]),
    ("parallelism > maxTrials",
     spec(lambda s: s["budget"].update(parallelism=24)),
     [("spec.budget.parallelism", "must be <= maxTrials (got 24 > 20)")]),
    ("trial timeout shorter than the workload",
     lambda m: (_vllm(m), m["spec"]["engine"].update(image="vllm/vllm-openai:v0.11.0"),
                m["spec"]["budget"].update(trialTimeout="1m")),
     [("spec.budget.trialTimeout", "must be longer than the workload's duration (120s), or "
       "every trial times out (got 60s)")]),
    ("profile and inline",
     spec(lambda s: s["workload"].update(inline={"classes": []})),
     [("spec.workload", "give one of profile, inline, trace or fromPrometheus, not profile "
       "and inline")]),
    ("profile and trace",
     spec(lambda s: s["workload"].update(trace={"file": "t.csv"})),
     [("spec.workload", "give one of profile, inline, trace or fromPrometheus, not profile "
       "and trace")]),
    ("trace with a rate",
     spec(lambda s: s["workload"].update(profile=None, trace={"file": "t.csv"}, rate=3)),
     [("spec.workload.rate", "a trace replays its own arrival times: set trace.speedup or "
       "trace.rateScale")]),
    ("neither profile nor inline",
     spec(lambda s: s["workload"].pop("profile")),
     [("spec.workload", "needs profile (a shipped profile name or a file path), inline (a "
       "profile mapping), trace (a request trace) or fromPrometheus (derived from the "
       "deployment's metrics)")]),
    ("profile and fromPrometheus",
     spec(lambda s: s["workload"].update(fromPrometheus=FROM_PROM)),
     [("spec.workload", "give one of profile, inline, trace or fromPrometheus, not profile "
       "and fromPrometheus")]),
    ("a selector that is not PromQL",
     spec(lambda s: (s["workload"].pop("profile"), s["workload"].update(
         fromPrometheus={**FROM_PROM, "selector": "{model_name=llama}"}))),
     [("spec.workload.fromPrometheus.selector", 'must be PromQL label matchers such as '
       '{model_name="llama"} (label="value", label!="value", label=~"regex", label!~"regex", '
       "separated by commas) (got '{model_name=llama}')")]),
    ("an objective on a class a derived workload lacks",
     spec(lambda s: (s["workload"].pop("profile"), s["workload"].update(
         fromPrometheus=FROM_PROM), s.update(objectives=[{"metric": "ttft_p99",
                                                          "class": "chat"}]))),
     [("spec.objectives[0].class", "unknown class 'chat'; the workload's classes are short, "
       "long"),
      ("spec.constraints[0].class", "unknown class 'chat'; the workload's classes are short, "
       "long")]),
    ("retune without fromPrometheus",
     spec(lambda s: s.update(retune={"interval": "5m"})),
     [("spec.retune", "needs spec.workload.fromPrometheus: the operator watches the "
       "deployment's workload in the Prometheus it names")]),
    ("retune that can never start: no drift limit, slo off",
     spec(lambda s: (s["workload"].pop("profile"), s["workload"].update(
         fromPrometheus=FROM_PROM), s.update(retune={"drift": {}, "slo": False}, **_UNCLASSED))),
     [("spec.retune.drift", "sets no limit and slo is false, so a re-tune can never start; "
       "set a drift limit (e.g. rate: 0.3) or let slo watch a latency bound")]),
    ("retune that can never start: no drift limit, slo without a bound it can read",
     spec(lambda s: (s["workload"].pop("profile"), s["workload"].update(
         fromPrometheus=FROM_PROM), s.update(retune={"drift": {}}, **{
             **_UNCLASSED, "constraints": ["error_rate <= 1%"]}))),
     [("spec.retune.drift", "sets no limit and no constraint is an upper bound on the TTFT, "
       "ITL or end-to-end latency of all requests (e.g. 'ttft_p99 <= 2s'), so a re-tune can "
       "never start; set a drift limit (e.g. rate: 0.3) or let slo watch a latency bound")]),
    ("retune interval longer than the window it reads",
     spec(lambda s: (s["workload"].pop("profile"), s["workload"].update(
         fromPrometheus=FROM_PROM), s.update(retune={"interval": "2h"}, **_UNCLASSED))),
     [("spec.retune.interval", "(7200s) is longer than the window each check reads (3600s), "
       "so traffic between windows is never seen; shorten it or lengthen "
       "spec.retune.window")]),
    ("unknown profile",
     spec(lambda s: s["workload"].update(profile="mixd")),
     [("spec.workload.profile", "no profile file 'mixd'; give a path or one of: chat, "
       "long-context, mixed, rag, smoke")]),
    ("bad inline profile, errors re-prefixed",
     spec(lambda s: s["workload"].pop("profile") and s["workload"].update(inline={
         "arrival": {"mode": "poisson", "rate": 2},
         "classes": [{"name": "chat", "prompt_tokens": {"dist": "uniform", "min": 9},
                      "output_tokens": 64}]})),
     [("spec.workload.inline.classes[0].prompt_tokens.max", "is required for dist uniform")]),
    ("rate and concurrency",
     spec(lambda s: s["workload"].update(rate=4, concurrency=8)),
     [("spec.workload.concurrency", "cannot be combined with rate; give one of them")]),
    ("bad constraint string",
     spec(lambda s: s["constraints"].append("chat.itl_p99 < 50ms")),
     [("spec.constraints[2]", "use <= or >= (got '<' in 'chat.itl_p99 < 50ms')")]),
    ("unparseable constraint string",
     spec(lambda s: s["constraints"].append("itl under 50ms")),
     [("spec.constraints[2]", "must look like '[CLASS.]METRIC <= VALUE' or '... >= VALUE', e.g. "
       "'chat.itl_p99 <= 50ms' or 'error_rate <= 1%' (got 'itl under 50ms')")]),
    ("wrong unit in a constraint",
     spec(lambda s: s["constraints"].append({"metric": "ttft_p99", "max": "5%"})),
     [("spec.constraints[2].max", "ttft_p99 is a latency: give seconds or a duration such as "
       "'50ms' or '4s' (got '5%')")]),
    ("constraint with max and min",
     spec(lambda s: s["constraints"].append({"metric": "ttft_p99", "max": 4, "min": 1})),
     [("spec.constraints[2]", "give exactly one of max or min (got both)")]),
    ("goodput without a latency bound",
     spec(lambda s: s.update(objectives=[{"metric": "goodput"}],
                             constraints=["error_rate <= 1%"])),
     [("spec.objectives[0].metric", "goodput counts requests that meet every latency bound of "
       "their class, but spec.constraints sets none; add one (e.g. 'chat.ttft_p99 <= 2s') or "
       "use request_rate")]),
    ("unknown model for sim",
     spec(lambda s: s["engine"].update(model="llama-3.1-9b")),
     [("spec.engine.model", "unknown model 'llama-3.1-9b' for engine kind sim; did you mean "
       "'llama-3.1-8b'? (or give its config.json as spec.engine.modelConfig)")]),
    ("unknown gpu",
     spec(lambda s: s["engine"]["gpu"].update(type="h100-sxm6")),
     [("spec.engine.gpu.type", "unknown GPU 'h100-sxm6'; did you mean 'h100-sxm'?")]),
    ("sim without a gpu",
     spec(lambda s: s["engine"].pop("gpu")),
     [("spec.engine.gpu.type", "is required for engine kind sim: the simulated GPU, one of "
       "a100-40g, a100-pcie, a100-sxm, a10g, a40, b200, b300, cpu, gb200, h100-pcie, h100-sxm, "
       "h200, l4, l40s, rtx-pro-6000, rtx4090")]),
    ("missing image for vllm", _vllm,
     [("spec.engine.image", "is required for engine kind vllm (the server image, e.g. "
       "vllm/vllm-openai:v0.11.0)")]),
    ("modelConfig on vllm",
     lambda m: (_vllm(m), m["spec"]["engine"].update(image="i", modelConfig={"a": 1})),
     [("spec.engine.modelConfig", "is only used by engine kind sim (a real engine reads the "
       "model's own config.json)")]),
    ("bad inline model config",
     spec(lambda s: s["engine"].update(model="tiny", modelConfig={"hidden_size": 64})),
     [("spec.engine.modelConfig.num_hidden_layers", "is missing from the model config"),
      ("spec.engine.modelConfig.num_attention_heads", "is missing from the model config"),
      ("spec.engine.modelConfig.vocab_size", "is missing from the model config")]),
    ("tensor parallel size that does not divide the heads",
     spec(lambda s: s["engine"].update(tensorParallelSize=3)),
     [("spec.engine.tensorParallelSize", "must divide the model's 32 attention heads (got 3)")]),
    ("fewer gpus than ranks",
     spec(lambda s: s["engine"].update(tensorParallelSize=2, gpu={"type": "h100", "count": 1})),
     [("spec.engine.gpu.count", "must be >= tensorParallelSize (got 1 < 2)")]),
    ("no peer-to-peer path on NVLink GPUs",
     spec(lambda s: s["engine"].update(gpu={"type": "h100-sxm", "peerToPeer": False})),
     [("spec.engine.gpu.peerToPeer", "h100-sxm's GPUs reach each other over NVLink, always "
       "peer to peer: only PCIe GPUs can lack a peer-to-peer path (leave it out)")]),
    ("managed flag in args",
     spec(lambda s: s["engine"].update(args=["--port", "9000"])),
     [("spec.engine.args[0]", "--port is set by spec.engine.port; remove it from args")]),
    ("a flag the simulator does not model",
     spec(lambda s: s["engine"].update(args=["--kv-cache-dtype", "fp8", "--swap-space", "4"])),
     [("spec.engine.args[2]", "the simulator does not model --swap-space; it takes "
       + ", ".join(sorted("--" + f.name.replace("_", "-") for f in fields(EngineArgs))))]),
    ("partial prefills", lambda m: (_vllm(m), m["spec"]["engine"].update(
        image="i", args=["--max-num-partial-prefills", "2"])),
     [("spec.engine.args[0]", "--max-num-partial-prefills other than 1 makes vLLM's V1 engine "
       "refuse to start (Concurrent Partial Prefill is not supported)")]),
    ("unquoted number in args",
     spec(lambda s: s["engine"].update(args=["--max-model-len", 32768])),
     [("spec.engine.args[1]", "must be a string (got 32768; quote it)")]),
    ("string for an integer",
     spec(lambda s: s["budget"].update(maxTrials="20")),
     [("spec.budget.maxTrials", "must be an integer (got '20')")]),
    ("env value and valueFrom",
     spec(lambda s: s["engine"].update(env=[{"name": "HF_TOKEN", "value": "x", "valueFrom": {
         "secretKeyRef": {"name": "hf", "key": "token"}}}])),
     [("spec.engine.env[0]", "give exactly one of value or valueFrom")]),
    ("bad object name",
     lambda m: m["metadata"].update(name="Quick_Start"),
     [("metadata.name", "must be a valid Kubernetes name: lower-case letters, digits, '-' and "
       "'.', starting and ending with a letter or digit (got 'Quick_Start')")]),
    ("wrong kind",
     lambda m: m.update(kind="Experiment"),
     [("kind", "must be ChunkedPrefillTuning (got 'Experiment')")]),
    ("unknown storage scheme",
     spec(lambda s: s.update(storage="redis://db:6379")),
     [("spec.storage", "unknown storage scheme 'redis': give an RDB URL (sqlite:///study.db, "
       "postgresql://host/db, mysql://host/db) or a journal file path")]),
]

@pytest.mark.parametrize(("edit", "expected"), [pytest.param(e, x, id=i) for i, e, x in BAD])
def test_bad_spec(edit: Edit, expected: list[tuple[str, str]]) -> None:
    m = quickstart()
    edit(m)
    assert validate(m) == expected


def test_examples_are_valid() -> None:
    assert validate(quickstart()) == []
    assert validate(vllm_manifest()) == []


def test_all_problems_at_once() -> None:
    m = quickstart()
    s = m["spec"]
    s["engine"]["imgae"] = "x"
    s["searchSpace"][0].update(low=8192, high=4096)
    s["objectives"][0]["class"] = "nope"
    s["budget"]["parallelism"] = 50
    s["sampler"]["name"] = "grid"
    s["constraints"].append("itl_p99 ~ 5")
    m["metadata"]["name"] = "X"
    paths = [p for p, _ in validate(m)]
    assert paths == ["metadata.name", "spec.engine.imgae", "spec.searchSpace[0].low",
                     "spec.objectives[0].class", "spec.constraints[2]",
                     "spec.budget.parallelism"]


def test_semantic_checks_run_on_the_parts_that_parsed() -> None:
    m = quickstart()
    m["spec"]["engine"] = ["not", "a", "mapping"]          # engine fails to parse
    m["spec"]["searchSpace"][0].update(low=8192, high=4096)  # still checked
    m["spec"]["searchSpace"][2]["choices"] = "many"          # this item is skipped
    assert validate(m) == [
        ("spec.engine", "must be a mapping of fields (got a list)"),
        ("spec.searchSpace[0].low", "must be <= high (got 8192 > 4096)"),
        ("spec.searchSpace[2].choices", "must be a list (got 'many')"),
    ]


def test_not_a_mapping() -> None:
    assert validate([1, 2]) == [("", "must be a mapping: a ChunkedPrefillTuning manifest "
                                     "(got list)")]


def test_spec_error_lists_every_problem() -> None:
    from chunktune.api import parse_manifest

    m = quickstart()
    m["spec"]["budget"]["parallelism"] = 50
    m["spec"]["sampler"]["name"] = "tpee"
    with pytest.raises(SpecError) as info:
        parse_manifest(m)
    assert [p for p, _ in info.value.problems] == ["spec.budget.parallelism", "spec.sampler.name"]

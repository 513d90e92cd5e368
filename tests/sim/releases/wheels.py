"""The pure-Python files of one vLLM release, for the per-release scheduler suite.

``vllm_extract("0.34.0")`` downloads the release's wheel from the package index (``pip
download vllm==0.34.0 --no-deps``; about 330 MB) into a cache directory and extracts its
``.py`` files (no compiled extension, no third-party copies but that package's own
``__init__.py``, which releases before 0.19 look into for ``triton_kernels``) beside it,
once: later calls return the extract. Nothing is installed: the extract is only ever put
on ``sys.path`` of the subprocess that drives that release's scheduler
(``vllm_scheduler.py``), apart from the installed CPU build.

The cache directory is ``$CHUNKTUNE_VLLM_RELEASES`` or ``~/.cache/chunktune/vllm-releases``;
pip's own settings (an index mirror, ``PIP_FIND_LINKS`` to a folder of wheels) apply.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

#: a file the extract holds once complete
_DONE = ".extracted"


def cache_dir() -> Path:
    given = os.environ.get("CHUNKTUNE_VLLM_RELEASES")
    return Path(given) if given else Path.home() / ".cache" / "chunktune" / "vllm-releases"


def vllm_extract(version: str, timeout: float = 900) -> Path:
    """The directory holding release ``version``'s ``vllm/`` package (pure Python), made if
    missing. Raises ``RuntimeError`` with pip's last lines if the wheel cannot be had."""
    root = cache_dir()
    out = root / f"vllm-{version}"
    if (out / _DONE).is_file():
        return out
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = _wheel(wheels, version)
    if wheel is None:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
             "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", str(wheels)],
            capture_output=True, text=True, timeout=timeout, check=False)
        wheel = _wheel(wheels, version)
        if proc.returncode != 0 or wheel is None:
            raise RuntimeError(f"pip download vllm=={version} failed:\n"
                               f"{(proc.stdout + proc.stderr)[-2000:]}")
    partial = root / f".vllm-{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("vllm/") and name.endswith(".py") \
                    and (not name.startswith("vllm/third_party/")
                         or name == "vllm/third_party/__init__.py"):
                z.extract(name, partial)
    (partial / _DONE).write_text(wheel.name + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def _wheel(folder: Path, version: str) -> Path | None:
    found = sorted(folder.glob(f"vllm-{version}-*.whl"))
    return found[0] if found else None

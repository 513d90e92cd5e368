"""What the image installs: the wheel that the Dockerfile's build stage makes, built here the
same way (``pip wheel --no-deps .`` from the files the build stage copies, as .dockerignore
lets them through), then installed on its own and run outside the checkout."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

from tests.charts import CHART_DIR, REPO
from tests.charts.dockerfile import DockerIgnore, stages

PACKAGE_DATA = ["chunktune/py.typed", "chunktune/sim/cost/data/step_time_coefficients.json",
                "chunktune/sim/cost/data/vidur_linear_ms.csv"]

pytestmark = pytest.mark.slow  # builds and installs the wheel


def _setuptools_ok() -> bool:
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return major >= 77  # pyproject's build-system requirement (PEP 639 license string)


def _build_context(dest: Path) -> None:
    """The build stage's COPY sources, filtered by .dockerignore, symlinks kept as links."""
    ignore = DockerIgnore.parse((REPO / ".dockerignore").read_text())
    (build,) = [s for s in stages((REPO / "Dockerfile").read_text())[1] if s.name == "build"]
    sources = [w.rstrip("/") for ins in build.all("COPY")
               for w in [w for w in ins.words() if not w.startswith("--")][:-1]]
    for rel in ignore.context(REPO):
        if any(rel == s or rel.startswith(s + "/") for s in sources):
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            src = REPO / rel
            if src.is_symlink():
                target.symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, target)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _setuptools_ok():
        pytest.skip("needs setuptools>=77 in this environment (the build runs offline, "
                    "without build isolation)")
    root = tmp_path_factory.mktemp("image")
    context, out = root / "src", root / "wheels"
    _build_context(context)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", ".", "-w", str(out)],
                   cwd=context, check=True, capture_output=True, timeout=120)
    (built,) = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--no-compile", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=120)
    return target


def _run(installed: Path, *argv: str, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``chunktune ARGV`` through the wheel's console script, the installed package only."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CHUNKTUNE_", "PYTHON"))}
    base["PYTHONPATH"] = str(installed)
    script = installed / "bin" / "chunktune"
    return subprocess.run([sys.executable, str(script), *argv], env={**base, **(env or {})},
                          cwd=cwd or installed.parent, capture_output=True, text=True,
                          timeout=120, check=False)


def _metadata(wheel: Path, names: list[str], name: str) -> str:
    (path,) = [n for n in names if n.endswith(f".dist-info/{name}")]
    with zipfile.ZipFile(wheel) as z:
        return z.read(path).decode()


def test_one_pure_python_wheel(wheel: Path) -> None:
    from chunktune import __version__

    assert wheel.name == f"chunktune-{__version__}-py3-none-any.whl"


def test_console_script(wheel: Path, names: list[str]) -> None:
    entry_points = _metadata(wheel, names, "entry_points.txt")
    assert "[console_scripts]" in entry_points
    assert "chunktune = chunktune.cli:main" in entry_points


def test_package_data(names: list[str]) -> None:
    for path in PACKAGE_DATA:
        assert path in names, f"{path} is not in the wheel"
    profiles = sorted(n.removeprefix("chunktune/profiles/") for n in names
                      if n.startswith("chunktune/profiles/"))
    assert profiles == sorted(p.name for p in (REPO / "loadtest" / "profiles").glob("*.yaml"))


def test_only_the_package(names: list[str]) -> None:
    tops = {n.split("/")[0] for n in names}
    assert tops == {"chunktune", next(t for t in tops if t.endswith(".dist-info"))}
    assert not [n for n in names if n.endswith((".pyc", ".journal")) or "__pycache__" in n]
    assert "operator/__init__.py" not in names


def test_runtime_dependencies_only(wheel: Path, names: list[str]) -> None:
    meta = Parser().parsestr(_metadata(wheel, names, "METADATA"))
    assert meta["Requires-Python"] == ">=3.11"
    unconditional = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    dev_only = ("pytest", "hypothesis", "ruff", "kmock", "helm-python-sdk",
                "kubernetes-validate", "vllm")
    assert not [r for r in unconditional if r.split(">")[0].split("=")[0].strip() in dev_only]
    for needed in ("kopf", "kubernetes", "optuna", "locust"):
        assert any(r.startswith(needed) for r in unconditional), needed


def test_installed_package_prints_the_chart_crd(installed: Path) -> None:
    done = _run(installed, "crd")
    assert done.returncode == 0, done.stderr
    crd = CHART_DIR / "crds" / "chunkedprefilltunings.chunktune.dev.yaml"
    assert done.stdout == crd.read_text()


@pytest.fixture(scope="module")
def image_profiles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """loadtest/ laid out as the Dockerfile copies it (/opt/chunktune/loadtest)."""
    opt = tmp_path_factory.mktemp("opt") / "chunktune" / "loadtest"
    shutil.copytree(REPO / "loadtest", opt)
    yield opt


@pytest.mark.parametrize("with_env", [False, True], ids=["packaged", "CHUNKTUNE_PROFILES"])
def test_installed_package_runs_the_simulator(installed: Path, image_profiles: Path,
                                              with_env: bool, tmp_path: Path) -> None:
    """The calibration data and the workload profiles load from the installed package (or from
    the image's profile folder when CHUNKTUNE_PROFILES names it)."""
    env = {"CHUNKTUNE_PROFILES": str(image_profiles / "profiles")} if with_env else {}
    out = tmp_path / "run.json"
    done = _run(installed, "sim", "run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                "--workload", "smoke", "--duration", "10", "--json", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0
    probe = _run(installed, "--version")
    assert probe.returncode == 0 and "chunktune" in probe.stdout
    where = subprocess.run(
        [sys.executable, "-c", "import chunktune.core.workload as w; print(w.__file__); "
                               "print(w.PROFILE_DIR)"],
        env={"PYTHONPATH": str(installed), **env, "PATH": os.environ.get("PATH", "")},
        cwd=installed.parent, capture_output=True, text=True, check=True, timeout=60)
    module, profile_dir = where.stdout.split()
    assert Path(module).is_relative_to(installed)
    expected = image_profiles / "profiles" if with_env else installed / "chunktune" / "profiles"
    assert Path(profile_dir).resolve() == expected.resolve()

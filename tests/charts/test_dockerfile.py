"""The Dockerfile, checked statically (there is no Docker engine to build it here): pinned slim
Python 3.11 base, non-root numeric USER, the chunktune entrypoint, the workload profiles and
locustfile at the paths the environment names, no secrets, and a .dockerignore that lets in
exactly the build's inputs."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from tests.charts import REPO
from tests.charts.dockerfile import DockerIgnore, Stage, stages

TEXT = (REPO / "Dockerfile").read_text()
ARGS, STAGES = stages(TEXT)
FINAL: Stage = STAGES[-1]
IGNORE = DockerIgnore.parse((REPO / ".dockerignore").read_text())


def test_base_image_is_a_pinned_slim_python_311() -> None:
    for stage in STAGES:
        image, _, tag = stage.base.partition(":")
        assert image == "python", stage.base
        assert re.fullmatch(r"3\.11(\.\d+)?-slim(-\w+)?(@sha256:[0-9a-f]{64})?", tag), stage.base
        assert "latest" not in stage.base


def test_runs_as_a_numeric_non_root_user() -> None:
    users = FINAL.all("USER")
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].args.partition(":")
    assert uid.isdigit() and int(uid) >= 1000, "USER must be a numeric uid (runAsNonRoot)"
    assert gid.isdigit() and int(gid) >= 1000


def test_entrypoint_and_default_command() -> None:
    (entrypoint,) = FINAL.all("ENTRYPOINT")
    (cmd,) = FINAL.all("CMD")
    assert json.loads(entrypoint.args) == ["chunktune"]  # exec form: signals reach kopf
    assert json.loads(cmd.args) == ["operator", "run", "--all-namespaces"]


def test_ports() -> None:
    exposed = {p for ins in FINAL.all("EXPOSE") for p in ins.words()}
    assert exposed == {"8000", "8080"}


def test_installs_this_project_without_a_cache() -> None:
    (build,) = [s for s in STAGES if s.name == "build"]
    wheel = " ".join(i.args for i in build.all("RUN"))
    assert "pip wheel --no-cache-dir --no-deps ." in wheel
    install = " ".join(i.args for i in FINAL.all("RUN"))
    assert re.search(r"pip install --no-cache-dir /wheels/\*\.whl", install)
    assert "[dev]" not in TEXT and ".[" not in TEXT, "runtime dependencies only"


def test_loadtest_folder_and_its_environment() -> None:
    copies = [i.words() for i in FINAL.all("COPY")]
    assert any(w[-2:] == ["loadtest/", "/opt/chunktune/loadtest/"] for w in copies), copies
    env = FINAL.env()
    assert env["CHUNKTUNE_PROFILES"] == "/opt/chunktune/loadtest/profiles"
    assert env["CHUNKTUNE_LOCUSTFILE"] == "/opt/chunktune/loadtest/locustfile.py"
    # ...and those exist in the copied folder
    for var in ("CHUNKTUNE_PROFILES", "CHUNKTUNE_LOCUSTFILE"):
        local = REPO / env[var].removeprefix("/opt/chunktune/")
        assert local.exists(), f"{var}: {local} is missing"
    assert list((REPO / "loadtest" / "profiles").glob("*.yaml"))


def test_oci_labels() -> None:
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[\w.]+)="([^"]*)"',
                             " ".join(i.args for i in FINAL.all("LABEL"))))
    assert {"org.opencontainers.image.title", "org.opencontainers.image.description",
            "org.opencontainers.image.version",
            "org.opencontainers.image.licenses"} <= labels.keys()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    from chunktune import __version__

    version_arg = next(i.args for i in FINAL.all("ARG") if i.args.startswith("VERSION="))
    assert version_arg == f"VERSION={__version__}"


def test_no_secrets_in_the_image() -> None:
    for stage in STAGES:
        assert not stage.all("ADD"), "use COPY; ADD fetches URLs and unpacks archives"
        for ins in stage.all("ENV") + stage.all("ARG"):
            assert not re.search(r"(?i)token|secret|passw|api_?key|credential", ins.args), ins
        for ins in stage.all("COPY"):
            assert not re.search(r"\.env|\.ssh|\.aws|\.kube|\.netrc|\.pem|id_rsa", ins.args)
    assert not re.search(r"(?i)hf_[a-z0-9]{20,}|ghp_[a-z0-9]{20,}", TEXT)


@pytest.mark.parametrize("path", [
    "pyproject.toml", "README.md", "operator/chunktune/cli.py",
    "operator/chunktune/sim/cost/data/step_time_coefficients.json",
    "operator/chunktune/sim/cost/data/vidur_linear_ms.csv",
    "loadtest/locustfile.py", "loadtest/profiles/mixed.yaml"])
def test_dockerignore_lets_the_inputs_in(path: str) -> None:
    assert not IGNORE.ignored(path)


@pytest.mark.parametrize("path", [
    ".git/config", ".venv/bin/python", "venv/bin/python", "tests/charts/test_render.py",
    "charts/chunktune/Chart.yaml", "docs/simulator.md", "bench/x.py", "examples/quickstart.yaml",
    ".env", "operator/.env", "operator/chunktune/__pycache__/cli.cpython-311.pyc",
    "operator/chunktune.egg-info/PKG-INFO", "operator/x.journal", "loadtest/key.pem",
    "Dockerfile", ".dockerignore", "out/run.json", "results/a.json"])
def test_dockerignore_keeps_the_rest_out(path: str) -> None:
    assert IGNORE.ignored(path)


def test_every_copy_source_is_in_the_context() -> None:
    for stage in STAGES:
        for ins in stage.all("COPY"):
            words = [w for w in ins.words() if not w.startswith("--")]
            for source in words[:-1]:
                assert not IGNORE.ignored(source.rstrip("/")), f"{source} is dockerignored"
                assert (REPO / source).exists(), source


def test_the_context_is_small() -> None:
    """What `docker build .` would send: the package, the profiles, nothing else."""
    files = IGNORE.context(REPO)
    tops = {f.split("/")[0] for f in files}
    assert tops <= {"pyproject.toml", "README.md", "LICENSE", "operator", "loadtest"}, tops
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]

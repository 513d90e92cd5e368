"""docs/getting-started.md, run as a newcomer runs it: every command of its first two parts in a
fresh folder holding the repository's examples and profiles, with the outcome the page states;
the cluster part is checked here against the chart and the Dockerfile and run against the
Kubernetes emulator in tests/k8s/test_getting_started.py. A command the page gains that no test
knows how to run fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.charts import CHART_DIR
from tests.docs.pages import ROOT, Command, commands, flag_values

PAGE = "getting-started.md"
LOCAL = ("python3", "chunktune", "sed")
CLUSTER = ("docker", "helm", "kubectl")
#: A busy 2-core machine: the quickstart's 20 trials take 10-25 s there when quiet.
TIMEOUT = 600


def page_commands() -> list[Command]:
    return commands(PAGE)


def test_the_page_has_only_commands_these_tests_run() -> None:
    found = page_commands()
    assert found, "no bash blocks found"
    unknown = [c.text for c in found if c.program not in LOCAL + CLUSTER]
    assert unknown == []


def test_the_install_command_is_the_readmes() -> None:
    installs = [c for c in page_commands() if c.program == "python3"]
    assert [c.text for c in installs] == ["python3 -m pip install -e ."]
    readme = (ROOT / "README.md").read_text()
    assert "python3 -m pip install -e . && chunktune tune examples/quickstart.yaml" in readme


@pytest.mark.slow
def test_the_simulator_part_runs_as_the_page_says(tmp_path: Path) -> None:
    """Each ``chunktune`` and ``sed`` command in order, in a folder with ``examples/`` and
    ``loadtest/``: exit 0, or for a command the page says fails, exit 1 with the message the
    page quotes (and no traceback)."""
    for folder in ("examples", "loadtest"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)])}
    ran = []
    for cmd in page_commands():
        if cmd.program not in ("chunktune", "sed"):
            continue
        done = subprocess.run(["bash", "-c", cmd.text], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        output = done.stdout + done.stderr
        assert "Traceback" not in output, (cmd.text, output[-3000:])
        if cmd.fails_with is None:
            assert done.returncode == 0, (cmd.text, output[-3000:])
        else:
            assert done.returncode == 1, (cmd.text, output[-3000:])
            assert cmd.fails_with in output, (cmd.text, output[-3000:])
        ran.append(cmd.words[:2])
    assert ("chunktune", "tune") in ran and ("chunktune", "validate") in ran
    result = tmp_path / "out" / "quickstart" / "result.json"
    assert result.is_file()
    # the page's claims about the study: resumable storage where it says
    assert (tmp_path / ".chunktune" / "default-quickstart.journal").is_file()


def test_the_image_the_page_builds_is_the_one_it_installs() -> None:
    cmds = page_commands()
    build = next(c for c in cmds if c.words[:2] == ("docker", "build"))
    push = next(c for c in cmds if c.words[:2] == ("docker", "push"))
    tag = flag_values(build.words, "-t")[0]
    assert build.words[-1] == "." and (ROOT / "Dockerfile").is_file()
    assert push.words[2] == tag
    helm = next(c for c in cmds if c.words[:2] == ("helm", "install"))
    sets = dict(v.split("=", 1) for v in flag_values(helm.words, "--set"))
    assert f"{sets['image.repository']}:{sets['image.tag']}" == tag


def test_the_helm_install_renders_the_operator_with_that_image() -> None:
    """The chart rendered with the page's ``--set`` values (helm-python-sdk runs Helm's own
    code): the operator Deployment runs the pushed image, in the page's namespace."""
    import helm_python as helm

    from tests.charts.helpers import container, only

    cmd = next(c for c in page_commands() if c.words[:2] == ("helm", "install"))
    release, chart_path = cmd.words[2], cmd.words[3]
    assert (ROOT / chart_path).resolve() == CHART_DIR.resolve()
    namespace = flag_values(cmd.words, "-n")[0]
    values: dict[str, dict[str, str]] = {}
    for item in flag_values(cmd.words, "--set"):
        key, value = item.split("=", 1)
        top, sub = key.split(".", 1)
        values.setdefault(top, {})[sub] = value
    chart = helm.Chart.load(CHART_DIR)
    try:
        files = chart.render(values, name=release, namespace=namespace, is_install=True)
    finally:
        chart.close()
    objects = [d for path, text in files.items() if not path.endswith("NOTES.txt")
               for d in yaml.safe_load_all(text) if d]
    deployment = only(objects, "Deployment")
    assert deployment["metadata"]["namespace"] == namespace
    image = values["image"]
    assert container(objects)["image"] == f"{image['repository']}:{image['tag']}"

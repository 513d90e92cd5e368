"""A real Prometheus (the Debian ``prometheus`` binary) on loopback for tests, scraping fixed
targets every second, in a temporary directory; stopped at the end of the block."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests
import yaml

#: Why a test that needs the binary is skipped without it (CI installs it).
MISSING = "no prometheus binary (apt-get install prometheus)"
HAVE_PROMETHEUS = shutil.which("prometheus") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def prometheus(tmp: Path, targets: Sequence[str], job: str = "vllm",
               timeout: float = 60.0) -> Iterator[str]:
    """Prometheus scraping ``targets`` (``host:port``) every second; yields its URL once every
    target is up."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}]}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = requests.get(f"{url}/api/v1/query", params={"query": f'up{{job="{job}"}}'},
                                 timeout=2)
                up = [s for s in r.json()["data"]["result"] if s["value"][1] == "1"]
                if len(up) == len(targets):
                    break
            except (requests.RequestException, ValueError, KeyError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prometheus did not start scraping:\n"
                                   + (tmp / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

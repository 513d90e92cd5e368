"""The ``local`` backend: engines and the load driver as processes on this machine.

A trial starts ``chunktune sim serve`` (``engine.kind: sim``) or real vLLM (``engine.kind:
vllm``: ``vllm serve`` where that command works, else ``python -m
vllm.entrypoints.openai.api_server`` with the same flags, see :mod:`chunktune.backends.vllm`;
vLLM's CPU build with ``spec.engine.cpu``) on a free loopback port with the trial's flags,
waits for ``/health``, scrapes ``/metrics``, runs ``chunktune load run`` (Locust, in its own
process), scrapes again, and stops the engine (its whole process group). Nothing scrapes the
engine during the load: a scrape renders the whole exposition on the API server's event loop
(6-14 ms on the CPU engine), a stall of every stream in flight, and the step log has every
step's KV usage (the peak is taken from it:
:func:`~chunktune.backends.base.take_kv_peak_from_steps`). An engine that exits before it
serves is classified from its exit code and log (:mod:`chunktune.backends.classify`): vLLM's
OOM, KV-cache and configuration messages make the point ``INFEASIBLE``, anything else is a
failed trial (a port taken in the meantime is retried on another port). An engine (vLLM or
``sim serve``) logs every step (``--enable-logging-iteration-details``); the trial's result
carries those steps (:mod:`chunktune.core.steps`) and, with ``steps_dir``, they are kept as
files. ``parallelism`` trials run side by side, each on its own ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from chunktune.backends import vllm
from chunktune.backends.base import (
    TrialBackend,
    record_engine_startup,
    take_kv_peak_from_steps,
    trial_tag,
)
from chunktune.backends.classify import classify
from chunktune.core.errors import BackendUnavailable
from chunktune.core.flatten import flatten, flatten_window
from chunktune.core.steps import keep_step_log
from chunktune.core.summary import LoadSummary, Window
from chunktune.core.trials import Reporter, TrialPlan, TrialResult, TrialState
from chunktune.metrics.client import scrape
from chunktune.metrics.promtext import server_metrics

#: Seconds between checks of the load (its windows, for pruning) while it runs.
POLL_INTERVAL = 1.0

#: Engine kinds that log their steps (``--enable-logging-iteration-details``).
STEP_LOG_KINDS = vllm.STEP_LOG_KINDS

#: Start-up attempts when the engine's port was taken between choosing and binding it.
PORT_ATTEMPTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalBackend(TrialBackend):
    name = "local"

    def __init__(self, max_parallel: int = 1, host: str = "127.0.0.1",
                 load_time: float = 0.5, workdir: str | Path | None = None,
                 python: str = sys.executable, keep_logs: bool = False,
                 steps_dir: str | Path | None = None, vllm_python: str | None = None) -> None:
        self.max_parallel = max_parallel
        self.host = host
        self.load_time = load_time
        self.python = python
        self.keep_logs = keep_logs
        self.steps_dir = Path(steps_dir) if steps_dir is not None else None
        """Where each trial's step log is kept (``<trial>.steps.jsonl`` and ``.log``)."""
        self.vllm_python = vllm_python
        """The interpreter holding vLLM (default ``$CHUNKTUNE_VLLM_PYTHON``, else this one)."""
        self._vllm: vllm.VllmInstall | None = None
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="chunktune-local-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._procs: set[asyncio.subprocess.Process] = set()

    # ---- commands --------------------------------------------------------------------------

    def engine_command(self, plan: TrialPlan, port: int) -> list[str]:
        t = plan.target
        flags = plan.engine_flags()
        served = ["--served-model-name", t.served_model_name]
        if t.kind == "sim":
            cmd = [self.python, "-m", "chunktune", "sim", "serve", "--model", t.model,
                   *t.sim_gpu_args(), "--host", self.host, "--port", str(port),
                   "--load-time", str(self.load_time), *served, *vllm.with_step_log(flags),
                   *vllm.sim_acceptance(flags, plan.profile)]
            if t.vllm_version:
                cmd += ["--vllm-version", t.vllm_version]
            if t.hf_config:
                cfg = self.workdir / f"{plan.name or plan.number}-config.json"
                cfg.write_text(json.dumps(t.hf_config))
                cmd += ["--model-config", str(cfg)]
            if t.calibration_ref is not None:
                raise BackendUnavailable(
                    f"spec.engine.calibration.configMapKeyRef: the ConfigMap "
                    f"{t.calibration_ref[0]!r} is read by the kubernetes backend only; give "
                    "the profile as spec.engine.calibration.file for the local backend")
            if t.calibration is not None:
                prof = self.workdir / f"{plan.name or plan.number}-calibration.json"
                prof.write_text(json.dumps(t.calibration))
                cmd += ["--calibration", str(prof)]
            return cmd
        if t.kind == "vllm":
            model, implied = vllm.resolve_model(t.model)
            cpu_flags = vllm.cpu_env_and_flags(t.cpu)[1] if t.cpu is not None else []
            return vllm.serve_command(
                self.vllm_install(), model,
                ["--host", self.host, "--port", str(port), *served, *implied, *cpu_flags,
                 *vllm.with_step_log(flags)])
        raise BackendUnavailable(f"the local backend cannot run engine.kind {t.kind!r}")

    def vllm_install(self) -> vllm.VllmInstall:
        """vLLM in the engine's interpreter, probed once (raises BackendUnavailable)."""
        if self._vllm is None:
            self._vllm = vllm.probe(self.vllm_python)
        return self._vllm

    def preflight(self, plan: TrialPlan) -> None:
        """Problems every trial would hit, before any engine starts: vLLM missing, the model
        directory missing or broken. Raises :class:`BackendUnavailable` naming the fix."""
        t = plan.target
        if t.kind != "vllm":
            return
        self.vllm_install()
        model, _ = vllm.resolve_model(t.model)
        problem = vllm.check_model(model)
        if problem:
            raise BackendUnavailable(problem)

    def load_command(self, plan: TrialPlan, url: str, profile_path: Path, out: Path,
                     windows: Path | None) -> list[str]:
        cmd = [self.python, "-m", "chunktune", "load", "run", "--target", url,
               "--profile", str(profile_path), "--model", plan.target.served_model_name,
               "--out", str(out), "--drain-timeout", f"{plan.drain_timeout:g}s", "--quiet"]
        if windows is not None and plan.window_seconds:
            cmd += ["--windows", f"{plan.window_seconds:g}s", "--windows-out", str(windows)]
        if plan.load_workers:
            cmd += ["--workers", str(plan.load_workers)]
        for cls, slo in plan.slos.items():
            for metric, value in slo.items():
                cmd += ["--slo", f"{'' if cls == '*' else cls + ':'}{metric}={value:g}"]
        return cmd

    def _env(self, plan: TrialPlan) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if plan.target.kind == "vllm":
            model = vllm.resolve_model(plan.target.model)[0]
            if plan.target.cpu is not None or vllm.looks_like_path(model):
                # Nothing to download (a local directory; a CPU engine's model is local or
                # cached): never wait on a model hub. The manifest's env may say otherwise.
                env["HF_HUB_OFFLINE"] = "1"
            if plan.target.cpu is not None:
                for name, value in vllm.cpu_env_and_flags(plan.target.cpu)[0].items():
                    if value is None:
                        env.pop(name, None)
                    else:
                        env[name] = value
        # secretKeyRef/configMapKeyRef: a local run takes the variable from this
        # environment, where the user has it (HF_TOKEN), since there is no Secret here.
        env.update(plan.target.literal_env())
        return env

    # ---- a trial ---------------------------------------------------------------------------

    async def run_trial(self, plan: TrialPlan, report: Reporter | None = None) -> TrialResult:
        tag = trial_tag(plan)
        t0 = time.monotonic()
        try:
            self.preflight(plan)
        except BackendUnavailable as e:
            return TrialResult(TrialState.FAIL, reason="EngineUnavailable", message=str(e))
        for attempt in range(PORT_ATTEMPTS):
            result = await self._attempt(plan, report, tag, t0)
            if result.reason != "PortInUse" or attempt == PORT_ATTEMPTS - 1:
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt(self, plan: TrialPlan, report: Reporter | None, tag: str,
                       t0: float) -> TrialResult:
        port = self.choose_port()
        url = f"http://{self.host}:{port}"
        log_path = self.workdir / f"{tag}-engine.log"
        cmd = self.engine_command(plan, port)
        with log_path.open("wb") as log:
            engine = await asyncio.create_subprocess_exec(
                *cmd, stdout=log, stderr=asyncio.subprocess.STDOUT, env=self._env(plan),
                start_new_session=True)
        self._procs.add(engine)
        result: TrialResult | None = None
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                ready = await self._wait_ready(engine, http, url, plan.target.startup_timeout)
                startup = time.monotonic() - t0
                if not ready:
                    result = self._startup_failure(engine, log_path, startup,
                                                   plan.target.startup_timeout, port)
                else:
                    result = await self._measure(plan, http, url, tag, startup, report)
                return result
        finally:
            await self._stop(engine)
            self._procs.discard(engine)
            if plan.target.kind in STEP_LOG_KINDS and result is not None:
                self._keep_steps(tag, log_path, result)
            if not self.keep_logs:
                with contextlib.suppress(OSError):
                    log_path.unlink()

    def choose_port(self) -> int:
        """A free loopback port for the next engine."""
        return free_port(self.host)

    def _keep_steps(self, tag: str, log_path: Path, result: TrialResult) -> None:
        """Attach the engine's ``Iteration`` lines to the result; keep them in steps_dir."""
        try:
            with log_path.open(errors="replace") as f:
                lines = f.readlines()
        except OSError:
            return
        record_engine_startup(result, lines)
        result.steps, out = keep_step_log(lines, self.steps_dir, tag)
        if out is not None:
            result.steps_file = str(out)
        take_kv_peak_from_steps(result)  # the scrapes before and after the load miss it

    async def _wait_ready(self, proc: asyncio.subprocess.Process, http: aiohttp.ClientSession,
                          url: str, timeout: float) -> bool:
        """Poll ``/health`` until it answers 200 (True), or the engine exits or ``timeout``
        passes (False). A probe that hangs (another process holds the port and accepts, but
        never answers) does not hold back seeing the engine exit."""
        deadline = time.monotonic() + timeout
        exited = asyncio.ensure_future(proc.wait())
        try:
            while not exited.done() and time.monotonic() < deadline:
                probe = asyncio.ensure_future(self._healthy(http, url))
                await asyncio.wait({probe, exited}, timeout=deadline - time.monotonic(),
                                   return_when=asyncio.FIRST_COMPLETED)
                if probe.done() and probe.result():
                    return True
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probe
                await asyncio.wait({exited}, timeout=min(0.1, max(0.0, deadline
                                                                   - time.monotonic())))
            return False
        finally:
            exited.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await exited

    @staticmethod
    async def _healthy(http: aiohttp.ClientSession, url: str) -> bool:
        try:
            async with http.get(url + "/health") as r:
                return r.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    def _startup_failure(self, proc: asyncio.subprocess.Process, log_path: Path,
                         startup: float, timeout: float, port: int) -> TrialResult:
        text = log_path.read_text(errors="replace")[-20000:]
        if proc.returncode is None:
            return TrialResult(TrialState.FAIL, reason="StartupTimeout",
                               message=f"the engine did not answer /health within {timeout:g} s"
                                       f" (engine.startupTimeout); last log lines:\n"
                               + "\n".join(text.splitlines()[-5:]), startup_seconds=startup)
        f = classify(proc.returncode, text)
        message = f.describe()
        if f.reason == "PortInUse":
            message = f"port {port}: {message}"
        return TrialResult(TrialState.INFEASIBLE if f.infeasible else TrialState.FAIL,
                           reason=f.reason, message=message, startup_seconds=startup)

    async def _measure(self, plan: TrialPlan, http: aiohttp.ClientSession, url: str, tag: str,
                       startup: float, report: Reporter | None) -> TrialResult:
        profile_path = self.workdir / f"{tag}-profile.yaml"
        profile_path.write_text(yaml.safe_dump(plan.profile.to_dict(), sort_keys=False))
        out = self.workdir / f"{tag}-summary.json"
        windows = self.workdir / f"{tag}-windows.jsonl" if report else None
        before = await scrape(http, url)
        t1 = time.monotonic()
        load = await asyncio.create_subprocess_exec(
            *self.load_command(plan, url, profile_path, out, windows),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env=self._env(plan), start_new_session=True)
        self._procs.add(load)
        seen = 0
        pruned_at: int | None = None
        assert load.stderr is not None  # started with stderr=PIPE
        err_task = asyncio.create_task(load.stderr.read())
        try:
            while load.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(load.wait(), POLL_INTERVAL)
                if windows is not None and report is not None and windows.exists():
                    lines = windows.read_text().splitlines()
                    for line in lines[seen:]:
                        w = Window.from_dict(json.loads(line))
                        if not w.warmup and report(w.index, flatten_window(w)):
                            pruned_at = w.index
                            break
                    seen = len(lines)
                    if pruned_at is not None:
                        load.terminate()
                        await load.wait()
                        break
        finally:
            self._procs.discard(load)
            if load.returncode is None:
                await _kill(load)
        stderr = (await err_task).decode(errors="replace")
        load_s = time.monotonic() - t1
        after = await scrape(http, url)
        server: dict[str, Any] = {}
        if before is not None and after is not None:
            server = server_metrics(before, after, load_s)
        if pruned_at is not None:
            return TrialResult(TrialState.PRUNED, reason="Pruned",
                               metrics=_window_metrics(windows), server=server,
                               startup_seconds=startup, load_seconds=load_s,
                               pruned_at=pruned_at)
        if load.returncode != 0 or not out.exists():
            return TrialResult(TrialState.FAIL, reason="LoadFailed",
                               message=f"chunktune load run exited {load.returncode}: "
                                       + "\n".join(stderr.strip().splitlines()[-5:]),
                               server=server, startup_seconds=startup, load_seconds=load_s)
        summary = LoadSummary.from_dict(json.loads(out.read_text()))
        return TrialResult(TrialState.COMPLETE, metrics=flatten(summary, server), summary=summary,
                           server=server, startup_seconds=startup, load_seconds=load_s)

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            await _kill(proc)

    async def close(self) -> None:
        for p in list(self._procs):
            await _kill(p)
        if self._own_workdir and not self.keep_logs:
            shutil.rmtree(self.workdir, ignore_errors=True)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()


def _window_metrics(path: Path | None) -> dict[str, float]:
    """The last measured window's metrics (what the pruner saw)."""
    if path is None or not path.exists():
        return {}
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for d in reversed(lines):
        w = Window.from_dict(d)
        if not w.warmup:
            return flatten_window(w)
    return {}

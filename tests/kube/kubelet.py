"""A fake kubelet (plus Job and Deployment controllers) for the Kubernetes emulator.

:class:`FakeKubelet` hooks into a running :class:`~tests.kube.emulator.KubeEmulator` and plays
the node: every Pod that appears gets a unique loopback IP (``127.0.x.y``, ``x, y >= 1``, never
``127.0.0.1``) and its containers run as local subprocesses; their status, readiness probes,
exit codes and logs are written back to the emulator as a kubelet would. It also plays the Job
controller (a Job gets up to ``parallelism`` pods at a time from its template until it completes
or exhausts its ``backoffLimit``) and a minimal Deployment controller (``replicas`` pods from the
template, owned directly by the Deployment, with ready/available counts).

There are no images, containers or network namespaces: ``command`` + ``args`` run on this
machine (the first word resolved on ``PATH`` as is; a container without ``command`` runs the
entrypoint given for its image in ``entrypoints=``), the process environment is this process's
environment plus the container's ``env``/``envFrom``, and since every pod shares the host's
network, a bind host ``0.0.0.0`` in the command, args or env values is rewritten to the pod's IP
so that two pods can listen on the same port, and a Service's DNS name (``NAME.NS.svc:PORT``)
in them becomes the IP and target port of a running pod the Service selects (the container
waits until there is one). Probe periods are compressed to
``probe_interval`` so tests stay fast. Containers are never restarted (every pod behaves as
``restartPolicy: Never``); ``configMap``, ``secret`` and ``emptyDir`` volumes become per-pod
local folders (paths under a mount path in command, args and env are rewritten to them); other
volumes, resources and liveness probes are ignored.

Usage::

    with KubeEmulator() as kube, FakeKubelet(kube) as kubelet:
        kube.create('pods', {'metadata': {'name': 'web'}, 'spec': {'containers': [{
            'name': 'web', 'command': ['python', '-m', 'http.server', '8000',
                                       '--bind', '0.0.0.0'],
            'readinessProbe': {'httpGet': {'port': 8000, 'path': '/'}}}]}}, 'default')
        kube.wait_for(lambda: kubelet.is_ready('default', 'web'))
        urllib.request.urlopen(f'http://{kubelet.pod_ip("default", "web")}:8000/')
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import copy
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import pathlib
import random
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import aiohttp
import kmock

from tests.kube.emulator import (
    PODS,
    ApiServer,
    Body,
    KubeEmulator,
    Selector,
    WatchEvent,
    now_rfc3339,
)
from tests.kube.scheduler import NodeCapacity, unschedulable_message

logger = logging.getLogger(__name__)

JOBS = kmock.resource('batch', 'v1', 'jobs')
DEPLOYMENTS = kmock.resource('apps', 'v1', 'deployments')
CONFIGMAPS = kmock.resource('', 'v1', 'configmaps')
SECRETS = kmock.resource('', 'v1', 'secrets')
SERVICES = kmock.resource('', 'v1', 'services')
#: A Service's DNS name in a word (``NAME.NS.svc``, optionally ``.cluster.local``), with a port.
_DNS_LABEL = r'([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)'
_SERVICE_HOST = re.compile(rf'\b{_DNS_LABEL}\.{_DNS_LABEL}'
                           r'\.svc(?:\.cluster\.local)?(?::(\d+))?(?![\w.-])')

_IP_SPACE = 255 * 254  # 127.0.1.1 ... 127.0.255.254
_ip_lock = threading.Lock()
# Each test process starts at a random place in the space: two runs on one machine (developers
# side by side, CI jobs) would otherwise give their first pods the same IP, and a pod that
# binds IP:port would find it taken by the other run's.
_ip_start = random.randrange(_IP_SPACE)
_ip_counter = itertools.count()


def allocate_pod_ip() -> str:
    """The next unused loopback pod IP of this process, in 127.0.1.1 ... 127.0.255.254.

    Linux routes all of 127.0.0.0/8 to the loopback interface, so each pod can bind its own
    address without network namespaces.
    """
    with _ip_lock:
        n = next(_ip_counter)
    if n >= _IP_SPACE:
        raise RuntimeError('Out of loopback pod IPs.')
    n = (_ip_start + n) % _IP_SPACE
    x, y = 1 + n // 254, 1 + n % 254
    return f'127.0.{x}.{y}'


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion, as the kubelet does it for command, args and env.

    ``$(NAME)`` becomes the variable's value if it is defined, and stays as written if not;
    ``$$`` escapes a ``$``. Nothing else (no ``$NAME`` or ``${NAME}``) is expanded.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == '$' and i + 1 < len(text):
            if text[i + 1] == '$':
                out.append('$')
                i += 2
                continue
            if text[i + 1] == '(':
                end = text.find(')', i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else text[i:end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return ''.join(out)


class ContainerConfigError(Exception):
    """A referenced ConfigMap, Secret or key is missing (the kubelet retries)."""


def _owned_by(body: Body, uid: str) -> bool:
    refs = body.get('metadata', {}).get('ownerReferences') or []
    return any(ref.get('uid') == uid for ref in refs)


def _is_ready(pod: Body) -> bool:
    conditions = (pod.get('status') or {}).get('conditions') or []
    return any(c.get('type') == 'Ready' and c.get('status') == 'True' for c in conditions)


def _phase(pod: Body) -> str:
    return str((pod.get('status') or {}).get('phase') or 'Pending')


@dataclasses.dataclass
class _Container:
    """One container's process and the state the kubelet reports for it."""

    spec: dict[str, Any]
    state: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {'waiting': {'reason': 'ContainerCreating'}})
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    started: bool = False
    tail: str = ''

    @property
    def name(self) -> str:
        return str(self.spec.get('name', ''))


class _PodRunner:
    """Runs one pod: resolves env, starts the processes, probes them, reports status."""

    def __init__(self, kubelet: FakeKubelet, pod: Body) -> None:
        self.kubelet = kubelet
        self.server: ApiServer = kubelet.kube.server
        meta = pod['metadata']
        self.namespace: str = meta['namespace']
        self.name: str = meta['name']
        self.uid: str = meta['uid']
        self.pod = pod
        self.ip = allocate_pod_ip()
        self.start_time = now_rfc3339()
        self.containers = [_Container(copy.deepcopy(c))
                           for c in (pod.get('spec') or {}).get('containers') or []]
        self.transitions: dict[str, tuple[str, str]] = {}
        self.publish_lock = asyncio.Lock()
        self.gone = False
        self.volume_root: pathlib.Path | None = None

    # ---- status -------------------------------------------------------------------------

    def _condition(self, kind: str, ok: bool) -> dict[str, Any]:
        status = 'True' if ok else 'False'
        if self.transitions.get(kind, ('', ''))[0] != status:
            self.transitions[kind] = (status, now_rfc3339())
        return {'type': kind, 'status': status, 'lastProbeTime': None,
                'lastTransitionTime': self.transitions[kind][1]}

    def status(self) -> dict[str, Any]:
        states = [c.state for c in self.containers]
        if states and all('terminated' in s for s in states):
            failed = any(s['terminated']['exitCode'] != 0 for s in states)
            phase = 'Failed' if failed else 'Succeeded'
        elif any('running' in s or 'terminated' in s for s in states):
            phase = 'Running'
        else:
            phase = 'Pending'
        ready = phase == 'Running' and all(c.ready for c in self.containers)
        return {
            'phase': phase,
            'hostIP': '127.0.0.1', 'hostIPs': [{'ip': '127.0.0.1'}],
            'podIP': self.ip, 'podIPs': [{'ip': self.ip}],
            'startTime': self.start_time, 'qosClass': 'BestEffort',
            'conditions': [
                self._condition('PodScheduled', True),
                self._condition('Initialized', True),
                self._condition('ContainersReady', ready),
                self._condition('Ready', ready),
            ],
            'containerStatuses': [{
                'name': c.name, 'image': c.spec.get('image', ''), 'imageID': '',
                'containerID': f'fake://{c.proc.pid}' if c.proc else '',
                'ready': c.ready and 'running' in c.state, 'started': c.started,
                'restartCount': 0, 'state': copy.deepcopy(c.state),
            } for c in self.containers],
        }

    async def publish(self) -> None:
        """Write the whole status through the ``/status`` subresource."""
        if self.gone:
            return
        async with self.publish_lock:
            try:
                await self.server.store_update(PODS, self.namespace, self.name,
                                               {'status': self.status()},
                                               patch_type='replace', subresource='status')
            except kmock.KubernetesError:
                self.gone = True

    # ---- environment --------------------------------------------------------------------

    def _lookup(self, resource: kmock.resource, name: str, key: str | None,
                optional: bool) -> dict[str, str] | str | None:
        obj = self.server.store_get(resource, self.namespace, name)
        data: dict[str, str] = {}
        if obj is not None:
            if resource == SECRETS:
                raw = obj.get('data') or {}
                data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
            else:
                data = dict(obj.get('data') or {})
        if obj is None or (key is not None and key not in data):
            if optional:
                return None
            what = f'{resource.plural} {name!r}' + (f' key {key!r}' if key else '')
            raise ContainerConfigError(f'{what} not found')
        return data if key is None else data[key]

    def _field(self, path: str) -> str:
        meta = self.pod.get('metadata') or {}
        simple = {
            'metadata.name': self.name, 'metadata.namespace': self.namespace,
            'metadata.uid': self.uid, 'status.podIP': self.ip, 'status.podIPs': self.ip,
            'status.hostIP': '127.0.0.1', 'status.hostIPs': '127.0.0.1',
            'spec.nodeName': self.kubelet.node_name,
            'spec.serviceAccountName': (self.pod.get('spec') or {}).get(
                'serviceAccountName', 'default'),
        }
        if path in simple:
            return str(simple[path])
        for field in ('labels', 'annotations'):
            prefix = f"metadata.{field}['"
            if path.startswith(prefix) and path.endswith("']"):
                return str((meta.get(field) or {}).get(path[len(prefix):-2], ''))
        raise ContainerConfigError(f'unsupported fieldRef {path!r}')

    def resolve_env(self, spec: Mapping[str, Any]) -> dict[str, str]:
        """The container's own variables: ``envFrom``, then ``env`` in order, with
        ``$(VAR)`` expansion of values from earlier variables, downward-API ``fieldRef``,
        ``secretKeyRef`` and ``configMapKeyRef`` resolved from the emulator."""
        env: dict[str, str] = {}
        for source in spec.get('envFrom') or []:
            prefix = source.get('prefix', '')
            for kind, resource in (('configMapRef', CONFIGMAPS), ('secretRef', SECRETS)):
                if ref := source.get(kind):
                    found = self._lookup(resource, ref['name'], None, ref.get('optional', False))
                    if isinstance(found, dict):
                        env.update({f'{prefix}{k}': v for k, v in found.items()})
        for var in spec.get('env') or []:
            name = var['name']
            source = var.get('valueFrom') or {}
            if 'value' in var:
                env[name] = expand(str(var['value']), env)
            elif ref := source.get('fieldRef'):
                env[name] = self._field(ref['fieldPath'])
            elif ref := source.get('secretKeyRef') or source.get('configMapKeyRef'):
                resource = SECRETS if 'secretKeyRef' in source else CONFIGMAPS
                found = self._lookup(resource, ref['name'], ref['key'], ref.get('optional', False))
                if isinstance(found, str):
                    env[name] = found
            else:
                env[name] = ''  # resourceFieldRef and the like: not emulated
        return env

    # ---- running ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self.publish()
            await asyncio.gather(*(self._run_container(c) for c in self.containers))
        finally:
            await self.kill()
            if self.volume_root is not None:
                shutil.rmtree(self.volume_root, ignore_errors=True)

    # ---- volumes ------------------------------------------------------------------------

    def mount_volumes(self, spec: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Materialise the container's ``configMap``, ``secret`` and ``emptyDir`` volumes as
        directories of a per-pod temporary folder; returns ``(mountPath, local dir)`` pairs,
        longest mount path first. There is no mount namespace, so the kubelet rewrites every
        command word, arg and env value that is a mount path or lies under one (see
        :meth:`FakeKubelet.remap`). Other volume types are ignored."""
        volumes = {v.get('name'): v for v in (self.pod.get('spec') or {}).get('volumes') or []}
        if self.volume_root is None:
            self.volume_root = pathlib.Path(tempfile.mkdtemp(prefix=f'pod-{self.name}-'))
        mounts: list[tuple[str, str]] = []
        for mount in spec.get('volumeMounts') or []:
            volume = volumes.get(mount.get('name'))
            if volume is None:
                continue
            local = self.volume_root / str(mount['name'])
            if 'configMap' in volume or 'secret' in volume:
                source = volume.get('configMap') or volume.get('secret') or {}
                resource = CONFIGMAPS if 'configMap' in volume else SECRETS
                name = source.get('name') or source.get('secretName')
                found = self._lookup(resource, str(name), None, bool(source.get('optional')))
                data = found if isinstance(found, dict) else {}
                items = source.get('items') or [{'key': k, 'path': k} for k in data]
                local.mkdir(parents=True, exist_ok=True)
                for item in items:
                    if item['key'] not in data:
                        raise ContainerConfigError(f'key {item["key"]!r} of volume '
                                                   f'{mount["name"]!r} not found')
                    target = local / item['path']
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(data[item['key']], encoding='utf-8')
            elif 'emptyDir' in volume:
                local.mkdir(parents=True, exist_ok=True)
            else:
                continue
            sub = mount.get('subPath')
            mounts.append((str(mount['mountPath']).rstrip('/') or '/',
                           str(local / sub) if sub else str(local)))
        return sorted(mounts, key=lambda m: -len(m[0]))

    async def _run_container(self, container: _Container) -> None:
        spec = container.spec
        while True:
            try:
                env = self.resolve_env(spec)
                mounts = self.mount_volumes(spec)
                break
            except ContainerConfigError as e:
                container.state = {'waiting': {'reason': 'CreateContainerConfigError',
                                               'message': str(e)}}
                await self.publish()
                await asyncio.sleep(max(self.kubelet.probe_interval, 0.1))
        command = list(spec.get('command') or self.kubelet.entrypoint(spec.get('image')))
        words = [expand(str(word), env) for word in command + list(spec.get('args') or [])]
        while (found := [self.kubelet.resolve_services(w) for w in words]) and None in found:
            await asyncio.sleep(max(self.kubelet.probe_interval, 0.1))  # no endpoint yet
        argv = [self.kubelet.remap(self.kubelet.rebind(str(word), self.ip), mounts)
                for word in found]
        process_env = self.kubelet.base_env(self.name)
        process_env.update({k: self.kubelet.remap(self.kubelet.rebind(v, self.ip), mounts)
                            for k, v in env.items()})
        started_at = now_rfc3339()
        if not command:
            await self._terminate(container, 128, 'StartError', started_at, 'FakeKubelet: the '
                                  'container has no command and its image no entrypoint')
            return
        try:
            container.proc = await asyncio.create_subprocess_exec(
                *argv, env=process_env, cwd=spec.get('workingDir') or None,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            await self._terminate(container, 128, 'StartError', started_at, str(e))
            return
        container.state = {'running': {'startedAt': started_at}}
        container.started = not spec.get('startupProbe')
        await self.publish()
        reader = asyncio.ensure_future(self._read_output(container))
        prober = asyncio.ensure_future(self.kubelet.probe_container(self, container))
        try:
            limit = self.kubelet.max_container_seconds
            deadline = (self.pod.get('spec') or {}).get('activeDeadlineSeconds')
            if deadline is not None:
                limit = min(limit or float(deadline), float(deadline))
            try:
                code = await asyncio.wait_for(container.proc.wait(), limit)
                message_prefix = ''
            except TimeoutError:
                await self._kill_one(container)
                code = container.proc.returncode if container.proc.returncode is not None else 137
                message_prefix = f'FakeKubelet: killed after its {limit} s limit\n'
        finally:
            prober.cancel()
            if container.proc.returncode is None:  # cancelled: the pod is being deleted
                await self._kill_one(container)
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(reader, 2.0)
        code = 128 - code if code < 0 else code  # killed by signal N: exit code 128+N
        await self._terminate(container, code, 'Completed' if code == 0 else 'Error', started_at,
                              message_prefix + (container.tail if code != 0 else ''))

    async def _terminate(self, container: _Container, code: int, reason: str, started_at: str,
                         message: str) -> None:
        if message and not container.tail:
            self.server.append_pod_log(self.namespace, self.name, message, container.name)
        terminated: dict[str, Any] = {'exitCode': code, 'reason': reason,
                                      'startedAt': started_at, 'finishedAt': now_rfc3339()}
        if message:
            terminated['message'] = message[-2048:]
        if container.proc is not None:
            terminated['containerID'] = f'fake://{container.proc.pid}'
        container.state = {'terminated': terminated}
        container.ready = False
        await self.publish()

    async def _read_output(self, container: _Container) -> None:
        """Stream stdout+stderr into the emulator's pod log as it arrives."""
        assert container.proc is not None and container.proc.stdout is not None
        decoder = codecs.getincrementaldecoder('utf-8')(errors='replace')
        while chunk := await container.proc.stdout.read(65536):
            text = decoder.decode(chunk)
            container.tail = (container.tail + text)[-4096:]
            if not self.gone:
                self.server.append_pod_log(self.namespace, self.name, text, container.name,
                                           limit=self.kubelet.log_limit)

    async def kill(self) -> None:
        """SIGTERM every process group, then SIGKILL what is left after the grace period
        (and SIGKILL at once if this is interrupted: no process outlives the kubelet)."""
        try:
            await asyncio.gather(*(self._kill_one(c) for c in self.containers))
        finally:
            for container in self.containers:
                self._signal(container, signal.SIGKILL)

    @staticmethod
    def _signal(container: _Container, sig: signal.Signals) -> None:
        proc = container.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    async def _kill_one(self, container: _Container) -> None:
        proc = container.proc
        if proc is None or proc.returncode is not None:
            return
        grace = (self.pod.get('spec') or {}).get('terminationGracePeriodSeconds', 30)
        try:
            for sig, wait in ((signal.SIGTERM, min(float(grace), self.kubelet.kill_timeout)),
                              (signal.SIGKILL, 5.0)):
                self._signal(container, sig)
                try:
                    await asyncio.wait_for(asyncio.shield(proc.wait()), wait)
                    return
                except TimeoutError:
                    continue
        finally:
            self._signal(container, signal.SIGKILL)


class FakeKubelet:
    """Runs the emulator's Pods as local processes; also the Job and Deployment controllers.

    Start it with ``with FakeKubelet(kube):`` / ``async with FakeKubelet(kube):`` or
    :meth:`start`/:meth:`stop`; it also stops (killing every process) when the emulator does.
    Its tasks run in the emulator's event loop, notified of every change by the emulator.
    """

    def __init__(self, kube: KubeEmulator, *, node_name: str = 'fake-node',
                 probe_interval: float = 0.05, kill_timeout: float = 2.0,
                 max_container_seconds: float | None = 900.0, inherit_env: bool = True,
                 extra_env: Mapping[str, str] | None = None, jobs: bool = True,
                 deployments: bool = True, log_limit: int = 1 << 20,
                 entrypoints: Mapping[str, Sequence[str]] | None = None,
                 capacity: Mapping[str, Any] | None = None) -> None:
        self.kube = kube
        self.node_name = node_name
        self.probe_interval = probe_interval
        """Seconds between probes (real periods are compressed to this for tests)."""
        self.kill_timeout = kill_timeout
        """Longest grace between SIGTERM and SIGKILL, whatever the pod asks."""
        self.max_container_seconds = max_container_seconds
        """A safety bound on each process's life (``None``: until deleted or stopped)."""
        self.inherit_env = inherit_env
        self.extra_env = dict(extra_env or {})
        self.jobs = jobs
        self.deployments = deployments
        self.log_limit = log_limit
        self.entrypoints = {image: list(command) for image, command in (entrypoints or {}).items()}
        """Image (with or without tag) -> the command a container without ``command`` runs,
        as the image's ENTRYPOINT would (``args`` are appended)."""
        self.capacity = NodeCapacity(capacity) if capacity is not None else None
        """The node's allocatable resources (``None``: unlimited). A pod asking more than is
        free stays ``Pending`` and ``Unschedulable`` until enough is released by pods that end
        or are deleted; waiting pods are bound in creation order, each as soon as it fits."""
        self.errors: list[BaseException] = []
        self._unscheduled: dict[str, Body] = {}
        """Pods waiting for capacity, by uid, oldest first."""
        self._queue: asyncio.Queue[WatchEvent] | None = None
        self._main_task: asyncio.Task[None] | None = None
        self._pods: dict[str, tuple[_PodRunner, asyncio.Task[None]]] = {}
        self._controllers: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._http: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> Self:
        self.kube.call(self._astart)
        return self

    def stop(self) -> None:
        """Kill every process and stop all controllers (bounded by ``kill_timeout``)."""
        with contextlib.suppress(RuntimeError):
            self.kube.call(self._astop, timeout=self.kill_timeout + 15.0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)

    async def _astart(self) -> None:
        if self._started:
            raise RuntimeError('The fake kubelet is already started.')
        self._started = True
        self._queue = asyncio.Queue()
        self._http = aiohttp.ClientSession()
        self.kube.server.add_listener(self._queue.put_nowait)
        self.kube.add_addon(self._astop)
        self._main_task = asyncio.ensure_future(self._main())

    async def _astop(self) -> None:
        if not self._started:
            return
        self._started = False
        assert self._queue is not None
        self.kube.server.remove_listener(self._queue.put_nowait)
        tasks = list(self._tasks)  # incl. runners of deleted pods still killing processes
        if self._main_task is not None:
            tasks.append(self._main_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pods.clear()
        self._unscheduled.clear()
        self._controllers.clear()
        if self._http is not None:
            await self._http.close()

    # ---- queries (thread-safe) ----------------------------------------------------------

    def pod_ip(self, namespace: str, name: str) -> str | None:
        """The IP the kubelet gave a pod (from its status), or ``None``."""
        pod = self.kube.get('pods', namespace, name)
        return None if pod is None else (pod.get('status') or {}).get('podIP')

    def is_ready(self, namespace: str, name: str) -> bool:
        pod = self.kube.get('pods', namespace, name)
        return pod is not None and _is_ready(pod)

    def phase(self, namespace: str, name: str) -> str | None:
        pod = self.kube.get('pods', namespace, name)
        return None if pod is None else _phase(pod)

    # ---- environment helpers used by the pod runners ------------------------------------

    def base_env(self, pod_name: str) -> dict[str, str]:
        env = dict(os.environ) if self.inherit_env else {'PATH': os.environ.get('PATH', '')}
        env.update(self.extra_env)
        env['HOSTNAME'] = pod_name
        return env

    def entrypoint(self, image: str | None) -> list[str]:
        """The command of an image from :attr:`entrypoints`: exact name first, then the name
        without its tag or digest; empty if unknown."""
        if not image:
            return []
        if image in self.entrypoints:
            return self.entrypoints[image]
        name = image.split('@', 1)[0]
        if ':' in name.rsplit('/', 1)[-1]:
            name = name.rsplit(':', 1)[0]
        return self.entrypoints.get(name, [])

    @staticmethod
    def remap(text: str, mounts: Sequence[tuple[str, str]]) -> str:
        """No mount namespaces here: a word that is a volume's mount path, or a path under
        one, points into the pod's local copy of that volume instead."""
        for mount_path, local in mounts:
            if text == mount_path or text.startswith(mount_path + '/'):
                return local + text[len(mount_path):]
        return text

    @staticmethod
    def rebind(text: str, ip: str) -> str:
        """No network namespaces here: a pod binding ``0.0.0.0`` binds its own IP instead."""
        return text.replace('0.0.0.0', ip)

    def resolve_services(self, text: str) -> str | None:
        """No cluster DNS or Service proxy here: ``NAME.NS.svc[:PORT]`` of a Service in the
        emulator becomes the IP of a running pod it selects (and ``PORT`` the port's
        ``targetPort``). None while the Service selects no running pod yet (the container
        waits, as a client would retry); a name that is no Service stays as it is."""
        server = self.kube.server
        missing = False

        def one(m: re.Match[str]) -> str:
            nonlocal missing
            name, namespace, port = m.group(1), m.group(2), m.group(3)
            svc = server.store_get(SERVICES, namespace, name)
            if svc is None:
                return m.group(0)
            spec = svc.get('spec') or {}
            want = spec.get('selector') or {}
            selector = Selector.from_params(
                {'labelSelector': ','.join(f'{k}={v}' for k, v in want.items())}, namespace)
            ips = [pod['status']['podIP'] for pod in server.store_list(PODS, selector)
                   if want and _phase(pod) == 'Running'
                   and (pod.get('status') or {}).get('podIP')]
            if not ips:
                missing = True
                return m.group(0)
            if port is None:
                return str(ips[0])
            target = next((p.get('targetPort', p['port']) for p in spec.get('ports') or []
                           if str(p.get('port')) == port), port)
            return f'{ips[0]}:{target}'

        out = _SERVICE_HOST.sub(one, text)
        return None if missing else out

    # ---- the event loop of the kubelet --------------------------------------------------

    async def _main(self) -> None:
        assert self._queue is not None
        server = self.kube.server
        for pod in server.store_list(PODS):
            self._on_pod(WatchEvent('ADDED', PODS, pod, None, 0))
        for res, enabled in ((JOBS, self.jobs), (DEPLOYMENTS, self.deployments)):
            for body in server.store_list(res) if enabled else []:
                self._on_controller(WatchEvent('ADDED', res, body, None, 0))
        while True:
            event = await self._queue.get()
            try:
                if event.resource == PODS:
                    self._on_pod(event)
                elif (event.resource == JOBS and self.jobs) or (
                        event.resource == DEPLOYMENTS and self.deployments):
                    self._on_controller(event)
            except Exception as e:
                logger.exception('The fake kubelet failed to handle an event.')
                self.errors.append(e)

    def _on_pod(self, event: WatchEvent) -> None:
        pod, meta = event.object, event.object.get('metadata', {})
        uid = meta.get('uid', '')
        for ref in meta.get('ownerReferences') or []:
            self._wake(ref.get('uid'))
        if event.type == 'DELETED' or meta.get('deletionTimestamp'):
            if uid in self._pods:
                self._pods.pop(uid)[1].cancel()
            if self._unscheduled.pop(uid, None) is not None:
                self._schedule_waiting()
            return
        node = (pod.get('spec') or {}).get('nodeName')
        if uid in self._pods or uid in self._unscheduled or \
                _phase(pod) in ('Succeeded', 'Failed') or (
                node and node != self.node_name) or event.type != 'ADDED':
            return
        if self.capacity is not None and (self._unscheduled or self.capacity.insufficient(pod)):
            self._unscheduled[uid] = pod
            self._schedule_waiting()
            return
        self._bind(pod)

    def _bind(self, pod: Body) -> None:
        uid = pod['metadata']['uid']
        if self.capacity is not None:
            self.capacity.bind(uid, pod)
        runner = _PodRunner(self, pod)
        task = self._spawn(runner.run())
        self._pods[uid] = (runner, task)

        def done(_: asyncio.Task[None]) -> None:
            self._pods.pop(uid, None)
            if self.capacity is not None and self.capacity.release(uid):
                self._schedule_waiting()

        task.add_done_callback(done)

    def _schedule_waiting(self) -> None:
        """Bind the waiting pods that fit now (oldest first); tell the others why not."""
        assert self.capacity is not None
        for uid, pod in list(self._unscheduled.items()):
            meta = pod['metadata']
            current = self.kube.server.store_get(PODS, meta['namespace'], meta['name'])
            if current is None or current['metadata'].get('uid') != uid or \
                    current['metadata'].get('deletionTimestamp'):
                del self._unscheduled[uid]
                continue
            missing = self.capacity.insufficient(current)
            if not missing:
                del self._unscheduled[uid]
                self._bind(current)
            elif not (current.get('status') or {}).get('conditions'):
                self._spawn(self._unschedulable(current, unschedulable_message(missing)))

    async def _unschedulable(self, pod: Body, message: str) -> None:
        meta = pod['metadata']
        if meta['uid'] not in self._unscheduled:
            return  # bound meanwhile
        status = {'phase': 'Pending', 'qosClass': 'BestEffort', 'conditions': [{
            'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable',
            'message': message, 'lastProbeTime': None, 'lastTransitionTime': now_rfc3339()}]}
        with contextlib.suppress(kmock.KubernetesError):
            await self.kube.server.store_update(PODS, meta['namespace'], meta['name'],
                                                {'status': status}, patch_type='replace',
                                                subresource='status')

    def _on_controller(self, event: WatchEvent) -> None:
        uid = event.object.get('metadata', {}).get('uid', '')
        if event.type == 'DELETED':
            if uid in self._controllers:
                self._controllers.pop(uid)[0].cancel()
            return
        if uid not in self._controllers:
            wake = asyncio.Event()
            meta = event.object['metadata']
            task = self._spawn(
                self._control(event.resource, meta['namespace'], meta['name'], uid, wake))
            self._controllers[uid] = (task, wake)
        self._wake(uid)

    def _wake(self, uid: str | None) -> None:
        if uid in self._controllers:
            self._controllers[uid][1].set()

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._guard(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guard(self, coro: Any) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.exception('A fake kubelet task failed.')
            self.errors.append(e)

    # ---- probes -------------------------------------------------------------------------

    async def probe_container(self, runner: _PodRunner, container: _Container) -> None:
        """Run the startup probe until it passes, then the readiness probe for good: Ready
        after ``successThreshold`` passes, not ready after ``failureThreshold`` failures."""
        spec = container.spec
        if startup := spec.get('startupProbe'):
            while not await self._probe(runner, container, startup):
                await asyncio.sleep(self.probe_interval)
            container.started = True
            await runner.publish()
        readiness = spec.get('readinessProbe')
        if not readiness:
            container.ready = True
            await runner.publish()
            return
        successes = failures = 0
        while True:
            if await self._probe(runner, container, readiness):
                successes, failures = successes + 1, 0
                if not container.ready and successes >= readiness.get('successThreshold', 1):
                    container.ready = True
                    await runner.publish()
            else:
                successes, failures = 0, failures + 1
                if container.ready and failures >= readiness.get('failureThreshold', 3):
                    container.ready = False
                    await runner.publish()
            await asyncio.sleep(self.probe_interval if not container.ready
                                else max(self.probe_interval, 0.2))

    async def _probe(self, runner: _PodRunner, container: _Container,
                     probe: Mapping[str, Any]) -> bool:
        timeout = float(probe.get('timeoutSeconds', 1))
        try:
            if action := probe.get('httpGet'):
                assert self._http is not None
                port = self._port(container, action.get('port'))
                scheme = str(action.get('scheme', 'HTTP')).lower()
                host = action.get('host') or runner.ip
                url = f"{scheme}://{host}:{port}{action.get('path', '/')}"
                headers = {h['name']: h['value'] for h in action.get('httpHeaders') or []}
                async with self._http.get(url, headers=headers, ssl=False, allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as rsp:
                    return 200 <= rsp.status < 400
            if action := probe.get('tcpSocket'):
                port = self._port(container, action.get('port'))
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(action.get('host') or runner.ip, port), timeout)
                writer.close()
                return True
            if action := probe.get('exec'):
                env = self.base_env(runner.name)
                env.update(runner.resolve_env(container.spec))
                proc = await asyncio.create_subprocess_exec(
                    *action.get('command', []), env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
                try:
                    return await asyncio.wait_for(proc.wait(), timeout) == 0
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                    return False
            return True  # grpc and others are not emulated: count them as passing
        except (OSError, aiohttp.ClientError, TimeoutError, ContainerConfigError):
            return False

    @staticmethod
    def _port(container: _Container, port: Any) -> int:
        if isinstance(port, str) and not port.isdigit():
            for item in container.spec.get('ports') or []:
                if item.get('name') == port:
                    return int(item['containerPort'])
            raise OSError(f'unknown named port {port!r}')
        return int(port)

    # ---- controllers --------------------------------------------------------------------

    async def _control(self, resource: kmock.resource, namespace: str, name: str, uid: str,
                       wake: asyncio.Event) -> None:
        """Reconcile whenever the owner or one of its pods changes, until the owner is gone."""
        reconcile = self._reconcile_job if resource == JOBS else self._reconcile_deploy
        while True:
            wake.clear()
            owner = self.kube.server.store_get(resource, namespace, name)
            if owner is None or owner['metadata'].get('uid') != uid:
                return
            if not await reconcile(owner):
                return
            await wake.wait()

    def _owned_pods(self, owner: Body) -> list[Body]:
        meta = owner['metadata']
        return [pod for pod in self.kube.server.store_list(PODS, Selector(meta['namespace']))
                if _owned_by(pod, meta['uid']) and not pod['metadata'].get('deletionTimestamp')]

    async def _create_pod(self, owner: Body, api_version: str, prefix: str,
                          labels: Mapping[str, str]) -> None:
        meta = owner['metadata']
        template = copy.deepcopy((owner.get('spec') or {}).get('template') or {})
        pod_meta = template.get('metadata') or {}
        pod = {
            'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {
                'generateName': prefix, 'namespace': meta['namespace'],
                'labels': {**(pod_meta.get('labels') or {}), **labels},
                'annotations': pod_meta.get('annotations') or {},
                'ownerReferences': [{
                    'apiVersion': api_version, 'kind': owner['kind'], 'name': meta['name'],
                    'uid': meta['uid'], 'controller': True, 'blockOwnerDeletion': True}],
            },
            'spec': template.get('spec') or {},
        }
        await self.kube.server.store_create(PODS, meta['namespace'], pod)

    async def _write_status(self, resource: kmock.resource, owner: Body,
                            status: dict[str, Any]) -> None:
        meta = owner['metadata']
        with contextlib.suppress(kmock.KubernetesError):
            await self.kube.server.store_update(resource, meta['namespace'], meta['name'],
                                                {'status': status}, patch_type='replace',
                                                subresource='status')

    @staticmethod
    def _keep_time(old: Mapping[str, Any], conditions: list[dict[str, Any]]) -> None:
        previous = {c.get('type'): c for c in old.get('conditions') or []}
        for condition in conditions:
            before = previous.get(condition['type'])
            if before is not None and before.get('status') == condition['status']:
                condition['lastTransitionTime'] = before.get('lastTransitionTime')

    async def _reconcile_job(self, job: Body) -> bool:
        """The Job controller: new pods from the template while fewer than ``parallelism``
        (default 1) are active and fewer than ``completions`` are active or succeeded, until
        ``completions`` (default 1) pods succeeded (condition
        ``Complete``) or more than ``backoffLimit`` (default 6) failed (condition ``Failed``,
        reason ``BackoffLimitExceeded``). Returns whether to keep watching."""
        spec, old = job.get('spec') or {}, job.get('status') or {}
        meta = job['metadata']
        if any(c.get('type') in ('Complete', 'Failed') and c.get('status') == 'True'
               for c in old.get('conditions') or []):
            return False
        pods = self._owned_pods(job)
        active = [p for p in pods if _phase(p) not in ('Succeeded', 'Failed')]
        succeeded = sum(_phase(p) == 'Succeeded' for p in pods)
        failed = sum(_phase(p) == 'Failed' for p in pods)
        now = now_rfc3339()
        conditions: list[dict[str, Any]] = []
        done = False
        if succeeded >= int(spec.get('completions') or 1):
            conditions = [{'type': t, 'status': 'True', 'reason': 'CompletionsReached',
                           'message': 'Reached expected number of succeeded pods',
                           'lastProbeTime': now, 'lastTransitionTime': now}
                          for t in ('SuccessCriteriaMet', 'Complete')]
            done = True
        elif failed > int(spec.get('backoffLimit', 6)):
            conditions = [{'type': t, 'status': 'True', 'reason': 'BackoffLimitExceeded',
                           'message': 'Job has reached the specified backoff limit',
                           'lastProbeTime': now, 'lastTransitionTime': now}
                          for t in ('FailureTarget', 'Failed')]
            for pod in active:
                with contextlib.suppress(kmock.KubernetesError):
                    await self.kube.server.store_delete(PODS, meta['namespace'],
                                                        pod['metadata']['name'])
            active, done = [], True
        elif not spec.get('suspend') and len(active) < min(
                int(spec.get('parallelism', 1)),
                int(spec.get('completions') or 1) - succeeded):
            await self._create_pod(job, 'batch/v1', f"{meta['name']}-", {
                'job-name': meta['name'], 'batch.kubernetes.io/job-name': meta['name'],
                'controller-uid': meta['uid'], 'batch.kubernetes.io/controller-uid': meta['uid']})
            return True  # the pod's ADDED event wakes us again
        status: dict[str, Any] = {'startTime': old.get('startTime') or now}
        counts = {'active': len(active), 'succeeded': succeeded, 'failed': failed,
                  'ready': sum(_is_ready(p) for p in active)}
        status.update({k: v for k, v in counts.items() if v})
        if done:
            status['conditions'] = conditions
            if succeeded and conditions[-1]['type'] == 'Complete':
                status['completionTime'] = now
        await self._write_status(JOBS, job, status)
        return not done

    async def _reconcile_deploy(self, deploy: Body) -> bool:
        """A minimal Deployment controller (no ReplicaSets): keeps ``spec.replicas`` pods of
        the current template (labelled ``pod-template-hash``, owned by the Deployment),
        replaces pods of an older template all at once, and reports replica counts,
        ``observedGeneration`` and the ``Available`` condition."""
        spec, meta = deploy.get('spec') or {}, deploy['metadata']
        template = json.dumps(spec.get('template') or {}, sort_keys=True)
        pod_hash = hashlib.sha256(template.encode()).hexdigest()[:10]
        replicas = int(spec.get('replicas', 1))
        current = []
        for pod in self._owned_pods(deploy):
            if (pod['metadata'].get('labels') or {}).get('pod-template-hash') == pod_hash:
                current.append(pod)
            else:
                with contextlib.suppress(kmock.KubernetesError):
                    await self.kube.server.store_delete(PODS, meta['namespace'],
                                                        pod['metadata']['name'])
        for pod in current[replicas:]:
            with contextlib.suppress(kmock.KubernetesError):
                await self.kube.server.store_delete(PODS, meta['namespace'],
                                                    pod['metadata']['name'])
        current = current[:replicas]
        for _ in range(replicas - len(current)):
            await self._create_pod(deploy, 'apps/v1', f"{meta['name']}-{pod_hash}-",
                                   {'pod-template-hash': pod_hash})
        ready = sum(_is_ready(p) for p in current)
        now = now_rfc3339()
        available = ready >= replicas
        conditions = [
            {'type': 'Available', 'status': 'True' if available else 'False',
             'reason': 'MinimumReplicasAvailable' if available else 'MinimumReplicasUnavailable',
             'lastUpdateTime': now, 'lastTransitionTime': now},
            {'type': 'Progressing', 'status': 'True', 'reason': 'NewReplicaSetAvailable'
             if available else 'ReplicaSetUpdated', 'lastUpdateTime': now,
             'lastTransitionTime': now},
        ]
        old = deploy.get('status') or {}
        self._keep_time(old, conditions)
        for condition, before in zip(conditions, old.get('conditions') or [], strict=False):
            if before.get('status') == condition['status'] \
                    and before.get('reason') == condition['reason']:
                condition['lastUpdateTime'] = before.get('lastUpdateTime')
        status: dict[str, Any] = {'observedGeneration': meta.get('generation', 1),
                                  'conditions': conditions}
        counts = {'replicas': len(current), 'updatedReplicas': len(current),
                  'readyReplicas': ready, 'availableReplicas': ready,
                  'unavailableReplicas': max(replicas - ready, 0)}
        status.update({k: v for k, v in counts.items() if v})
        await self._write_status(DEPLOYMENTS, deploy, status)
        return True


__all__ = ['FakeKubelet', 'allocate_pod_ip', 'expand']

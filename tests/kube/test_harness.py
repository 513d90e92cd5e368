"""Tests of the Kubernetes test harness: the emulator's extensions over stock kmock, seen
through the official ``kubernetes`` client and a real in-process kopf operator, and the fake
kubelet running pods, a Job and a Deployment as local processes."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import kmock
import kopf
import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from tests.kube.emulator import (
    KubeEmulator,
    merge_patch,
    parse_label_selector,
    parse_path,
    strategic_merge_patch,
)
from tests.kube.kubelet import FakeKubelet, expand

CPT_GROUP, CPT_VERSION, CPT_PLURAL = 'chunktune.dev', 'v1alpha1', 'chunkedprefilltunings'
PY = sys.executable


def make_crd(group: str, plural: str, kind: str, *, version: str = 'v1alpha1',
             short_names: tuple[str, ...] = (), namespaced: bool = True,
             status: bool = True) -> dict[str, Any]:
    return {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{plural}.{group}'},
        'spec': {
            'group': group, 'scope': 'Namespaced' if namespaced else 'Cluster',
            'names': {'plural': plural, 'singular': kind.lower(), 'kind': kind,
                      'shortNames': list(short_names)},
            'versions': [{
                'name': version, 'served': True, 'storage': True,
                'subresources': {'status': {}} if status else {},
                'schema': {'openAPIV3Schema': {
                    'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}},
            }],
        },
    }


CPT_CRD = make_crd(CPT_GROUP, CPT_PLURAL, 'ChunkedPrefillTuning', short_names=('cpt',))


@pytest.fixture()
def kube() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        yield emulator
        assert emulator.server_errors == []


@pytest.fixture()
def api(kube: KubeEmulator) -> Iterator[kubernetes.client.ApiClient]:
    client = kube.api_client()
    yield client
    client.close()


@pytest.fixture()
def core(api: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api)


@pytest.fixture()
def custom(api: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api)


@pytest.fixture()
def kubelet(kube: KubeEmulator) -> Iterator[FakeKubelet]:
    with FakeKubelet(kube) as instance:
        yield instance
        assert instance.errors == []


def _status(e: pytest.ExceptionInfo[ApiException]) -> int:
    return int(e.value.status)


# ---- pure helpers ----------------------------------------------------------------------------

def test_path_parsing_fixes_namespaces() -> None:
    assert parse_path('/api/v1/namespaces') == (kmock.resource('', 'v1', 'namespaces'),
                                                None, None, None)
    assert parse_path('/api/v1/namespaces/ns1') == (kmock.resource('', 'v1', 'namespaces'),
                                                    None, 'ns1', None)
    assert parse_path('/api/v1/namespaces/ns1/pods/p/log') == (
        kmock.resource('', 'v1', 'pods'), 'ns1', 'p', 'log')
    assert parse_path('/apis/batch/v1/namespaces/ns1/jobs/j/status')[1:] == ('ns1', 'j', 'status')


def test_patch_helpers() -> None:
    assert merge_patch({'a': {'b': 1}, 'c': 1}, {'a': 5, 'c': None}) == {'a': 5}
    pod = {'spec': {'containers': [{'name': 'a', 'image': 'x'}, {'name': 'b', 'image': 'y'}]},
           'metadata': {'finalizers': ['f1']}}
    patched = strategic_merge_patch(pod, {
        'spec': {'containers': [{'name': 'b', 'image': 'z'}, {'name': 'c', 'image': 'w'}]},
        'metadata': {'finalizers': ['f2'], '$deleteFromPrimitiveList/finalizers': ['f1']}})
    assert patched['spec']['containers'] == [
        {'name': 'a', 'image': 'x'}, {'name': 'b', 'image': 'z'}, {'name': 'c', 'image': 'w'}]
    assert patched['metadata']['finalizers'] == ['f2']
    assert [r.op for r in parse_label_selector('a=1,b!=2,c in (x, y),d notin (z),e,!f')] == [
        '=', '!=', 'in', 'notin', 'exists', '!']


def test_env_expansion_like_the_kubelet() -> None:
    env = {'A': 'x', 'B': 'y'}
    assert expand('$(A)-$(B)', env) == 'x-y'
    assert expand('$$(A) $(MISSING) $A $(A', env) == '$(A) $(MISSING) $A $(A'


# ---- the emulator through the official client -------------------------------------------------

def test_discovery_and_namespaces(kube: KubeEmulator, api: kubernetes.client.ApiClient,
                                  core: kubernetes.client.CoreV1Api) -> None:
    names = {ns.metadata.name for ns in core.list_namespace().items}  # kmock 0.8: HTTP 500
    assert names == {'default'}
    assert core.read_namespace('default').status.phase == 'Active'
    resources = {r.name: r for r in core.get_api_resources().resources}
    assert {'pods', 'pods/status', 'pods/log', 'events', 'configmaps', 'secrets', 'services',
            'namespaces'} <= set(resources)
    assert resources['namespaces'].namespaced is False
    groups = {g.name for g in kubernetes.client.ApisApi(api).get_api_versions().groups}
    assert {'apps', 'batch', 'events.k8s.io', 'apiextensions.k8s.io'} <= groups
    batch = kubernetes.client.BatchV1Api(api).get_api_resources().resources
    assert {'jobs', 'jobs/status'} <= {r.name for r in batch}
    assert kube.kubeconfig_path.read_text().count(kube.url) == 1
    event = kubernetes.client.EventsV1Api(api).create_namespaced_event('default', {
        'metadata': {'generateName': 'e-'}, 'reason': 'Tested', 'action': 'Test',
        'eventTime': '2026-01-01T00:00:00.000000Z', 'reportingController': 'tests',
        'reportingInstance': 'tests', 'type': 'Normal'})
    assert event.metadata.name.startswith('e-') and event.reason == 'Tested'


def test_server_side_metadata(kube: KubeEmulator, core: kubernetes.client.CoreV1Api) -> None:
    body = {'metadata': {'generateName': 'cm-'}, 'data': {'a': '1'}}
    first = core.create_namespaced_config_map('default', body)
    second = core.create_namespaced_config_map('default', body)  # kmock 0.8: 409
    assert first.metadata.name != second.metadata.name
    assert first.metadata.name.startswith('cm-') and len(first.metadata.name) == 8
    assert first.metadata.namespace == 'default'  # from the URL, not the body
    assert first.metadata.uid and first.metadata.uid != second.metadata.uid
    assert first.metadata.creation_timestamp is not None
    assert first.metadata.generation == 1
    patched = core.patch_namespaced_config_map(first.metadata.name, 'default',
                                               {'data': {'b': '2'}})
    assert int(patched.metadata.resource_version) > int(second.metadata.resource_version)
    assert patched.data == {'a': '1', 'b': '2'}
    again = core.patch_namespaced_config_map(first.metadata.name, 'default',
                                             {'data': {'b': '2'}})
    assert again.metadata.resource_version == patched.metadata.resource_version  # a no-op
    with pytest.raises(ApiException) as e:
        core.create_namespaced_config_map('default', {'metadata': {'name': first.metadata.name}})
    assert _status(e) == 409


def test_put_replaces_with_optimistic_concurrency(core: kubernetes.client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map('default', {'metadata': {'name': 'c'},
                                                       'data': {'a': '1', 'b': '2'}})
    cm.data = {'c': '3'}
    replaced = core.replace_namespaced_config_map('c', 'default', cm)  # kmock 0.8: 404
    assert replaced.data == {'c': '3'}
    assert replaced.metadata.uid == cm.metadata.uid
    cm.data = {'d': '4'}  # still the old resourceVersion
    with pytest.raises(ApiException) as e:
        core.replace_namespaced_config_map('c', 'default', cm)
    assert _status(e) == 409


def test_json_patch_test_op_and_strategic_merge(core: kubernetes.client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map('default', {'metadata': {'name': 'c'}})
    rv = cm.metadata.resource_version
    ops = [{'op': 'test', 'path': '/metadata/resourceVersion', 'value': rv},
           {'op': 'add', 'path': '/metadata/finalizers', 'value': ['x/y']}]
    patched = core.patch_namespaced_config_map('c', 'default', ops)
    assert patched.metadata.finalizers == ['x/y']
    with pytest.raises(ApiException) as e:  # the same test op, now stale: kopf expects 422
        core.patch_namespaced_config_map('c', 'default', ops)
    assert _status(e) == 422
    pod = core.create_namespaced_pod('default', {'metadata': {'name': 'p'}, 'spec': {
        'containers': [{'name': 'a', 'image': 'i', 'env': [{'name': 'X', 'value': '1'}]}]}})
    assert pod.status.phase == 'Pending'
    patched_pod = core.patch_namespaced_pod('p', 'default', {'spec': {'containers': [
        {'name': 'a', 'env': [{'name': 'Y', 'value': '2'}]}]}})  # strategic: merged by name
    container = patched_pod.spec.containers[0]
    assert container.image == 'i'
    assert [(v.name, v.value) for v in container.env] == [('X', '1'), ('Y', '2')]
    assert patched_pod.metadata.generation == 2


def test_crd_hook_generation_and_status_subresource(
        kube: KubeEmulator, api: kubernetes.client.ApiClient,
        custom: kubernetes.client.CustomObjectsApi) -> None:
    ext = kubernetes.client.ApiextensionsV1Api(api)
    crd = ext.create_custom_resource_definition(CPT_CRD)
    assert any(c.type == 'Established' and c.status == 'True' for c in crd.status.conditions)
    found = custom.get_api_resources(CPT_GROUP, CPT_VERSION).resources
    assert {(r.name, r.kind, r.namespaced, tuple(r.short_names or ())) for r in found} >= {
        (CPT_PLURAL, 'ChunkedPrefillTuning', True, ('cpt',)),
        (f'{CPT_PLURAL}/status', 'ChunkedPrefillTuning', True, ())}
    args = (CPT_GROUP, CPT_VERSION, 'default', CPT_PLURAL)
    obj = custom.create_namespaced_custom_object(*args, {
        'apiVersion': f'{CPT_GROUP}/{CPT_VERSION}', 'kind': 'ChunkedPrefillTuning',
        'metadata': {'name': 't'}, 'spec': {'trials': 3}, 'status': {'phase': 'Bogus'}})
    assert 'status' not in obj and obj['metadata']['generation'] == 1
    obj = custom.patch_namespaced_custom_object_status(*args, 't', {'status': {'phase': 'Run'}})
    assert obj['status'] == {'phase': 'Run'} and obj['metadata']['generation'] == 1
    obj = custom.patch_namespaced_custom_object(*args, 't', {
        'spec': {'trials': 5}, 'status': {'phase': 'Ignored'}})
    assert obj['status'] == {'phase': 'Run'} and obj['metadata']['generation'] == 2
    obj = custom.patch_namespaced_custom_object(*args, 't', {'metadata': {'labels': {'a': 'b'}}})
    assert obj['metadata']['generation'] == 2  # metadata-only change
    obj = custom.patch_namespaced_custom_object_status(*args, 't', {
        'spec': {'trials': 99}, 'status': {'phase': 'Done'}})
    assert obj['spec'] == {'trials': 5} and obj['metadata']['generation'] == 2
    with pytest.raises(ApiException) as e:  # CRs take no strategic merge patches
        custom.patch_namespaced_custom_object(
            *args, 't', {'spec': {}}, _content_type='application/strategic-merge-patch+json')
    assert _status(e) == 415
    assert kube.get('cpt', 'default', 't')['status'] == {'phase': 'Done'}
    ext.delete_custom_resource_definition(CPT_CRD['metadata']['name'])
    kube.wait_for(lambda: kube.get('crd', None, CPT_CRD['metadata']['name']) is None)
    with pytest.raises(ApiException) as e:
        custom.list_namespaced_custom_object(*args)
    assert _status(e) == 404  # the resource is gone with its CRD (and so are its objects)


def test_cluster_scoped_crd_without_status(kube: KubeEmulator,
                                           custom: kubernetes.client.CustomObjectsApi) -> None:
    kube.create('crd', make_crd('example.com', 'widgets', 'Widget', version='v1',
                                namespaced=False, status=False))
    obj = custom.create_cluster_custom_object('example.com', 'v1', 'widgets', {
        'apiVersion': 'example.com/v1', 'kind': 'Widget', 'metadata': {'name': 'w'},
        'status': {'kept': True}})
    assert obj['status'] == {'kept': True} and 'namespace' not in obj['metadata']
    obj = custom.patch_cluster_custom_object('example.com', 'v1', 'widgets', 'w',
                                             {'status': {'kept': False}})
    assert obj['status'] == {'kept': False}  # no status subresource: the main body has it


def test_finalizers_and_deletion_timestamp(kube: KubeEmulator,
                                           core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_config_map('default', {'metadata': {'name': 'c',
                                                               'finalizers': ['a/b']}})
    core.delete_namespaced_config_map('c', 'default')
    cm = core.read_namespaced_config_map('c', 'default')
    assert cm.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as e:
        core.patch_namespaced_config_map('c', 'default', {'metadata': {'finalizers': ['a/b',
                                                                                     'c/d']}})
    assert _status(e) == 422
    core.patch_namespaced_config_map('c', 'default', [
        {'op': 'remove', 'path': '/metadata/finalizers/0'}])
    with pytest.raises(ApiException) as e:
        core.read_namespaced_config_map('c', 'default')
    assert _status(e) == 404
    assert kube.get('configmaps', 'default', 'c') is None


def test_label_and_field_selectors(kube: KubeEmulator, core: kubernetes.client.CoreV1Api) -> None:
    kube.create('namespaces', {'metadata': {'name': 'other'}})
    for ns, name, labels in [('default', 'a', {'app': 'x', 'tier': 'web'}),
                             ('default', 'b', {'app': 'y'}), ('default', 'c', {}),
                             ('other', 'd', {'app': 'x'})]:
        kube.create('configmaps', {'metadata': {'name': name, 'labels': labels}}, ns)

    def names(selector: str = '', fields: str = '', ns: str | None = 'default') -> set[str]:
        items = (core.list_namespaced_config_map(ns, label_selector=selector,
                                                 field_selector=fields) if ns else
                 core.list_config_map_for_all_namespaces(label_selector=selector,
                                                         field_selector=fields))
        return {cm.metadata.name for cm in items.items}

    assert names('app=x') == {'a'}
    assert names('app==x', ns=None) == {'a', 'd'}
    assert names('app in (x, y)') == {'a', 'b'}
    assert names('app notin (x)') == {'b', 'c'}
    assert names('app!=x') == {'b', 'c'}
    assert names('app') == {'a', 'b'}
    assert names('!app') == {'c'}
    assert names('app=x,tier=web') == {'a'}
    assert names(fields='metadata.name=b') == {'b'}
    assert names(fields='metadata.namespace=other', ns=None) == {'d'}
    assert names('app=x', fields='metadata.namespace!=default', ns=None) == {'d'}
    with pytest.raises(ApiException) as e:
        names('app in x')
    assert _status(e) == 400
    core.delete_collection_namespaced_config_map('default', label_selector='app in (x, y)')
    assert names(ns=None) == {'c', 'd'}


def test_watch_selectors_resume_and_timeout(kube: KubeEmulator,
                                            core: kubernetes.client.CoreV1Api) -> None:
    kube.create('configmaps', {'metadata': {'name': 'old', 'labels': {'w': '1'}}}, 'default')
    rv = core.list_namespaced_config_map('default').metadata.resource_version
    kube.create('configmaps', {'metadata': {'name': 'new', 'labels': {'w': '1'}}}, 'default')
    kube.create('configmaps', {'metadata': {'name': 'other'}}, 'default')
    kube.patch('configmaps', 'default', 'old', {'metadata': {'labels': {'w': None}}})
    start = time.monotonic()
    events = [(e['type'], e['object'].metadata.name) for e in kubernetes.watch.Watch().stream(
        core.list_namespaced_config_map, 'default', label_selector='w=1',
        resource_version=rv, timeout_seconds=1)]
    assert events == [('ADDED', 'new'), ('DELETED', 'old')]  # left the selector: DELETED
    assert 0.9 < time.monotonic() - start < 30  # ends at timeoutSeconds, not never
    fresh = [(e['type'], e['object'].metadata.name) for e in kubernetes.watch.Watch().stream(
        core.list_namespaced_config_map, 'default', field_selector='metadata.name=other',
        timeout_seconds=1)]
    assert fresh == [('ADDED', 'other')]
    url = (f'{kube.url}/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1'
           '&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&fieldSelector='
           'metadata.name%3Dnew')
    with urllib.request.urlopen(url) as stream:
        assert stream.headers['Content-Type'].startswith('application/json')
        lines = [json.loads(line) for line in stream.read().splitlines()]
    assert [line['type'] for line in lines] == ['ADDED', 'BOOKMARK']
    assert lines[1]['object']['metadata']['annotations'] == {'k8s.io/initial-events-end': 'true'}
    kube.server.event_log_limit = 1
    for i in range(3):
        kube.create('configmaps', {'metadata': {'name': f'x{i}'}}, 'default')
    response = core.list_namespaced_config_map('default', watch=True, resource_version=rv,
                                               timeout_seconds=1, _preload_content=False)
    assert b'"code": 410' in response.read()


def test_garbage_collection_by_owner_references(kube: KubeEmulator,
                                                core: kubernetes.client.CoreV1Api) -> None:
    owner = kube.create('configmaps', {'metadata': {'name': 'owner'}}, 'default')
    other = kube.create('configmaps', {'metadata': {'name': 'other'}}, 'default')

    def ref(obj: dict[str, Any]) -> dict[str, Any]:
        return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': obj['metadata']['name'],
                'uid': obj['metadata']['uid']}

    kube.create('configmaps', {'metadata': {'name': 'child', 'ownerReferences': [ref(owner)]}},
                'default')
    kube.create('pods', {'metadata': {'name': 'grandchild', 'ownerReferences': [
        ref(kube.get('configmaps', 'default', 'child') or {})]}, 'spec': {}}, 'default')
    kube.create('configmaps', {'metadata': {'name': 'shared', 'ownerReferences': [
        ref(owner), ref(other)]}}, 'default')
    core.delete_namespaced_config_map('owner', 'default')
    kube.wait_for(lambda: kube.get('pods', 'default', 'grandchild') is None, message='cascade')
    assert kube.get('configmaps', 'default', 'child') is None
    shared = kube.get('configmaps', 'default', 'shared') or {}
    assert [r['name'] for r in shared['metadata']['ownerReferences']] == ['other']
    core.delete_namespaced_config_map('other', 'default', propagation_policy='Orphan')
    kube.wait_for(lambda: 'ownerReferences' not in (
        kube.get('configmaps', 'default', 'shared') or {'metadata': {}})['metadata'])
    assert kube.get('configmaps', 'default', 'shared') is not None


def test_namespace_deletion_deletes_its_contents(kube: KubeEmulator,
                                                 core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespace({'metadata': {'name': 'doomed'}})
    core.create_namespaced_secret('doomed', {'metadata': {'name': 's'},
                                             'string_data': {'k': 'v'}})
    assert kube.get('secrets', 'doomed', 's')['data'] == {'k': 'dg=='}
    kube.create('configmaps', {'metadata': {'name': 'c', 'finalizers': ['x/y']}}, 'doomed')
    core.delete_namespace('doomed')
    assert core.read_namespace('doomed').status.phase == 'Terminating'
    kube.wait_for(lambda: kube.get('secrets', 'doomed', 's') is None)
    assert kube.get('namespaces', None, 'doomed') is not None  # waits for the finalizer
    kube.patch('configmaps', 'doomed', 'c', {'metadata': {'finalizers': None}})
    kube.wait_for(lambda: kube.get('namespaces', None, 'doomed') is None)


def test_pod_log_subresource(kube: KubeEmulator, core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_pod('default', {'metadata': {'name': 'p'}, 'spec': {
        'containers': [{'name': 'main', 'image': 'i'}]}})
    kube.set_pod_log('default', 'p', 'one\ntwo\nthree\n')
    assert core.read_namespaced_pod_log('p', 'default') == 'one\ntwo\nthree\n'
    assert core.read_namespaced_pod_log('p', 'default', tail_lines=2) == 'two\nthree\n'
    assert core.read_namespaced_pod_log('p', 'default', container='main', limit_bytes=3) == 'one'
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod_log('absent', 'default')
    assert _status(e) == 404


def test_request_history_is_trimmed(kube: KubeEmulator) -> None:
    url = f'{kube.url}/api/v1/namespaces/default'

    def per_request() -> float:
        """Seconds per GET, the best of five batches of 20 (a busy machine's spikes aside)."""
        best = float('inf')
        for _ in range(5):
            start = time.monotonic()
            for _ in range(20):
                urllib.request.urlopen(url).read()
            best = min(best, (time.monotonic() - start) / 20)
        return best

    early = per_request()  # 60 requests in the history
    for _ in range(kube.server.history_limit + 50):
        urllib.request.urlopen(url).read()
    assert len(list(kube.server)) <= kube.server.history_limit
    # An untrimmed history made every request scan it (22 ms a GET after 300 requests): a GET
    # now costs about what it did with a short history, on this machine, in this test (with
    # room for a busy 2-core machine: the untrimmed history cost 10-20 times more).
    late = per_request()
    assert late < 3 * early + 0.005, (late, early)


def test_emulators_side_by_side_stop_in_any_order() -> None:
    first, second = KubeEmulator().start(), KubeEmulator().start()
    assert first.url != second.url
    first.stop()  # kmock's own Server refuses this order ("resolver chain is inconsistent")
    second.stop()


def test_user_reactions_take_precedence(kube: KubeEmulator,
                                        core: kubernetes.client.CoreV1Api) -> None:
    kube.server['post', kmock.resource('', 'v1', 'configmaps')] << 503
    with pytest.raises(ApiException) as e:
        core.create_namespaced_config_map('default', {'metadata': {'name': 'c'}})
    assert _status(e) == 503
    assert kube.get('configmaps', 'default', 'c') is None  # an intercepted write changes nothing


def test_injected_faults_answer_instead_of_the_server(kube: KubeEmulator,
                                                     core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_config_map('default', {'metadata': {'name': 'c'}})
    conflicts = kube.add_fault(status=409, reason='Conflict', method='PATCH',
                               resource='configmaps', times=2, retry_after=1)
    for _ in range(2):
        with pytest.raises(ApiException) as e:
            core.patch_namespaced_config_map('c', 'default', {'data': {'k': 'v'}})
        assert _status(e) == 409
        assert e.value.headers['Retry-After'] == '1'
        assert json.loads(e.value.body)['reason'] == 'Conflict'
    assert kube.get('configmaps', 'default', 'c').get('data') is None  # nothing was written
    assert conflicts.hits == 2
    core.patch_namespaced_config_map('c', 'default', {'data': {'k': 'v'}})  # spent: served
    assert kube.get('configmaps', 'default', 'c')['data'] == {'k': 'v'}

    outage = kube.add_fault(status=0)  # every request: the connection drops, no answer
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f'{kube.url}/api/v1/namespaces/default/configmaps/c', timeout=5)
    kube.remove_fault(outage)
    assert core.read_namespaced_config_map('c', 'default').data == {'k': 'v'}
    assert outage.hits == 1 and kube.server_errors == []


@pytest.mark.skipif(shutil.which('kubectl') is None, reason='no kubectl')
def test_kubectl_reads_and_writes(kube: KubeEmulator) -> None:
    def kubectl(*args: str) -> str:
        return subprocess.run(['kubectl', f'--kubeconfig={kube.kubeconfig_path}', *args],
                              check=True, capture_output=True, text=True, timeout=20).stdout

    kube.create('crd', CPT_CRD)
    kube.create('cpt', {'metadata': {'name': 'k'}, 'spec': {'trials': 1}}, 'default')
    assert 'k' in kubectl('get', 'cpt', '-o', 'name')
    kubectl('patch', 'cpt', 'k', '--type=merge', '-p', '{"spec": {"trials": 2}}')
    assert kube.get('cpt', 'default', 'k')['spec'] == {'trials': 2}
    kubectl('delete', 'cpt', 'k', '--wait=false')
    assert kube.get('cpt', 'default', 'k') is None


# ---- a real kopf operator against the emulator ------------------------------------------------

@pytest.mark.asyncio
async def test_kopf_operator_lifecycle(kube: KubeEmulator) -> None:
    registry = kopf.OperatorRegistry()
    seen: list[str] = []
    ticks: list[int] = []
    core = kubernetes.client.CoreV1Api(kube.api_client())
    res = (CPT_GROUP, CPT_VERSION, CPT_PLURAL)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=kube.url, token=kube.token)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = 30
        settings.posting.level = logging.INFO

    @kopf.on.create(*res, id='created', registry=registry)
    def created(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> str:
        seen.append('create')
        child = {'metadata': {'name': f"{body['metadata']['name']}-child"}, 'data': {'a': '1'}}
        kopf.adopt(child, owner=body)
        core.create_namespaced_config_map(body['metadata']['namespace'], child)
        patch.status['phase'] = 'Running'
        kopf.info(body, reason='Created', message=f"trials={spec['trials']}")
        return 'done'

    @kopf.on.update(*res, field='spec.trials', registry=registry)
    def updated(old: Any, new: Any, **_: Any) -> None:
        seen.append(f'update {old}->{new}')

    @kopf.on.delete(*res, registry=registry)
    def deleted(**_: Any) -> None:
        seen.append('delete')

    @kopf.daemon(*res, registry=registry, cancellation_timeout=5)
    async def ticker(stopped: kopf.DaemonStopped, **_: Any) -> None:
        while not stopped:
            ticks.append(1)
            await stopped.wait(0.05)

    kube.create('crd', CPT_CRD)
    stop = asyncio.Event()
    operator = asyncio.create_task(kopf.operator(
        registry=registry, clusterwide=True, standalone=True, stop_flag=stop))
    try:
        kube.create('cpt', {'metadata': {'name': 't'}, 'spec': {'trials': 1}}, 'default')
        obj = await kube.until(lambda: (o := kube.get('cpt', 'default', 't')) and
                               (o.get('status') or {}).get('phase') == 'Running' and o,
                               message='status patched by the create handler')
        assert obj['status']['created'] == 'done'
        assert obj['metadata']['finalizers'] == ['kopf.zalando.org/KopfFinalizerMarker']
        child = kube.get('configmaps', 'default', 't-child') or {}
        assert child['metadata']['ownerReferences'][0]['uid'] == obj['metadata']['uid']
        await kube.until(lambda: any(e.get('reason') == 'Created'
                                     for e in kube.objects('v1/events', 'default')))
        await kube.until(lambda: len(ticks) >= 3, message='daemon ticks')
        kube.patch('cpt', 'default', 't', {'spec': {'trials': 2}})
        await kube.until(lambda: 'update 1->2' in seen, message='update handler')
        kube.delete('cpt', 'default', 't')
        await kube.until(lambda: kube.get('cpt', 'default', 't') is None, message='finalizer')
        await kube.until(lambda: kube.get('configmaps', 'default', 't-child') is None,
                         message='garbage collection of the adopted child')
        assert seen == ['create', 'update 1->2', 'delete']
    finally:
        stop.set()
        await asyncio.wait_for(operator, 10)
        core.api_client.close()


# ---- the fake kubelet -------------------------------------------------------------------------

def _port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def test_kubelet_runs_a_server_with_a_readiness_probe(
        kube: KubeEmulator, kubelet: FakeKubelet, core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_pod('default', {'metadata': {'name': 'web'}, 'spec': {'containers': [{
        'name': 'web', 'image': 'python', 'command': ['python', '-m', 'http.server'],
        'args': ['$(PORT)', '--bind', '0.0.0.0'],
        'env': [{'name': 'PORT', 'value': '8000'}],
        'ports': [{'name': 'http', 'containerPort': 8000}],
        'readinessProbe': {'httpGet': {'port': 'http', 'path': '/'}, 'periodSeconds': 10}}]}})
    # A deadline, not a duration: starting Python takes seconds on a busy machine.
    kube.wait_for(lambda: kubelet.is_ready('default', 'web'), timeout=60, message='pod ready')
    pod = core.read_namespaced_pod('web', 'default')
    ip = pod.status.pod_ip
    assert ip.startswith('127.0.') and ip != '127.0.0.1' and all(
        int(part) >= 1 for part in ip.split('.')[2:])
    assert pod.status.phase == 'Running'
    assert pod.status.container_statuses[0].ready is True
    assert pod.status.container_statuses[0].state.running is not None
    with urllib.request.urlopen(f'http://{ip}:8000/', timeout=5) as response:
        assert response.status == 200
    assert not _port_open('127.0.0.1', 8000)  # bound to the pod IP, not to every address
    kube.wait_for(lambda: 'GET / ' in core.read_namespaced_pod_log('web', 'default'))
    core.delete_namespaced_pod('web', 'default')
    kube.wait_for(lambda: not _port_open(ip, 8000), message='process killed')


def test_kubelet_reports_a_failing_container(kube: KubeEmulator, kubelet: FakeKubelet,
                                            core: kubernetes.client.CoreV1Api) -> None:
    kube.create('secrets', {'metadata': {'name': 's'}, 'stringData': {'token': 'sekret'}},
                'default')
    script = ('import os, sys; print(os.environ["NAME"], os.environ["NS"], os.environ["IP"],'
              ' os.environ["TOKEN"], sys.argv[1]); sys.exit("boom: $(NAME) failed")')
    core.create_namespaced_pod('default', {'metadata': {'name': 'bad'}, 'spec': {
        'restartPolicy': 'Never', 'containers': [{
            'name': 'c', 'image': 'python', 'command': [PY, '-c', script], 'args': ['$(NAME)'],
            'env': [
                {'name': 'NAME', 'valueFrom': {'fieldRef': {'fieldPath': 'metadata.name'}}},
                {'name': 'NS', 'valueFrom': {'fieldRef': {'fieldPath': 'metadata.namespace'}}},
                {'name': 'IP', 'valueFrom': {'fieldRef': {'fieldPath': 'status.podIP'}}},
                {'name': 'TOKEN', 'valueFrom': {'secretKeyRef': {'name': 's', 'key': 'token'}}},
            ]}]}})
    kube.wait_for(lambda: kubelet.phase('default', 'bad') == 'Failed', message='pod failed')
    pod = core.read_namespaced_pod('bad', 'default')
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (1, 'Error')
    assert 'boom: bad failed' in terminated.message
    log = core.read_namespaced_pod_log('bad', 'default')
    assert log.splitlines() == [f'bad default {pod.status.pod_ip} sekret bad', 'boom: bad failed']


def test_kubelet_mounts_configmap_secret_and_emptydir_volumes(
        kube: KubeEmulator, kubelet: FakeKubelet) -> None:
    kube.create('configmaps', {'metadata': {'name': 'cfg'}, 'data': {'a.yaml': 'x: 1\n',
                                                                     'b': 'B'}}, 'default')
    kube.create('secrets', {'metadata': {'name': 'sec'}, 'stringData': {'token': 's3'}},
                'default')
    script = ('import os, sys; d = os.environ["OUT"]; open(d + "/w", "w").write("ok"); '
              'print(open(sys.argv[1]).read().strip(), open(sys.argv[2]).read(), '
              'open(sys.argv[3]).read(), open(d + "/w").read())')
    kube.create('pods', {'metadata': {'name': 'v'}, 'spec': {'containers': [{
        'name': 'c', 'image': 'python', 'command': [PY, '-c', script],
        'args': ['/etc/cfg/a.yaml', '/etc/cfg/renamed', '/etc/sec/token'],
        'env': [{'name': 'OUT', 'value': '/scratch'}],
        'volumeMounts': [{'name': 'cfg', 'mountPath': '/etc/cfg', 'readOnly': True},
                         {'name': 'sec', 'mountPath': '/etc/sec'},
                         {'name': 'scratch', 'mountPath': '/scratch'}]}],
        'volumes': [
            {'name': 'cfg', 'configMap': {'name': 'cfg', 'items': [
                {'key': 'a.yaml', 'path': 'a.yaml'}, {'key': 'b', 'path': 'renamed'}]}},
            {'name': 'sec', 'secret': {'secretName': 'sec'}},
            {'name': 'scratch', 'emptyDir': {}}]}}, 'default')
    kube.wait_for(lambda: kubelet.phase('default', 'v') == 'Succeeded', message='pod done')
    assert kube.pod_log('default', 'v') == 'x: 1 B s3 ok\n'


def test_kubelet_image_entrypoints(kube: KubeEmulator) -> None:
    script = 'import sys; print(" ".join(sys.argv[1:]))'
    with FakeKubelet(kube, entrypoints={'example.com/echo': [PY, '-c', script]}) as kubelet:
        kube.create('pods', {'metadata': {'name': 'e'}, 'spec': {'containers': [{
            'name': 'c', 'image': 'example.com/echo:1.2', 'args': ['--port', '$(P)'],
            'env': [{'name': 'P', 'value': '80'}]}]}}, 'default')
        kube.create('pods', {'metadata': {'name': 'n'}, 'spec': {'containers': [{
            'name': 'c', 'image': 'unknown'}]}}, 'default')
        kube.wait_for(lambda: kubelet.phase('default', 'e') == 'Succeeded')
        assert kube.pod_log('default', 'e') == '--port 80\n'
        kube.wait_for(lambda: kubelet.phase('default', 'n') == 'Failed')
        pod = kube.get('pods', 'default', 'n') or {}
        assert pod['status']['containerStatuses'][0]['state']['terminated']['reason'] == \
            'StartError'
        assert kubelet.errors == []


def test_kubelet_plays_the_job_controller(kube: KubeEmulator, kubelet: FakeKubelet,
                                          api: kubernetes.client.ApiClient,
                                          core: kubernetes.client.CoreV1Api) -> None:
    batch = kubernetes.client.BatchV1Api(api)

    def job(name: str, code: int) -> dict[str, Any]:
        return {'metadata': {'name': name}, 'spec': {'backoffLimit': 1, 'template': {
            'metadata': {'labels': {'app': name}}, 'spec': {'restartPolicy': 'Never',
                                                            'containers': [{
                'name': 'c', 'image': 'python',
                'command': [PY, '-c', f'print("job {name}"); raise SystemExit({code})']}]}}}}

    batch.create_namespaced_job('default', job('ok', 0))
    batch.create_namespaced_job('default', job('ko', 3))
    done = kube.wait_for(lambda: (j := batch.read_namespaced_job_status('ok', 'default'))
                         .status.succeeded and j, message='job complete')
    assert {c.type for c in done.status.conditions} >= {'Complete'}
    assert done.status.completion_time is not None
    pods = core.list_namespaced_pod('default', label_selector='job-name=ok').items
    assert len(pods) == 1 and pods[0].metadata.name.startswith('ok-')
    assert pods[0].metadata.labels['app'] == 'ok'
    assert pods[0].metadata.owner_references[0].uid == done.metadata.uid
    assert core.read_namespaced_pod_log(pods[0].metadata.name, 'default') == 'job ok\n'
    failed = kube.wait_for(lambda: (j := batch.read_namespaced_job_status('ko', 'default'))
                           .status.conditions and j, message='job failed')
    assert [c.reason for c in failed.status.conditions if c.type == 'Failed'] == [
        'BackoffLimitExceeded']
    assert failed.status.failed == 2  # backoffLimit=1: two pods
    batch.delete_namespaced_job('ok', 'default')
    kube.wait_for(lambda: not kube.objects('pods', 'default', label_selector='job-name=ok'))


def test_kubelet_plays_a_minimal_deployment_controller(
        kube: KubeEmulator, kubelet: FakeKubelet, api: kubernetes.client.ApiClient) -> None:
    apps = kubernetes.client.AppsV1Api(api)
    apps.create_namespaced_deployment('default', {'metadata': {'name': 'd'}, 'spec': {
        'replicas': 2, 'selector': {'matchLabels': {'app': 'd'}}, 'template': {
            'metadata': {'labels': {'app': 'd'}}, 'spec': {'containers': [{
                'name': 'c', 'image': 'python',
                'command': [PY, '-c', 'import time; time.sleep(60)']}]}}}})
    status = kube.wait_for(lambda: (d := apps.read_namespaced_deployment_status('d', 'default'))
                           .status.ready_replicas == 2 and d.status, message='2 ready replicas')
    assert status.available_replicas == 2 and status.observed_generation == 1
    ips = {p['status']['podIP'] for p in kube.objects('pods', 'default', label_selector='app=d')}
    assert len(ips) == 2
    apps.patch_namespaced_deployment('d', 'default', {'spec': {'replicas': 1}})
    kube.wait_for(lambda: len(kube.objects('pods', 'default', label_selector='app=d')) == 1)
    apps.delete_namespaced_deployment('d', 'default')
    kube.wait_for(lambda: not kube.objects('pods', 'default', label_selector='app=d'))


def test_kubelet_capacity_leaves_pods_unschedulable_until_one_ends(
        kube: KubeEmulator, core: kubernetes.client.CoreV1Api) -> None:
    def pod(name: str, gpus: int, seconds: float) -> dict[str, Any]:
        return {'metadata': {'name': name}, 'spec': {'containers': [{
            'name': 'c', 'image': 'python', 'resources': {'limits': {'nvidia.com/gpu': str(gpus)}},
            'command': [PY, '-c', f'import time; time.sleep({seconds})']}]}}

    with FakeKubelet(kube, capacity={'nvidia.com/gpu': 2}) as kubelet:
        core.create_namespaced_pod('default', pod('a', 1, 60))
        core.create_namespaced_pod('default', pod('b', 1, 0.2))
        core.create_namespaced_pod('default', pod('c', 2, 0))   # waits for both
        core.create_namespaced_pod('default', pod('d', 1, 60))  # fits once b ends
        kube.wait_for(lambda: kubelet.phase('default', 'd') == 'Running', timeout=20,
                      message='d bound when b ended')
        c = kube.get('pods', 'default', 'c')
        assert c['status']['phase'] == 'Pending'
        [cond] = c['status']['conditions']
        assert (cond['type'], cond['status'], cond['reason']) == (
            'PodScheduled', 'False', 'Unschedulable')
        assert cond['message'].startswith('0/1 nodes are available: 1 Insufficient '
                                          'nvidia.com/gpu.')
        assert kubelet.phase('default', 'b') == 'Succeeded'
        core.delete_namespaced_pod('a', 'default')
        core.delete_namespaced_pod('d', 'default')
        kube.wait_for(lambda: kubelet.phase('default', 'c') == 'Succeeded', timeout=20,
                      message='c bound and run once a and d are gone')
        scheduled = [x for x in kube.get('pods', 'default', 'c')['status']['conditions']
                     if x['type'] == 'PodScheduled']
        assert scheduled[0]['status'] == 'True'
        assert kubelet.errors == []


def test_leases_serve_leader_election(kube: KubeEmulator,
                                      api: kubernetes.client.ApiClient) -> None:
    coord = kubernetes.client.CoordinationV1Api(api)
    body = {'metadata': {'name': 'op'}, 'spec': {'holderIdentity': 'a',
                                                 'leaseDurationSeconds': 15}}
    lease = coord.create_namespaced_lease('default', body)
    with pytest.raises(ApiException) as exists:
        coord.create_namespaced_lease('default', body)
    assert _status(exists) == 409
    stale = lease.metadata.resource_version
    lease.spec.holder_identity = 'b'
    coord.replace_namespaced_lease('op', 'default', lease)
    lease.spec.holder_identity = 'c'
    lease.metadata.resource_version = stale
    with pytest.raises(ApiException) as conflict:  # the loser of a race sees a 409
        coord.replace_namespaced_lease('op', 'default', lease)
    assert _status(conflict) == 409
    assert coord.read_namespaced_lease('op', 'default').spec.holder_identity == 'b'

"""The fake node's capacity, as the scheduler sees it: which pods fit, and what it says of those
that do not.

:class:`NodeCapacity` holds the node's allocatable resources (``{'nvidia.com/gpu': 4}``, or
``cpu``/``memory`` quantities) and what the pods bound to it request. A pod's request of a
resource is the sum over its containers of ``resources.requests``, or ``resources.limits``
where no request is given (the API server defaults a missing request to the limit; extended
resources such as ``nvidia.com/gpu`` are given as limits). Only the resources named in the
capacity are counted: a node with ``{'nvidia.com/gpu': 4}`` never runs out of CPU.

A pod that does not fit stays ``Pending`` with the condition the real scheduler writes::

    {'type': 'PodScheduled', 'status': 'False', 'reason': 'Unschedulable',
     'message': '0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes
                 are available: 1 No preemption victims found for incoming pod.'}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SUFFIX = {'': 1.0, 'm': 1e-3, 'k': 1e3, 'M': 1e6, 'G': 1e9, 'T': 1e12, 'P': 1e15,
           'Ki': 2.0**10, 'Mi': 2.0**20, 'Gi': 2.0**30, 'Ti': 2.0**40, 'Pi': 2.0**50}
_QUANTITY = re.compile(r'([0-9.]+(?:[eE][-+]?[0-9]+)?)(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?')


def quantity(value: Any) -> float:
    """A Kubernetes quantity (``2``, ``500m``, ``1Gi``) as a number."""
    if isinstance(value, int | float):
        return float(value)
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f'not a quantity: {value!r}')
    return float(match.group(1)) * _SUFFIX[match.group(2) or '']


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """What the pod asks of a node, by resource."""
    out: dict[str, float] = {}
    for container in (pod.get('spec') or {}).get('containers') or []:
        resources = container.get('resources') or {}
        requests = resources.get('requests') or {}
        limits = resources.get('limits') or {}
        for name in {*requests, *limits}:
            value = requests.get(name, limits.get(name))
            if value is not None:
                out[name] = out.get(name, 0.0) + quantity(value)
    return out


def unschedulable_message(insufficient: list[str]) -> str:
    """The scheduler's message for a pod that fits on no node (one node here)."""
    why = ', '.join(f'1 Insufficient {name}' for name in insufficient)
    return (f'0/1 nodes are available: {why}. preemption: 0/1 nodes are available: 1 No '
            f'preemption victims found for incoming pod.')


class NodeCapacity:
    """The node's allocatable resources and the requests of the pods bound to it."""

    def __init__(self, allocatable: Mapping[str, Any]) -> None:
        self.allocatable = {name: quantity(v) for name, v in allocatable.items()}
        self.bound: dict[str, dict[str, float]] = {}
        """Pod uid -> what it requests (of the resources in :attr:`allocatable`)."""

    def used(self, name: str) -> float:
        return sum(need.get(name, 0.0) for need in self.bound.values())

    def insufficient(self, pod: Mapping[str, Any]) -> list[str]:
        """The resources the pod asks more of than is free (empty: it fits)."""
        need = pod_requests(pod)
        return sorted(name for name, total in self.allocatable.items()
                      if need.get(name, 0.0) > total - self.used(name) + 1e-9)

    def bind(self, uid: str, pod: Mapping[str, Any]) -> None:
        need = pod_requests(pod)
        self.bound[uid] = {name: need[name] for name in self.allocatable if name in need}

    def release(self, uid: str) -> bool:
        """Free what the pod held; False if it held nothing."""
        return self.bound.pop(uid, None) is not None


__all__ = ['NodeCapacity', 'pod_requests', 'quantity', 'unschedulable_message']

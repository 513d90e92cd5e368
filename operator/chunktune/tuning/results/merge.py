"""Repeated measurements of one behaviour, merged: the runs of a configuration (a recheck
measures the best ones again), and of configurations that differ only in limits no run reached,
become one record of their mean.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence

from chunktune.core.study_records import TrialRecord
from chunktune.core.trials import TrialState
from chunktune.tuning.results.noise import host_disturbed


def config_key(t: TrialRecord) -> str:
    """What tells one configuration from another (its parameters, in a fixed order)."""
    return json.dumps(sorted(t.params.items()))


#: Runs of configurations that differ in limits none of them reached count as runs of one
#: behaviour only while the KV cache stayed below this share (``kv_cache_usage_peak``): the
#: limits also size the engine's start-up reservations, and so its KV capacity, which matters
#: only once the cache fills.
KV_HEADROOM = 0.95


def unbound(t: TrialRecord) -> dict[str, int]:
    """The limit flags of ``t``'s configuration its run never reached: flag -> the most the
    busiest step used (below the flag's value). With any value above that use the run would
    have been the same."""
    out = {}
    for flag, used in t.peak.items():
        v = t.params.get(flag)
        if isinstance(v, int | float) and not isinstance(v, bool) and used < v:
            out[flag] = used
    return out


def runs_as(t: TrialRecord, other: TrialRecord) -> bool:
    """``t``'s run is a run of ``other``'s configuration too: the same configuration, or one
    that differs only in limits ``t``'s run stayed below ``other``'s value of (and its own),
    with the KV cache never near full (:data:`KV_HEADROOM`)."""
    if t.params == other.params:
        return True
    if set(t.params) != set(other.params):
        return False
    kv = t.metrics.get("kv_cache_usage_peak")
    if kv is None or kv >= KV_HEADROOM:
        return False
    free = unbound(t)
    for flag, v in t.params.items():
        w = other.params[flag]
        if v == w:
            continue
        if flag not in free or not isinstance(w, int | float) or not free[flag] < w:
            return False
    return True


def merge(trials: Sequence[TrialRecord]) -> dict[int, TrialRecord]:
    """The configurations measured by more than one completed trial (a ``recheck`` measures
    the best ones again), each with the runs of configurations that behaved the same: ones
    that differ only in limits (``max-num-seqs``, ``max-num-batched-tokens``) no run reached
    (:func:`unbound`, from the step log), such a run being a run of either configuration.
    Per group one record with the parameters of its most permissive configuration (the largest
    limits: every run in the group is a run of it), numbered as that configuration's first
    measurement, with the mean of each metric every measurement has, feasible only when every
    measurement was (an SLO missed once is missed), and :attr:`TrialRecord.repeats` the
    measuring trials; keyed by each of those trials' numbers. A measurement the host disturbed
    (:func:`host_disturbed`) is left out (:attr:`TrialRecord.noisy`) when another one was not:
    its latencies say more about the host than about the configuration."""
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    parent = list(range(len(done)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(done):
        for j in range(i):
            b = done[j]
            if a.params == b.params or (runs_as(a, b) and runs_as(b, a)):
                parent[root(i)] = root(j)
    groups: dict[int, list[TrialRecord]] = {}
    for i, t in enumerate(done):
        groups.setdefault(root(i), []).append(t)
    out: dict[int, TrialRecord] = {}
    for g in groups.values():
        # the most permissive configuration; the runs that are not runs of it (a run that
        # reached a smaller limit, linked through its configuration's other runs) drop out
        # (members differ only in numeric limits: the flags runs_as lets differ)
        top = {f: max(float(m.params[f]) for m in g) for f in g[0].params
               if len({m.params[f] for m in g}) > 1}
        rep = max(g, key=lambda t: (sum(float(t.params[f]) == v for f, v in top.items()),
                                    -t.number))
        g = [t for t in g if runs_as(t, rep)]
        if len(g) < 2:
            continue
        noisy = [t for t in g if host_disturbed(t)]
        kept = [t for t in g if t not in noisy] or g
        keys = set.intersection(*(set(t.metrics) for t in kept))
        first = min((t for t in g if t.params == rep.params), key=lambda t: t.number)
        rec = dataclasses.replace(
            first, metrics={k: statistics.fmean(t.metrics[k] for t in kept)
                            for k in kept[0].metrics if k in keys},
            constraints_ok=all(t.constraints_ok for t in kept),
            reason=next((t.reason for t in kept if not t.constraints_ok), kept[0].reason),
            predicted=next((t.predicted for t in g if t.predicted), first.predicted),
            repeats=tuple(t.number for t in g),
            noisy=tuple(t.number for t in noisy) if len(kept) < len(g) else ())
        for t in g:
            out[t.number] = rec
    return out


def measured_by(rec: TrialRecord, members: Sequence[TrialRecord] = ()) -> str:
    """``the mean of its 2 measurements: trials 4, 9`` (or which were left out as noisy), and,
    given the measuring trials (``members``), which of them ran another value of a limit that
    no run reached (:func:`merge`)."""
    if not rec.noisy:
        text = (f"the mean of its {len(rec.repeats)} measurements: trials "
                f"{', '.join(map(str, rec.repeats))}")
    else:
        kept = [n for n in rec.repeats if n not in rec.noisy]
        text = (f"the mean of trial{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))}; "
                f"trial{'s' if len(rec.noisy) > 1 else ''} {', '.join(map(str, rec.noisy))} "
                "left out as noisy")
    return text + same_behaviour(rec, members)


def same_behaviour(rec: TrialRecord, members: Sequence[TrialRecord]) -> str:
    """``; trial 26 ran max-num-seqs 16, a limit no run reached (at most 8 in a step)``: the
    measurements of ``rec`` (a :func:`merge` record) that ran other values of its limits."""
    others = [m for m in members if m.number in rec.repeats and m.params != rec.params]
    if not others:
        return ""
    parts = []
    for m in others:
        diff = [f for f, v in m.params.items() if v != rec.params.get(f)]
        parts.append(f"trial {m.number} ran " + ", ".join(f"{f} {m.params[f]}" for f in diff))
    flags = sorted({f for m in others for f, v in m.params.items() if v != rec.params.get(f)})
    used = [f"{f} {max(m.peak.get(f, 0) for m in members if m.number in rec.repeats)}"
            for f in flags]
    return (f"; {'; '.join(parts)}: limit{'s' if len(flags) > 1 else ''} no run reached "
            f"(the busiest step used {', '.join(used)}), so the same behaviour")


"""HTTP reads of server metrics: :func:`scrape` of an engine's ``/metrics`` (aiohttp), and
Prometheus' query API through ``prometheus-api-client``.

:class:`PrometheusClient` is a thin asynchronous face on
:class:`prometheus_api_client.PrometheusConnect`, which is blocking (``requests``): every query
runs in a worker thread (:func:`asyncio.to_thread`), so the operator's event loop never waits on
Prometheus. What the library leaves to us stays here: reading one number out of an instant
query's result (``None`` for an empty result or ``NaN``), one error type, and
:meth:`PrometheusClient.trial_metrics`, which runs :func:`chunktune.metrics.promql.trial_queries`
for a trial's load window and returns the figures with the same keys as the scrape-based reader
(:func:`chunktune.metrics.promtext.server_metrics`), and :meth:`PrometheusClient.observe_workload`,
which reads a deployment's request histograms under a label selector for
:func:`chunktune.metrics.derive.derive`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from chunktune.core.errors import ChunktuneError
from chunktune.core.selectors import LabelSelector
from chunktune.metrics import promql
from chunktune.metrics.derive import Buckets, Observation, WorkloadUnavailable
from chunktune.metrics.promtext import Scrape, prefix_cache_hit_rate

log = logging.getLogger(__name__)


async def scrape(http: aiohttp.ClientSession, url: str) -> Scrape | None:
    """One read of an engine's ``/metrics`` (``url`` is the engine's base URL); None when it
    does not answer 200 or answers something that is not Prometheus text."""
    try:
        async with http.get(url + "/metrics") as r:
            if r.status != 200:
                return None
            return Scrape.parse(await r.text())
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None


class PrometheusError(ChunktuneError):
    """Prometheus answered with an error, or could not be reached."""


#: One quick retry of a refused connection or a gateway error, not the library's default of
#: three with exponential back-off (seconds per query while the trial waits for its figures).
_RETRY = Retry(total=1, backoff_factor=0.1, status_forcelist=(502, 503, 504),
               allowed_methods=("GET",), raise_on_status=False)


class PrometheusClient:
    """Instant queries against Prometheus at ``url`` (its base URL, e.g.
    ``http://prometheus.monitoring:9090``)."""

    def __init__(self, url: str, timeout: float = 10.0,
                 headers: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        # The library types its timeout as whole seconds (requests takes any number).
        self._prom = PrometheusConnect(self.url, headers=dict(headers or {}), retry=_RETRY,
                                       timeout=math.ceil(timeout))

    def _instant(self, q: str, at: float | None) -> Any:
        """The raw result of an instant query at ``at`` (Unix seconds; default now). Blocks;
        raises :class:`PrometheusError`."""
        params = {} if at is None else {"time": f"{at:.3f}"}
        try:
            return self._prom.custom_query(q, params=params)
        except PrometheusApiClientException as e:
            raise PrometheusError(f"{e} (query {q})") from e
        except (requests.RequestException, ValueError, KeyError, TypeError) as e:
            raise PrometheusError(f"cannot query {self.url}: {e}") from e
        except RecursionError:  # its traceback (the JSON decoder's thousand frames) is dropped
            raise PrometheusError(f"cannot query {self.url}: its answer is nested too deeply "
                                  "to be Prometheus' (is it Prometheus?)") from None

    def query_sync(self, q: str, at: float | None = None) -> float | None:
        """The value of an instant query at ``at`` (Unix seconds; default now): the first
        sample of a vector or the scalar; ``None`` when empty or not a number. Blocks; raises
        :class:`PrometheusError`."""
        result = self._instant(q, at)
        return _value(result)

    def query_vector_sync(self, q: str, at: float | None = None) -> list[tuple[dict[str, str],
                                                                              float]]:
        """Every sample of an instant vector query at ``at``: ``(labels, value)``, non-numbers
        left out. Blocks; raises :class:`PrometheusError`."""
        result = self._instant(q, at)
        out: list[tuple[dict[str, str], float]] = []
        for sample in result if isinstance(result, list) else []:
            if isinstance(sample, Mapping):
                v = _value([sample])
                if v is not None:
                    out.append(({str(k): str(x) for k, x in (sample.get("metric") or {}).items()},
                                v))
        return out

    def observe_workload(self, selector: str, window: float, at: float | None = None,
                         peak_window: float | None = None,
                         latency: tuple[str, ...] = ()) -> Observation:
        """A deployment's request histograms under ``selector`` over the ``window`` seconds
        ending ``at`` (default now); ``latency``: also these server-side latency histograms
        (``ttft``, ``itl``, ``e2e``). Blocks. Raises :class:`WorkloadUnavailable` naming the
        selector: Prometheus does not answer, or no series matches."""
        sel = LabelSelector.parse(selector)
        at = time.time() if at is None else at
        sub = peak_window or default_peak_window(window)
        queries = promql.workload_queries(sel, window, sub)
        try:
            n_series = self.query_sync(queries["series"], at)
            if not n_series:
                raise WorkloadUnavailable("NoMatchingSeries",
                                          self._no_series(sel, window, at))
            scalars = {k: self.query_sync(queries[k], at)
                       for k in ("requests", "peak_rate", "prompt_sum", "output_sum",
                                 "prefix_queries", "prefix_hits",
                                 *promql.SPEC_DECODE_COUNTERS)}
            hist = {k: self._buckets(queries[k], at)
                    for k in ("prompt_buckets", "output_buckets")}
            lat = {base: self._buckets(promql.buckets(promql.LATENCY_HISTOGRAMS[base], sel,
                                                      window), at) for base in latency}
        except PrometheusError as e:
            raise WorkloadUnavailable(
                "PrometheusUnreachable", f"cannot derive the workload of {sel}: Prometheus at "
                f"{self.url} did not answer ({_short(str(e))})") from e
        return Observation(url=self.url, selector=str(sel), window=window, at=at,
                           peak_window=sub, requests=scalars["requests"] or 0.0,
                           peak_rate=scalars["peak_rate"], prompt=hist["prompt_buckets"],
                           output=hist["output_buckets"], prompt_sum=scalars["prompt_sum"],
                           output_sum=scalars["output_sum"], latency=lat,
                           prefix_queries=scalars["prefix_queries"],
                           prefix_hits=scalars["prefix_hits"],
                           spec_drafts=scalars["spec_drafts"],
                           spec_draft_tokens=scalars["spec_draft_tokens"],
                           spec_accepted=scalars["spec_accepted"])

    def _buckets(self, q: str, at: float) -> Buckets:
        return Buckets.from_le({labels.get("le", "+Inf"): v
                                for labels, v in self.query_vector_sync(q, at)})

    def _no_series(self, sel: LabelSelector, window: float, at: float) -> str:
        """The error for a selector that matches nothing, with the values its labels have on
        vLLM's request histograms (when Prometheus has any)."""
        hints = []
        for label in sel.labels():
            try:
                values = sorted({labels.get(label, "") for labels, _ in self.query_vector_sync(
                    promql.label_values(label, window), at)} - {""})
            except PrometheusError:
                continue
            if values:
                shown = ", ".join(values[:10]) + (", ..." if len(values) > 10 else "")
                hints.append(f"{label} there: {shown}")
        tail = ("; " + "; ".join(hints)) if hints else (
            "; Prometheus has no vllm:request_prompt_tokens series at all in that window "
            "(is it scraping the engines' /metrics?)")
        return (f"no series of vllm:request_prompt_tokens matches the selector {sel} in the "
                f"{window:g} s ending {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(at))} "
                f"at {self.url}{tail}")

    async def query(self, q: str, at: float | None = None) -> float | None:
        """:meth:`query_sync` in a worker thread."""
        return await asyncio.to_thread(self.query_sync, q, at)

    async def trial_metrics(self, sel: promql.PodSelector, start: float,
                            end: float) -> dict[str, float]:
        """The engine's figures over ``[start, end]`` (Unix seconds): preemptions (and per
        minute), token counts, KV-usage peak, queue/TTFT/ITL quantiles. Queries that fail or
        find nothing are left out. The queries run one after another in one worker thread
        (each takes milliseconds; one thread keeps the HTTP session single-threaded)."""
        return await asyncio.to_thread(self._trial_metrics, sel, start, end)

    def _trial_metrics(self, sel: promql.PodSelector, start: float,
                       end: float) -> dict[str, float]:
        seconds = max(1.0, end - start)
        out: dict[str, float] = {}
        for key, q in promql.trial_queries(sel, seconds).items():
            try:
                v = self.query_sync(q, end)
            except PrometheusError as e:
                log.warning("Prometheus query for %s failed: %s", key, e)
                continue
            if v is not None:
                out[key] = v
        if "preemptions" in out:
            out["preemptions_per_minute"] = out["preemptions"] / (seconds / 60)
        prefix_cache_hit_rate(out)
        return out

    async def close(self) -> None:
        await asyncio.to_thread(self._prom.close)


def _short(message: str) -> str:
    """A connection error's cause (``Connection refused``) instead of urllib3's whole
    chain."""
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", message)
    if m:
        return m.group(1).strip()
    return message if len(message) <= 300 else message[:297] + "..."


def default_peak_window(window: float) -> float:
    """The stretch a peak rate is measured over: an eighth of the window, between 10 s and
    5 min, and never longer than the window."""
    return min(window, 300.0, max(window / 8, 10.0))


def _value(result: Any) -> float | None:
    """The number in an instant query's ``data.result``: a vector's first sample
    (``[{"metric": ..., "value": [t, "v"]}, ...]``) or a scalar (``[t, "v"]``)."""
    raw: Any = None
    if isinstance(result, list) and result:
        first = result[0]
        if isinstance(first, Mapping):
            value = first.get("value")
            if isinstance(value, list) and len(value) == 2:
                raw = value[1]
        elif len(result) == 2:
            raw = result[1]
    if raw is None:
        return None
    try:
        v = float(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


__all__ = ["PrometheusClient", "PrometheusError", "default_peak_window", "scrape"]

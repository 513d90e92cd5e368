"""HTTP reads of server metrics: :func:`scrape` of an engine's ``/metrics``, and a small
asynchronous client of Prometheus' HTTP API (``/api/v1/query``), with aiohttp.

:class:`PrometheusClient` evaluates instant queries and returns the first sample's value (or
``None`` for an empty result, ``NaN``, or an error). :meth:`PrometheusClient.trial_metrics`
runs :func:`chunktune.metrics.promql.trial_queries` for a trial's load window and returns the
figures with the same keys as the scrape-based reader
(:func:`chunktune.metrics.promtext.server_metrics`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import aiohttp

from chunktune.metrics import promql
from chunktune.metrics.promtext import Scrape

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


class PrometheusError(Exception):
    """Prometheus answered with an error, or could not be reached."""


class PrometheusClient:
    def __init__(self, url: str, timeout: float = 10.0,
                 headers: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._session: aiohttp.ClientSession | None = None

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout), headers=self.headers)
        return self._session

    async def query(self, q: str, at: float | None = None) -> float | None:
        """The value of an instant query at ``at`` (Unix seconds; default now): the first
        sample of a vector or the scalar; ``None`` when empty or not a number. Raises
        :class:`PrometheusError`."""
        params = {"query": q}
        if at is not None:
            params["time"] = f"{at:.3f}"
        http = await self._http()
        try:
            async with http.get(f"{self.url}/api/v1/query", params=params) as r:
                body: dict[str, Any] = await r.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            raise PrometheusError(f"cannot query {self.url}: {e}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType', 'error')}: {body.get('error')} "
                                  f"(query {q})")
        return _value(body.get("data") or {})

    async def trial_metrics(self, sel: promql.PodSelector, start: float,
                            end: float) -> dict[str, float]:
        """The engine's figures over ``[start, end]`` (Unix seconds): preemptions (and per
        minute), token counts, KV-usage peak, queue/TTFT/ITL quantiles. Queries that fail or
        find nothing are left out."""
        seconds = max(1.0, end - start)
        queries = promql.trial_queries(sel, seconds)
        values = await asyncio.gather(*(self.query(q, end) for q in queries.values()),
                                      return_exceptions=True)
        out: dict[str, float] = {}
        for key, v in zip(queries, values, strict=True):
            if isinstance(v, BaseException):
                log.warning("Prometheus query for %s failed: %s", key, v)
            elif v is not None:
                out[key] = v
        if "preemptions" in out:
            out["preemptions_per_minute"] = out["preemptions"] / (seconds / 60)
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _value(data: dict[str, Any]) -> float | None:
    kind, result = data.get("resultType"), data.get("result")
    raw: Any = None
    if kind == "vector" and result:
        raw = result[0].get("value", [None, None])[1]
    elif kind == "scalar" and result:
        raw = result[1]
    if raw is None:
        return None
    try:
        v = float(raw)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


__all__ = ["PrometheusClient", "PrometheusError"]

"""The Prometheus client: prometheus-api-client underneath, our value reading and errors on top.

The query API round trip against a fake server is in tests/k8s/test_units.py and against a real
Prometheus in tests/k8s/test_prometheus.py; these cover the result shapes and the failures."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from chunktune.metrics.client import PrometheusClient, PrometheusError, _value


@pytest.mark.parametrize(("result", "expected"), [
    ([{"metric": {}, "value": [1.7e9, "12"]}], 12.0),            # a vector: its first sample
    ([{"metric": {"a": "1"}, "value": [1.7e9, "0.5"]},
      {"metric": {"a": "2"}, "value": [1.7e9, "9"]}], 0.5),
    ([1.7e9, "3.25"], 3.25),                                      # a scalar
    ([], None),                                                   # nothing matched
    ([{"metric": {}, "value": [1.7e9, "NaN"]}], None),
    ([{"metric": {}, "value": [1.7e9, "+Inf"]}], None),
    ([1.7e9, "not a number"], None),
    ([{"metric": {}, "values": [[1.7e9, "1"]]}], None),           # a range vector has no value
])
def test_value_of_an_instant_result(result: object, expected: float | None) -> None:
    assert _value(result) == expected


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_prometheus_is_a_prometheus_error() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{_free_port()}", timeout=2.0)
    with pytest.raises(PrometheusError, match="cannot query"):
        client.query_sync("up")
    asyncio.run(client.close())


def test_queries_run_off_the_event_loop() -> None:
    """While a query waits on a slow server, the loop keeps running other tasks."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    answered = threading.Event()
    released_by_the_loop: list[bool] = []

    def slow_prometheus() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            # Released by the loop's task below; a blocked loop never gets there, so the wait
            # times out instead.
            released_by_the_loop.append(answered.wait(5))
            body = b'{"status":"success","data":{"resultType":"scalar","result":[1,"7"]}}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                         b"Connection: close\r\n\r\n" + body)

    server = threading.Thread(target=slow_prometheus, daemon=True)
    server.start()

    async def main() -> tuple[float | None, int]:
        client = PrometheusClient(f"http://127.0.0.1:{port}", timeout=10.0)
        query = asyncio.create_task(client.query("vector(7)"))
        ticks = 0
        deadline = time.monotonic() + 10
        while ticks < 5 and time.monotonic() < deadline:  # the loop runs while the query waits
            await asyncio.sleep(0.01)
            ticks += 1
        answered.set()
        value = await query
        await client.close()
        return value, ticks

    value, ticks = asyncio.run(main())
    server.join(10)
    srv.close()
    assert (value, ticks, released_by_the_loop) == (7.0, 5, [True])

"""`GET /metrics`: the registry the services' collectors fill (services/metrics.py), written in
Prometheus' text format, with Triton's own counters and models' counters as Triton writes them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from appliance.services.metrics import CustomCounter, CustomFamily, number_text

log = logging.getLogger(__name__)


class _Collected(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def exposition(registry: CollectorRegistry) -> bytes:
    """Prometheus' text format of every family; models' counters as Triton writes them. A
    model's family named like one of the server's is left out (the server's is kept)."""
    server: list[Metric] = []
    custom: list[Metric] = []
    for metric in registry.collect():
        (custom if isinstance(metric, CustomFamily) else server).append(metric)
    taken = {metric.name for metric in server}
    taken |= {f"{metric.name}_total" for metric in server if metric.type == "counter"}
    kept = [m for m in custom if m.name not in taken]
    if len(kept) < len(custom):
        log.debug("custom metric families named like the server's are not exposed")
    standard = [m for m in kept if not isinstance(m, CustomCounter)]
    tritons = [m for m in server if _tritons_counter(m)]
    body = generate_latest(_Collected([m for m in server if not _tritons_counter(m)] + standard))
    lines = [_counter_text(m) for m in tritons]
    lines += [_counter_text(m) for m in kept if isinstance(m, CustomCounter)]
    return body + "".join(lines).encode("utf-8")


def _tritons_counter(metric: Metric) -> bool:
    """One of Triton's counters (`nv_...`): written as tritonserver writes it, `name{labels}`
    without the `_total` prometheus_client adds (dashboards and Triton's own tests query
    `nv_inference_request_success`, `nv_inference_request_failure`, ...). The project's own
    `edge_*` counters keep `_total`."""
    return metric.type == "counter" and metric.name.startswith("nv_")


def _counter_text(counter: Metric) -> str:
    help_text = counter.documentation.replace("\\", "\\\\").replace("\n", "\\n")
    lines = [f"# HELP {counter.name} {help_text}\n", f"# TYPE {counter.name} counter\n"]
    for sample in counter.samples:
        if sample.name not in (counter.name, f"{counter.name}_total"):
            continue  # a `_created` sample
        labels = ",".join(
            f'{name}="{_escape(value)}"' for name, value in sorted(sample.labels.items())
        )
        selector = f"{{{labels}}}" if labels else ""
        lines.append(f"{counter.name}{selector} {number_text(sample.value)}\n")
    return "".join(lines)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_app(
    registry: CollectorRegistry, prefetch: Callable[[], object] | None = None
) -> web.Application:
    """`GET /metrics` in Prometheus' text format."""

    async def metrics(request: web.Request) -> web.Response:
        started = time.monotonic()
        if prefetch is not None:
            # NVML can stall for seconds on a GPU in a bad state: read it off the event loop;
            # the collector then serves that (cached) reading.
            await asyncio.to_thread(prefetch)
        body = exposition(registry)
        log.debug("metrics scraped in %.1f ms", (time.monotonic() - started) * 1000)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app

"""The status service called directly, with no transport: real ONNX models in a real
ModelRuntime behind a real ControlService; the report checked as typed results."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from appliance.common.settings import ServerSettings
from appliance.common.types import InferRequest, Tensor
from appliance.ops.logs import LogSettings
from appliance.repository.s3 import DownloadProgress
from appliance.runtime.models import ModelRuntime
from appliance.runtime.settings import RuntimeSettings
from appliance.services.control import ControlService, ServerState
from appliance.services.inference import InferenceService
from appliance.services.status import StatusService, VersionStatus
from tests.integration import status_repo


@dataclass
class Source:
    """A remote repository's state as S3Source keeps it."""

    url: str = "s3://AKIAKEY:secret@minio:9000/models"
    reachable: bool | None = False
    last_sync_s: float = 0.0
    last_error: str = "connection refused"
    downloaded_bytes: int = 10
    pending: dict[tuple[str, int], str] | None = None
    download: DownloadProgress | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    frozen_since_s: float = 0.0


@dataclass
class Parts:
    status: StatusService
    inference: InferenceService
    source: Source


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Parts]:
    repository = status_repo.build(tmp_path / "models")
    settings = ServerSettings(model_repositories=(repository,))
    runtime = ModelRuntime(RuntimeSettings.from_server(settings))
    await runtime.load_all(None)
    control = ControlService(
        runtime, ServerState(loading_done=True), "none", False, logs=LogSettings()
    )
    source = Source(pending={("resnet", 3): "not enough disk: 5 MB free, 9 MB needed"})
    runtime.pending = lambda: dict(source.pending or {})  # as the composition root wires it
    status = StatusService(
        control,
        store_path=tmp_path / "store",
        local_repositories=(repository,),
        sources=[source],  # type: ignore[list-item]  # pending is Optional in the fake
        gpu=None,
        interval_s=0.05,
    )
    try:
        yield Parts(status, InferenceService(runtime), source)
    finally:
        await runtime.stop(5.0)


def _request() -> InferRequest:
    data = np.ones((1, 16), np.int32)
    inputs = [Tensor(name, "INT32", data.shape, data) for name in ("INPUT0", "INPUT1")]
    return InferRequest(model_name="simple", model_version="", inputs=inputs)


async def test_report_before_any_sample(parts: Parts) -> None:
    report = parts.status.report()
    assert report.device.cpu_percent is None  # not read yet: no I/O in report()
    assert report.server.ready
    names = [m.name for m in report.models]
    assert names == ["broken", "resnet", "simple"]
    simple = report.models[2]
    assert simple.state == "READY"
    assert simple.versions == (VersionStatus(1, "READY", ""),)
    assert simple.instance_groups[0].kind in ("KIND_CPU", "KIND_GPU")
    (instance,) = simple.instances  # the config's one group, count 1, as the loader names it
    assert (instance.version, instance.name) == (1, f"{instance.group}_0")
    assert instance.kind == simple.instance_groups[0].kind
    broken = report.models[0]
    assert broken.state == "UNAVAILABLE"
    assert "onnx" in broken.versions[0].reason.lower()
    resnet = report.models[1]  # listed in the bucket, not fetched for lack of space
    assert resnet.versions == (
        VersionStatus(3, "UNAVAILABLE", "not fetched: not enough disk: 5 MB free, 9 MB needed"),
    )
    (source,) = report.updates.sources
    assert source.url == "s3://minio:9000/models"  # never the keys
    assert source.reachable is False
    assert source.pending == ("model 'resnet' version 3: not enough disk: 5 MB free, 9 MB needed",)
    assert source.download is None
    assert report.updates.control_mode == "none"
    assert report.updates.poll_interval_s is None
    updates = {m.name: m for m in report.updates.models}
    assert updates["simple"].serving == (1,)
    assert updates["simple"].last_switch is None  # nothing sampled yet
    assert updates["broken"].serving == ()


async def test_the_sampler_follows_inference(parts: Parts) -> None:
    status = parts.status
    async with status.running():
        await asyncio.sleep(0.12)  # the baseline sample, and one more
        for _ in range(10):
            await parts.inference.infer(_request())
        deadline = asyncio.get_running_loop().time() + 5
        while not any(p.requests_per_s for p in status.live.numbers("simple", 0.05).points):
            assert asyncio.get_running_loop().time() < deadline, "no rate point"
            await asyncio.sleep(0.05)
    live = status.report().models[-1].live
    assert live.p50_ms is not None
    assert live.p99_ms is not None
    assert live.p99_ms >= live.p50_ms
    assert live.error_rate == 0.0
    assert status.report().device.memory_total_bytes  # sampled on a thread


async def test_a_download_and_a_switch_are_shown(parts: Parts) -> None:
    status, source = parts.status, parts.source
    source.download = DownloadProgress("resnet", 3, 0, 4_000_000, 1.0)
    await status.sample()  # the baseline: downloaded_bytes and the served versions
    source.downloaded_bytes += 100_000
    source.download = DownloadProgress("resnet", 3, 100_000, 4_000_000, 1.0)
    runtime = status.control.runtime
    await runtime.unload("simple")
    await status.sample()
    download = status.report().updates.sources[0].download
    assert download is not None
    assert (download.model, download.version) == ("resnet", 3)
    assert (download.done_bytes, download.total_bytes) == (100_000, 4_000_000)
    assert download.rate_bytes_s is not None
    assert download.rate_bytes_s > 0
    # What version 3 waits for now is its download, not the earlier poll's reason.
    why = "downloading: 100000 of 4000000 bytes"
    assert status.report().updates.sources[0].pending == (f"model 'resnet' version 3: {why}",)
    resnet = {m.name: m for m in status.report().models}["resnet"]
    assert resnet.versions == (VersionStatus(3, "UNAVAILABLE", f"not fetched: {why}"),)
    switch = {m.name: m for m in status.report().updates.models}["simple"].last_switch
    assert switch is not None
    assert (switch.from_versions, switch.to_versions) == ((1,), ())

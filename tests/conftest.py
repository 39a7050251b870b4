"""Shared fixtures: the test model repository and a running server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import models
from tests.serverproc import ServerProcess


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.build(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def server(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server for the whole session, serving the test repository."""
    proc = ServerProcess(
        model_repository,
        "--cache-config=local,size=1048576",
        "--allow-client-shm=true",  # the shared memory tests register regions
        log_path=tmp_path_factory.mktemp("logs") / "server.log",
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    """Start extra servers with their own flags; each is stopped after the test."""
    started: list[ServerProcess] = []

    def start(
        repository: Path | str | list[Path | str],
        *flags: str,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        proc = ServerProcess(
            repository, *flags, log_path=tmp_path / f"server{len(started)}.log", env=env
        )
        started.append(proc)
        if wait:
            proc.wait_ready()
        return proc

    yield start
    for proc in started:
        proc.stop()

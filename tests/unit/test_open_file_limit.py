"""The open-file limit at start and the cap on shared memory regions (issue 31, item 7)."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from appliance.services.shared_memory import (
    SharedMemoryRegistry,
    TooManyRegions,
    region_cap,
)
from tests.serverproc import ROOT


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    """systemd starts services at 1024 soft: `serve` raises it to the hard limit, and says so."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)
    script = (
        "import logging, resource, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({low}, {hard}))\n"
        "from appliance.face.cli import raise_open_file_limit\n"
        "print(raise_open_file_limit())\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True
    )
    lines = done.stdout.splitlines()
    if hard != resource.RLIM_INFINITY and low < hard:
        assert f"open-file limit raised from {low} to {hard}" in done.stdout
    expected = hard if hard != resource.RLIM_INFINITY else low
    assert lines[-1] == f"({expected}, {hard})"


def test_regions_take_at_most_half_the_descriptors() -> None:
    assert region_cap(1024, 1024) == 512
    assert region_cap(1024, 65536) == 1024
    assert region_cap(10, 256) == 10
    assert region_cap(1024, 1) == 0


def test_the_cap_counts_every_region_and_names_itself() -> None:
    registry = SharedMemoryRegistry(max_regions=0)
    with pytest.raises(TooManyRegions, match=r"0 regions are registered.*--max-shm-regions 0"):
        registry.register("r", "/anything", 0, 1)

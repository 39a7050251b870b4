"""GPU tests: skipped, with the reason, where no CUDA device can be opened."""

from __future__ import annotations

import pytest

from edge_backends.cuda_device import CudaDevice, DeviceUnavailable, open_device


def device_or_skip(library: str = "") -> CudaDevice:
    try:
        return open_device(0, library)
    except DeviceUnavailable as exc:
        pytest.skip(f"no CUDA device ({exc})")


def available_libraries() -> list[str]:
    """The binding libraries that can open device 0 here (empty without a GPU)."""
    found = []
    for library in ("pycuda", "cuda-python"):
        try:
            open_device(0, library)
        except DeviceUnavailable:
            continue
        found.append(library)
    return found

"""The cost of reading and writing system shared memory through the file descriptor.

    python -m bench.shm_copy [--sizes-mib 1,8,64] [--repeat 30]

The server copies tensors in and out of a client's shared memory object with preadv/pwritev
(a shrunk object then gives a short count, not SIGBUS). The floor it is compared with is a
memcpy out of a mapping of the same object, which is what a backend reading a mapped view
would do. Prints the median milliseconds per copy as a markdown table.
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
import uuid
from collections.abc import Callable

import numpy as np

from appliance.common.types import ShmTarget
from appliance.services.shared_memory import SharedMemoryRegistry, read_input, write_output


def median_ms(step: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def row(mib: int, repeat: int) -> str:
    size = mib << 20
    key = f"/edge_bench_{uuid.uuid4().hex[:8]}"
    path = "/dev/shm" + key
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
    try:
        fd = os.open(path, os.O_RDWR)
        mapping = mmap.mmap(fd, size)
        os.close(fd)
        registry = SharedMemoryRegistry()
        registry.register("bench", key, 0, size)
        target = ShmTarget("bench", 0, size)
        shape = (1, size // 4)
        out = np.ones(shape, np.float32)
        mapped = np.frombuffer(mapping, np.float32).reshape(shape)
        floor_in = median_ms(lambda: np.array(mapped, copy=True), repeat)
        read = median_ms(lambda: read_input(registry, target, "FP32", shape, "bench"), repeat)
        floor_out = median_ms(lambda: np.copyto(mapped, out), repeat)
        write = median_ms(lambda: write_output(registry, target, out, "FP32", "bench"), repeat)
        return (
            f"| {mib} MiB | {floor_in:.2f} | {read:.2f} | {size / read / 1e6:.1f} "
            f"| {floor_out:.2f} | {write:.2f} |"
        )
    finally:
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mib", default="1,8,64")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    print("| tensor | memcpy from a mapping, ms | read_input (preadv), ms | GB/s "
          "| memcpy into a mapping, ms | write_output (pwritev), ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for mib in (int(m) for m in args.sizes_mib.split(",")):
        print(row(mib, args.repeat))


if __name__ == "__main__":
    main()

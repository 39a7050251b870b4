"""Host policies applied to threads: CPU affinity (`cpu-cores`) and the NUMA memory policy
(`numa-node`), as tritonserver's numa_utils does them (appliance/common/host_policy.py says
which policy an instance runs under).

Both are per-thread in Linux and inherited by the threads and processes a thread starts, so an
instance is created under its policy (`bound`: the runtime threads an ONNX Runtime session
starts and a Python model's process inherit it, and lose nothing when the loading thread is
put back) and its own thread takes it for good (`apply`). `numa-node` binds memory allocation
to the node (set_mempolicy MPOL_BIND); it does not move threads (Triton's meaning).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from appliance.common.host_policy import HostPolicy, HostPolicyError, format_cores

log = logging.getLogger(__name__)

_NODES = Path("/sys/devices/system/node")
# set_mempolicy(2) has no glibc wrapper (libnuma has one): the system call's number by machine.
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
_MPOL_DEFAULT, _MPOL_BIND = 0, 2
_MASK_WORDS = 16  # nodes 0..1023


class NotApplied(OSError):
    """The kernel refused a binding: a seccomp filter (the shipped systemd unit's
    `SystemCallFilter=~@resources`, a container's profile) answers EPERM."""


_SECCOMP_HINT = (
    " (a system call filter refuses it: the shipped systemd unit denies @resources; allow "
    "the two calls in a drop-in: SystemCallFilter=sched_setaffinity set_mempolicy)"
)


def check(policy: HostPolicy) -> HostPolicy:
    """The policy as this machine can apply it, checked at start-up: its cores cut to those
    the server may run on (a policy with none of them is refused; one with some is warned
    about), a NUMA node that exists. A kernel without NUMA has one node: numa-node=0 there
    binds nothing."""
    cores = policy.cpu_cores
    if cores:
        allowed = os.sched_getaffinity(0)
        usable = cores & allowed
        if not usable:
            raise HostPolicyError(
                f"host policy '{policy.name}': none of cpu-cores {format_cores(cores)} is "
                f"available to the server (it may run on {format_cores(allowed)})"
            )
        if usable != cores:
            log.warning(
                "host policy '%s': cpu-cores %s are not available to the server; its "
                "instances run on %s",
                policy.name,
                format_cores(cores - usable),
                format_cores(usable),
            )
        cores = frozenset(usable)
    node = policy.numa_node
    if node is not None:
        if not _NODES.is_dir() or platform.machine() not in _SET_MEMPOLICY:
            if node != 0:
                raise HostPolicyError(
                    f"host policy '{policy.name}': numa-node {node}, but this machine's kernel "
                    "has no NUMA nodes to bind to"
                )
            log.info(
                "host policy '%s': one memory node here, numa-node=0 binds nothing", policy.name
            )
            node = None
        elif not (_NODES / f"node{node}").is_dir():
            present = sorted(p.name[4:] for p in _NODES.glob("node[0-9]*"))
            raise HostPolicyError(
                f"host policy '{policy.name}': numa-node {node} does not exist here (nodes: "
                f"{', '.join(present)})"
            )
    return HostPolicy(policy.name, cores, node)


def apply(policy: HostPolicy | None) -> None:
    """Bind the calling thread (and what it starts from now on) to the policy."""
    if policy is None:
        return
    if policy.cpu_cores:
        try:
            os.sched_setaffinity(0, policy.cpu_cores)  # pid 0: the calling thread
        except OSError as exc:
            hint = _SECCOMP_HINT if exc.errno == errno.EPERM else ""
            message = f"Unable to set CPU affinity: {exc.strerror}{hint}"
            raise NotApplied(exc.errno, message) from exc
    if policy.numa_node is not None:
        _set_mempolicy(_MPOL_BIND, policy.numa_node)


@contextmanager
def bound(policy: HostPolicy | None) -> Iterator[None]:
    """The calling thread under the policy for the block, then as it was (its affinity; its
    memory policy back to the default, as Triton resets it)."""
    if policy is None or not (policy.cpu_cores or policy.numa_node is not None):
        yield
        return
    before = os.sched_getaffinity(0)
    apply(policy)
    try:
        yield
    finally:
        if policy.cpu_cores:
            os.sched_setaffinity(0, before)
        if policy.numa_node is not None:
            _set_mempolicy(_MPOL_DEFAULT, None)


def _set_mempolicy(mode: int, node: int | None) -> None:
    mask = (ctypes.c_ulong * _MASK_WORDS)()
    if node is not None:
        if node >= _MASK_WORDS * 64:
            raise HostPolicyError(f"numa-node {node} is past the nodes this server can bind")
        mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(
        ctypes.c_long(_SET_MEMPOLICY[platform.machine()]),
        ctypes.c_int(mode),
        mask if node is not None else None,
        ctypes.c_ulong(_MASK_WORDS * 64 if node is not None else 0),
    )
    if result != 0:
        code = ctypes.get_errno()
        hint = _SECCOMP_HINT if code == errno.EPERM else ""
        raise NotApplied(code, f"Unable to set NUMA memory policy: {os.strerror(code)}{hint}")

"""The memory budget's flags (docs/memory.md) -> MemorySettings."""

from __future__ import annotations

import argparse

from appliance.common.settings import MemorySettings
from appliance.runtime.budget import parse_budget

_M = MemorySettings()


def add_memory_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-memory-budget",
        default=None,
        metavar="BYTES|N%",
        help="the memory the loaded models may take together (e.g. 2G, 512M, 40%%: of the "
        "cgroup's memory.max where set, else of MemAvailable at start); a load that would "
        "exceed it first unloads idle models, least recently used first, or is refused "
        "(default: no budget)",
    )
    p.add_argument(
        "--model-load-on-demand",
        action="store_true",
        help="load a model that is in the repository but not loaded when a request asks for "
        "it; start-up loads only the resident ones (default: off)",
    )
    p.add_argument(
        "--model-load-wait-ms",
        type=int,
        default=_M.load_wait_ms,
        metavar="MS",
        help="how long a request waits for its model's load on demand (or its own timeout, if "
        f"shorter) (default {_M.load_wait_ms})",
    )
    p.add_argument(
        "--model-idle-unload-secs",
        type=float,
        default=_M.idle_unload_secs,
        metavar="SECONDS",
        help="unload a model that served no request for this long (default 0: never)",
    )
    p.add_argument(
        "--model-memory-swap-unavailable",
        action="store_true",
        help="an update (a new version, a reload) that does not fit in the budget beside the "
        "loaded versions unloads them first, leaving the model unavailable while it loads; "
        "without it such an update is refused and the loaded versions keep serving "
        "(default: off)",
    )
    p.add_argument(
        "--model-resident",
        action="append",
        default=[],
        metavar="MODEL",
        help="a model never unloaded for the budget or for being idle (as its config's "
        'parameters { key: "resident" value: { string_value: "true" } }); repeat for more',
    )


def memory_settings(args: argparse.Namespace) -> MemorySettings:
    """The flags' MemorySettings; SystemExit with the reason for a bad value."""
    budget_bytes, budget_percent = 0, 0.0
    if args.model_memory_budget is not None:
        try:
            spec = parse_budget(args.model_memory_budget)
        except ValueError as exc:
            raise SystemExit(f"edge-appliance: --model-memory-budget: {exc}") from None
        budget_bytes, budget_percent = spec.bytes, spec.percent
    if args.model_load_wait_ms < 0:
        raise SystemExit("edge-appliance: --model-load-wait-ms must be at least 0")
    if not 0 <= args.model_idle_unload_secs < float("inf"):
        raise SystemExit("edge-appliance: --model-idle-unload-secs must be 0 (never) or above")
    return MemorySettings(
        budget_bytes=budget_bytes,
        budget_percent=budget_percent,
        load_on_demand=args.model_load_on_demand,
        load_wait_ms=args.model_load_wait_ms,
        idle_unload_secs=args.model_idle_unload_secs,
        resident=tuple(args.model_resident),
        swap_unavailable=args.model_memory_swap_unavailable,
    )

"""`edge-appliance status`: the status page's summary in a terminal (for SSH sessions).

Reads the running server's `GET /status.json` (the fields of `StatusReport` in
appliance/services/status_results.py) with the standard library only, prints the server,
the device, every model with its versions and state, the update state and the last problems;
`--watch [SECONDS]` clears the screen and prints it again every SECONDS (Ctrl-C exits 0).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from appliance.flags.client import add_endpoint_flags, parse_headers, unreachable, with_scheme
from appliance.flags.parsing import Parser

CLEAR = "\x1b[H\x1b[2J"


def parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Print the server's status (what GET /status shows): models, versions and states, "
        "live numbers, updates and recent problems; --watch refreshes it."
    )
    p.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="clear the screen and print it again every SECONDS (default 2); Ctrl-C exits",
    )
    p.add_argument("--json", action="store_true", help="print the whole status document as JSON")
    add_endpoint_flags(p, "`status`")
    return p


def _forbidden_hint(message: str) -> str:
    """What to add when the server refuses for want of a restricted API's key header."""
    found = re.search(r"expecting header '([^']+)'", message)
    if not found:
        return ""
    return f"; send the key with --header {found.group(1)}=VALUE"


class StatusError(Exception):
    """The server could not be reached or did not answer with a status document."""


def fetch(url: str, headers: dict[str, str], timeout_s: float = 10.0) -> dict[str, Any]:
    target = f"{url.rstrip('/')}/status.json"
    request = urllib.request.Request(target, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        try:
            said = str(json.loads(exc.read() or b"{}").get("error") or "")
        except (ValueError, AttributeError, OSError):
            said = ""
        detail = f": {said}" if said else ""
        hint = _forbidden_hint(said) if exc.code == 403 else ""
        raise StatusError(f"{target}: HTTP {exc.code} {exc.reason}{detail}{hint}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StatusError(unreachable(url, exc)) from exc
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise StatusError(f"{target}: not a JSON document") from exc
    if not isinstance(doc, dict):
        raise StatusError(f"{target}: not a status document")
    return doc


def _text(value: Any, default: str = "-") -> str:
    """A field as text; a missing or null one as `default`, never "None"."""
    return default if value is None or value == "" else str(value)


def table(rows: list[list[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Rows as lines, each column as wide as its widest cell; `right`: right-aligned ones."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def _num(value: Any, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _bytes(value: Any) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {seconds}s"


def _clock(wall_s: Any) -> str:
    if not wall_s:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(wall_s)))


def _versions(versions: Any) -> str:
    return ",".join(f"v{v}" for v in versions or ()) or "none"


def _model_updates(models: Any) -> list[str]:
    """The last switch and the rollback of each model that had one."""
    lines: list[str] = []
    for model in models:
        switch, rollback = model.get("last_switch"), model.get("rollback")
        if switch:
            lines.append(
                f"  {_text(model.get('name'), '?')}: {_versions(switch.get('from_versions'))} -> "
                f"{_versions(switch.get('to_versions'))} at {_clock(switch.get('time_s'))}"
            )
        if rollback:
            lines.append(
                f"  {_text(model.get('name'), '?')}: v{_text(rollback.get('version'), '?')} "
                f"rolled back at {_clock(rollback.get('time_s'))}: {rollback.get('reason')}"
            )
    return lines


def render(doc: dict[str, Any]) -> str:
    """The summary of one status document, as lines of text."""
    lines: list[str] = []
    server = doc.get("server", {})
    device = doc.get("device", {})
    ready = "ready" if server.get("ready") else "NOT READY"
    version = f" {server['version']}" if server.get("version") else ""
    lines.append(
        f"{_text(server.get('name'), 'edge-appliance')}{version}  {ready}  "
        f"up {_duration(float(server.get('uptime_s') or 0))}  "
        f"on {_text(device.get('hostname'), '?')}"
    )
    lines.extend(f"  problem: {p}" for p in server.get("problems", ()))
    lines.extend(f"  note: {n}" for n in server.get("notes", ()))
    memory = "-"
    total, available = device.get("memory_total_bytes"), device.get("memory_available_bytes")
    if total is not None and available is not None:
        memory = f"{_bytes(total - available)} / {_bytes(total)}"
    lines.append(
        f"device: {_text(device.get('cpu_count'), '?')} CPUs "
        f"{_num(device.get('cpu_percent'), '.0f', '%')}"
        f"  load {_num(device.get('load_1m'), '.2f')}  memory {memory}"
        f"  store free {_bytes(device.get('store_free_bytes'))}"
    )
    for gpu in device.get("gpus", ()):
        util = gpu.get("utilization")
        percent = None if util is None else util * 100
        lines.append(
            f"  GPU {gpu.get('uuid', '?')}: {_num(percent, '.0f', '%')}"
            f"  memory {_bytes(gpu.get('memory_used_bytes'))} / "
            f"{_bytes(gpu.get('memory_total_bytes'))}"
        )
    lines.append("")
    lines.extend(_models(doc.get("models", ())))
    updates = doc.get("updates", {})
    lines.append("")
    poll = updates.get("poll_interval_s")
    line = f"updates: control mode {_text(updates.get('control_mode'), '?')}"
    if poll is not None:
        line += f", polling every {poll:g} s, last poll {_clock(updates.get('last_poll_s'))}"
    lines.append(line)
    for source in updates.get("sources", ()):
        reachable = {True: "reachable", False: "UNREACHABLE", None: "not synced yet"}.get(
            source.get("reachable"), "?"
        )
        lines.append(
            f"  {_text(source.get('url'), '?')}: {reachable}, "
            f"last sync {_clock(source.get('last_sync_s'))}"
            f", downloaded {_bytes(source.get('downloaded_bytes'))}"
        )
        download = source.get("download")
        if download:
            done, total = download.get("done_bytes") or 0, download.get("total_bytes") or 0
            lines.append(
                f"    downloading model '{_text(download.get('model'), '?')}' version "
                f"{_text(download.get('version'), '?')}: {_bytes(done)} / {_bytes(total)}"
                f" ({100 * done // max(total, 1)}%), {_bytes(download.get('rate_bytes_s'))}/s"
            )
        if source.get("last_error"):
            lines.append(f"    error: {source['last_error']}")
        lines.extend(f"    pending: {p}" for p in source.get("pending", ()))
    lines.extend(_model_updates(updates.get("models", ())))
    problems = list(doc.get("recent_problems", ()))
    if problems:
        lines.append("")
        lines.append("recent problems:")
        for problem in problems[-SHOWN_PROBLEMS:]:
            model = f" [{problem['model']}]" if problem.get("model") else ""
            lines.append(
                f"  {_clock(problem.get('time_s'))} {_text(problem.get('level'), '?')}{model} "
                f"{_text(problem.get('message'), '')}"
            )
        if len(problems) > SHOWN_PROBLEMS:
            more = len(problems) - SHOWN_PROBLEMS
            lines.append(f"  and {more} more problem{'s' if more > 1 else ''} (see --json)")
    return "\n".join(lines)


SHOWN_PROBLEMS = 5  # the newest; --json has every one the server keeps


def _models(models: Any) -> list[str]:
    """The model table, its columns as wide as their widest cell, and each model's reasons."""
    rows = [["MODEL", "STATE", "VERSIONS", "REQ/S", "P50 MS", "P99 MS", "ERRORS"]]
    notes: list[list[str]] = []
    for model in models:
        live = model.get("live") or {}
        versions = ",".join(
            str(v.get("version")) for v in model.get("versions", ()) if v.get("state") == "READY"
        )
        rows.append(
            [
                _text(model.get("name"), "?"),
                _text(model.get("state")),
                versions or "-",
                _num(live.get("requests_per_s"), ".1f"),
                _num(live.get("p50_ms"), ".2f"),
                _num(live.get("p99_ms"), ".2f"),
                _num(100 * float(live.get("error_rate") or 0), ".1f", "%"),
            ]
        )
        below = [
            f"  version {_text(v.get('version'), '?')} {_text(v.get('state'))}: {v['reason']}"
            for v in model.get("versions", ())
            if v.get("reason")
        ]
        fallbacks: dict[str, int] = {}
        for instance in model.get("instances", ()):
            if instance.get("reason"):
                fallbacks[instance["reason"]] = fallbacks.get(instance["reason"], 0) + 1
        below += [f"  {n} instance(s) on CPU: {why}" for why, n in fallbacks.items()]
        notes.append(below)
    lines = table(rows, right=frozenset({3, 4, 5, 6}))
    out = [lines[0]]
    for line, below in zip(lines[1:], notes, strict=True):
        out += [line, *below]
    return out


def main(argv: Sequence[str]) -> int:
    """`status ...` (argv without the command)."""
    args = parser(Parser(prog="edge-appliance status")).parse_args(list(argv))
    url = with_scheme(args.url)
    headers = parse_headers(args.header, "edge-appliance status")
    if headers is None:
        return 2
    if args.watch is not None and args.watch <= 0:
        print("edge-appliance status: --watch needs a positive number of seconds", file=sys.stderr)  # noqa: T201
        return 2
    first = True
    try:
        while True:
            try:
                doc = fetch(url, headers)
                text = json.dumps(doc, indent=2) if args.json else render(doc)
            except StatusError as exc:
                if args.watch is None or first:
                    print(f"edge-appliance status: {exc}", file=sys.stderr)  # noqa: T201
                    return 1
                # Reached before: keep watching (a restart), and say why it is not there now.
                text = f"edge-appliance status: {exc}"
            first = False
            if args.watch is None:
                print(text)  # noqa: T201
                return 0
            sys.stdout.write(f"{CLEAR}{text}\n\n(every {args.watch:g} s; Ctrl-C exits)\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0

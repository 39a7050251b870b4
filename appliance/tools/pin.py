"""`edge-appliance pin MODEL VERSION` / `edge-appliance unpin MODEL`: an operator's rollback.

Asks the running server (its HTTP endpoint) to serve one version of a model alone, whatever
the version policy, from now on: across polls, bucket changes and restarts (the pin is kept in
the model store's ledger), in every control mode. `unpin` goes back to the version policy.
The request is Triton's repository load with a parameter, so any HTTP client can send it:

    curl -X POST localhost:8000/v2/repository/models/m/load -d '{"parameters": {"pin_version": 1}}'
    curl -X POST localhost:8000/v2/repository/models/m/load -d '{"parameters": {"unpin": true}}'

(gRPC: RepositoryModelLoad with the int64 parameter `pin_version` or the bool `unpin`.)
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from appliance.flags.client import add_endpoint_flags, parse_headers, unreachable, with_scheme
from appliance.flags.parsing import Parser


def parser(p: argparse.ArgumentParser, unpin: bool) -> argparse.ArgumentParser:
    p.description = (
        "Go back to the model's version policy (undo `edge-appliance pin`)."
        if unpin
        else "Serve one version of a model alone from now on, across polls and restarts (a "
        "rollback an operator chooses); `edge-appliance unpin` undoes it."
    )
    p.add_argument("model", help="the model's name")
    if not unpin:
        p.add_argument("version", type=int, help="the version to serve alone")
    add_endpoint_flags(p, "model-repository")
    return p


def request(
    url: str, model: str, version: int | None, headers: dict[str, str], timeout_s: float = 600.0
) -> str:
    """Send the pin (version) or unpin (None) request; '' when it took, else why not."""
    parameters: dict[str, object] = {"unpin": True} if version is None else {"pin_version": version}
    target = f"{url.rstrip('/')}/v2/repository/models/{urllib.parse.quote(model, safe='')}/load"
    body = json.dumps({"parameters": parameters}).encode()
    headers = {"Content-Type": "application/json", **headers}
    sent = urllib.request.Request(target, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(sent, timeout=timeout_s):
            return ""
    except urllib.error.HTTPError as exc:
        try:
            answer = json.loads(exc.read() or b"{}")
        except ValueError:
            answer = {}
        return str(answer.get("error") or f"HTTP {exc.code} {exc.reason}")
    except (urllib.error.URLError, OSError) as exc:
        return unreachable(url, exc)


def main(argv: Sequence[str]) -> int:
    """`pin MODEL VERSION ...` or `unpin MODEL ...` (argv[0] is the command)."""
    command = argv[0]
    unpin = command == "unpin"
    args = parser(Parser(prog=f"edge-appliance {command}"), unpin).parse_args(list(argv[1:]))
    headers = parse_headers(args.header, f"edge-appliance {command}")
    if headers is None:
        return 2
    version = None if unpin else args.version
    why = request(with_scheme(args.url), args.model, version, headers)
    if why:
        print(f"edge-appliance {command}: {why}", file=sys.stderr)  # noqa: T201
        return 1
    done = "unpinned" if version is None else f"pinned to version {version}"
    print(f"model '{args.model}' {done}")  # noqa: T201
    return 0

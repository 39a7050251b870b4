"""`edge-appliance check DIR...`: would this repository serve? Answered offline, before shipping.

The check loads every model the way the server does (config read, auto-completed and
validated; manifests verified; every version's instances created, so ONNX files are parsed by
ONNX Runtime and Python models run `initialize`; warm-up samples run), prints one row per
model version with its state and the reason for every problem, and unloads. The exit status
is 0 when everything would serve, 1 when something would not.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from appliance.common.errors import ApplianceError
from appliance.common.model_config import check_config_name, read_config
from appliance.common.protojson import message_to_dict
from appliance.common.settings import ServerSettings
from appliance.common.tf_advice import TensorflowAdvice, tensorflow_advice
from appliance.flags.parsing import Parser
from appliance.frontends.http import convert
from appliance.repository.local import list_versions
from appliance.repository.manifest import ManifestPolicy, ModelSignaturePolicy
from appliance.repository.model_signature import parse_policy
from appliance.runtime.models import ModelRuntime
from appliance.runtime.registry import READY
from appliance.runtime.settings import RuntimeSettings
from appliance.services.rows import index_rows

log = logging.getLogger(__name__)


def parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Validate model repositories offline: load every model as the server would, print each "
        "version's state and the reason for every problem. Exit status 0: everything serves."
    )
    p.add_argument(
        "repositories",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="model repository folders, merged as serve merges them",
    )
    p.add_argument(
        "--strict-model-config",
        action="store_true",
        help="refuse models without a complete config.pbtxt",
    )
    p.add_argument(
        "--require-manifest",
        action="store_true",
        help="every version needs a SHA256SUMS manifest that matches it",
    )
    p.add_argument(
        "--model-signature",
        default="",
        metavar="METHOD:ARGS",
        help="verify OpenSSF model signatures as serve would (key:PUBLIC.pem, "
        "certificate:CA.pem[,MORE.pem] or sigstore:IDENTITY,ISSUER,TRUST.json)",
    )
    p.add_argument(
        "--require-model-signature",
        action="store_true",
        help="with --model-signature: every version needs a model.sig",
    )
    p.add_argument(
        "--model-config-name",
        default="",
        metavar="NAME",
        help="check with configs/NAME.pbtxt where a model has it, as serve would",
    )
    p.add_argument(
        "--show-config", action="store_true", help="also print each model's completed config"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def runtime_settings(
    repositories: tuple[Path, ...],
    strict: bool,
    require_manifest: bool,
    config_name: str = "",
    model_signature: ModelSignaturePolicy | None = None,
) -> RuntimeSettings:
    """The runtime `serve` would run with these flags (one model loads at a time)."""
    server = ServerSettings(
        model_repositories=repositories,
        strict_model_config=strict,
        require_manifest=require_manifest,
        model_config_name=config_name,
    )
    manifest = ManifestPolicy(require_manifest, None, model_signature)
    return dataclasses.replace(
        RuntimeSettings.from_server(server, manifest=manifest), load_concurrency=1
    )


async def check(
    repositories: tuple[Path, ...],
    strict: bool,
    require_manifest: bool,
    config_name: str = "",
    model_signature: ModelSignaturePolicy | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The repository index after loading everything, and each loaded model's config."""
    settings = runtime_settings(
        repositories, strict, require_manifest, config_name, model_signature
    )
    runtime = ModelRuntime(settings)
    try:
        await runtime.load_all()
        configs = {}
        for served in runtime.ready_versions():
            configs[served.name] = message_to_dict(served.config)
        rows = index_rows(runtime.registry.records(), runtime.pending())
        return convert.repository_index(rows), configs
    finally:
        await runtime.stop(settings.drain_timeout_s)


def conversions(
    repositories: tuple[Path, ...], config_name: str = ""
) -> dict[str, TensorflowAdvice]:
    """Model name -> how to convert it, for each TensorFlow model in the repositories."""
    found: dict[str, TensorflowAdvice] = {}
    for repo in repositories:
        if not repo.is_dir():
            continue
        for model_dir in sorted(p for p in repo.iterdir() if p.is_dir()):
            try:
                config, _ = read_config(model_dir, config_name)
            except ApplianceError:
                continue  # the load reports the broken config
            advice = tensorflow_advice(config, model_dir, list_versions(model_dir))
            if advice is not None:
                found[model_dir.name] = advice
    return found


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


def main(argv: Sequence[str]) -> int:
    args = parser(Parser(prog="edge-appliance check")).parse_args(list(argv))
    logging.basicConfig(level=logging.ERROR, format="%(message)s", stream=sys.stderr)
    try:
        config_name = check_config_name(args.model_config_name) if args.model_config_name else ""
        signature = parse_policy(args.model_signature, args.require_model_signature)
    except ValueError as exc:
        print(f"edge-appliance check: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    repositories = tuple(args.repositories)
    try:
        index, configs = asyncio.run(
            check(
                repositories,
                args.strict_model_config,
                args.require_manifest,
                config_name,
                signature,
            )
        )
    except ApplianceError as exc:  # e.g. not a folder, a model name in two repositories
        print(f"edge-appliance check: {exc.message}", file=sys.stderr)  # noqa: T201
        return 1
    serves = bool(index) and all(entry.get("state", "") == READY for entry in index)
    served = {entry["name"] for entry in index if entry.get("state", "") == READY}
    tensorflow = {
        name: advice
        for name, advice in conversions(repositories, config_name).items()
        if name not in served  # e.g. a model.onnx beside the SavedModel is served
    }
    if args.json:
        result: dict[str, Any] = {"serves": serves, "models": index}
        if tensorflow:
            result["conversions"] = {
                name: {
                    "platform": a.platform,
                    "command": a.command,
                    "config_change": a.config_change,
                }
                for name, a in tensorflow.items()
            }
        if args.show_config:
            result["configs"] = configs
        print(json.dumps(result, indent=2))  # noqa: T201
        return 0 if serves else 1
    rows = [["MODEL", "VERSION", "STATE", "BACKEND", "REASON"]]
    for entry in index:
        config = configs.get(entry["name"], {})
        backend = config.get("backend") or config.get("platform") or "-"
        reason = entry.get("reason") or ""  # READY entries have none
        advice = tensorflow.get(entry["name"])
        if advice is not None and entry.get("state", "") != READY:
            backend = advice.platform
            reason = f"a TensorFlow {advice.kind}, not run here: convert it to ONNX (below)"
        state = entry.get("state", "")
        rows.append([entry["name"], entry.get("version", "-"), state, backend, reason])
    if len(rows) == 1:
        print("no models found in " + ", ".join(map(str, args.repositories)))  # noqa: T201
        return 1
    print(_table(rows))  # noqa: T201
    for name, advice in tensorflow.items():
        print(  # noqa: T201
            f"\n{name}: TensorFlow {advice.kind}. Convert it to ONNX (pip install tf2onnx "
            f"tensorflow):\n  {advice.command}\nthen {advice.config_change}."
        )
    if args.show_config:
        for name, config in sorted(configs.items()):
            print(f"\n# {name} (completed config)\n{json.dumps(config, indent=2)}")  # noqa: T201
    failed = sum(1 for entry in index if entry.get("state", "") != READY)
    print(  # noqa: T201
        f"\n{'OK' if serves else 'NOT OK'}: {len(index) - failed} of {len(index)} model "
        "versions would serve"
    )
    return 0 if serves else 1

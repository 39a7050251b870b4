"""`edge-appliance fleet publish | advance | halt | rollback | resume | status` (docs/fleet.md),
and TUF metadata mode's `keys | sign | timestamp | rotate` (docs/model-updates.md).

Every command takes the bucket location the devices poll (their --model-repository) and the
AWS credentials from the environment, as the server does. Exit status: 0 done, 1 the bucket or
the fleet's state refused (the reason on stderr), 2 a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from appliance.common import extras
from appliance.flags.parsing import Parser
from appliance.fleet import control, operator, publish, view
from appliance.fleet.bucket import FleetBucket, FleetError
from appliance.repository.manifest import ManifestError, load_private_key

PROG = "edge-appliance fleet"


class _StageSpec(argparse.Action):
    """--stages and --stage-labels append to one list, in the order given."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        specs = list(getattr(namespace, "stage_specs", None) or [])
        if option == "--stages":
            specs += [s for s in str(values).split(",") if s.strip()]
        else:
            specs.append(str(values))
        namespace.stage_specs = specs


def _common(p: argparse.ArgumentParser, model: bool = True) -> None:
    p.add_argument("url", metavar="BUCKET_URL", help="the devices' s3:// --model-repository")
    if model:
        p.add_argument("model", metavar="MODEL", help="the model's name in the bucket")


def _key_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sign-key",
        type=Path,
        metavar="PEM",
        help="Ed25519 private key: sign the rollout document (and the manifest); needed once "
        "the document is signed",
    )


def _tuf_flag(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "--tuf-keys",
        type=Path,
        required=required,
        metavar="KEYDIR",
        help="the TUF keys folder `fleet keys` made: sign the bucket's TUF metadata with it"
        + ("" if required else " after the upload (devices with --model-repository-tuf-root)"),
    )


def _tuf_commands(sub: Any) -> None:
    keys = _command(sub, "keys", "create TUF keys for every role and root version 1")
    keys.add_argument("keydir", type=Path, metavar="KEYDIR", help="a new folder for the keys")
    for role in ("root", "targets", "snapshot", "timestamp"):
        keys.add_argument(
            f"--{role}-threshold",
            type=int,
            default=1,
            metavar="N",
            help=f"signatures the {role} role needs (that many keys are made; default 1)",
        )
    sign = _command(sub, "sign", "make every model file a TUF target and sign new metadata")
    _common(sign, model=False)
    _tuf_flag(sign)
    sign.add_argument("--force", action="store_true", help="sign even when nothing changed")
    ts = _command(sub, "timestamp", "sign a fresh TUF timestamp (devices freeze once it expires)")
    _common(ts, model=False)
    _tuf_flag(ts)
    ts.add_argument(
        "--expires-hours",
        type=float,
        default=24.0,
        metavar="HOURS",
        help="how long it stays valid (default 24)",
    )
    rot = _command(sub, "rotate", "replace a TUF role's keys through a new root version")
    _common(rot, model=False)
    _tuf_flag(rot)
    rot.add_argument(
        "--role",
        required=True,
        choices=("root", "targets", "snapshot", "timestamp"),
        help="the role whose keys are replaced (its old keys are revoked)",
    )
    rot.add_argument("--threshold", type=int, metavar="N", help="the role's new threshold")


def _run_tuf(args: argparse.Namespace) -> list[str] | None:
    """The TUF commands (appliance/fleet/tuf_keys.py); None for any other."""
    command = args.fleet_command
    if command not in ("keys", "sign", "timestamp", "rotate"):
        return None
    try:
        from appliance.fleet import tuf_keys
    except ImportError as exc:
        raise FleetError(f"the TUF commands need python-tuf: {extras.how_to_get('tuf')}") from exc
    if command == "keys":
        thresholds = {r: getattr(args, f"{r}_threshold") for r in tuf_keys.ROLES}
        return tuf_keys.create_keys(args.keydir, thresholds)
    bucket = FleetBucket(args.url)
    if command == "sign":
        return tuf_keys.sign_bucket(bucket, args.tuf_keys, force=args.force)
    if command == "timestamp":
        if not args.expires_hours > 0:
            raise FleetError(f"--expires-hours must be above 0, got {args.expires_hours:g}")
        hours = datetime.timedelta(hours=args.expires_hours)
        return tuf_keys.refresh_timestamp(bucket, args.tuf_keys, hours)
    return tuf_keys.rotate(bucket, args.tuf_keys, args.role, args.threshold)


def _command(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
    command: argparse.ArgumentParser = sub.add_parser(
        name, help=text, description=text[0].upper() + text[1:] + " (docs/fleet.md)."
    )
    return command


def parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Staged model rollouts from the bucket the devices poll: publish a version, advance, "
        "halt, roll back or resume its rollout, and see which device serves what; and TUF "
        "metadata for it: keys, sign, timestamp, rotate (docs/model-updates.md)."
    )
    sub = p.add_subparsers(dest="fleet_command", required=True, metavar="COMMAND")
    pub = _command(sub, "publish", "upload a version and write its rollout document")
    _common(pub)
    pub.add_argument("folder", type=Path, metavar="DIR", help="the version's folder")
    pub.add_argument(
        "--version", type=int, required=True, metavar="N", help="the version number (required)"
    )
    pub.add_argument(
        "--model-files",
        type=Path,
        metavar="DIR",
        help="a folder of the model's files beside its version folders (config.pbtxt, "
        "labels, ...): listed in the model-level SHA256SUMS (signed with --sign-key: devices "
        "with --manifest-public-key take no model-level file it does not list) and uploaded "
        "before the version",
    )
    _key_flag(pub)
    _tuf_flag(pub, required=False)
    pub.add_argument(
        "--stages",
        action=_StageSpec,
        metavar="P,P,...",
        help="percent stages, e.g. 1,10,50,100 (the default)",
    )
    pub.add_argument(
        "--stage-labels",
        action=_StageSpec,
        metavar="KEY=VALUE[|VALUE][,KEY=VALUE]",
        help="a stage of the devices with these labels (repeatable; with --stages, in the "
        "order given)",
    )
    pub.add_argument("--start", action="store_true", help="start at stage 0 (default: -1)")
    pub.add_argument("--baseline", type=int, metavar="N", help="override the baseline version")
    pub.add_argument(
        "--probation-window",
        type=int,
        default=50,
        metavar="REQUESTS",
        help="requests a device watches the new version for (default 50; 0: the devices' flags)",
    )
    pub.add_argument(
        "--probation-max-error-rate",
        type=float,
        default=0.05,
        metavar="RATE",
        help="error rate that fails a device's probation (default 0.05)",
    )
    pub.add_argument(
        "--probation-max-latency-ratio",
        type=float,
        metavar="RATIO",
        help="fail a device's probation when the version's median latency over the window is "
        "over RATIO times the replaced version's (at least 1; default: latency not judged)",
    )
    pub.add_argument(
        "--halt-max-failed-share",
        type=float,
        default=0.2,
        metavar="SHARE",
        help="halt when more than this share of the verdicts failed (default 0.2)",
    )
    pub.add_argument(
        "--halt-min-verdicts",
        type=int,
        default=2,
        metavar="N",
        help="... and at least N devices failed (default 2)",
    )
    pub.add_argument(
        "--no-halt-rollback",
        action="store_true",
        help="on a halt, devices on the version keep it (default: they go back)",
    )
    pub.add_argument(
        "--auto",
        action="store_true",
        help="advance: auto: the devices (and `fleet operator`) move the stages by their rules",
    )
    pub.add_argument(
        "--soak-s",
        type=float,
        metavar="SECONDS",
        help="with --auto: each stage runs at least this long (default 0)",
    )
    pub.add_argument(
        "--min-verdicts",
        type=int,
        metavar="N",
        help="with --auto: each stage needs N verdicts of the version in all (default 1)",
    )
    pub.add_argument(
        "--min-passed-share",
        type=float,
        metavar="SHARE",
        help="with --auto: ... of which this share passed, else it halts (default 1)",
    )
    pub.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="a JSON object of the self-running rollout's fields: advance, windows, budget, "
        "defer, shadow, stage_rules (docs/fleet.md)",
    )
    adv = _command(sub, "advance", "move the rollout to the next stage (or --to INDEX)")
    _common(adv)
    adv.add_argument(
        "--to", type=int, metavar="INDEX", help="the stage to move to (default: the next one)"
    )
    adv.add_argument(
        "--force",
        action="store_true",
        help="advance a halted rollout's document too (devices still keep off the version)",
    )
    _key_flag(adv)
    for name, text in (
        ("halt", "stop the rollout: no device takes the version; devices on it keep it"),
        ("rollback", "stop the rollout and take the devices on the version back to the baseline"),
    ):
        cmd = _command(sub, name, text)
        _common(cmd)
        cmd.add_argument("--reason", default="", help="said in the document and `fleet status`")
        _key_flag(cmd)
    res = _command(sub, "resume", "undo a halt or rollback: the rollout goes on")
    _common(res)
    res.add_argument(
        "--clear-verdicts",
        action="store_true",
        help="delete the version's failed verdicts (else a rollout they halted stays halted)",
    )
    res.add_argument("--no-halt-rollback", action="store_true", help="as for publish")
    _key_flag(res)
    op = _command(sub, "operator", "move automatic rollouts along by their rules, in a loop")
    _common(op, model=False)
    op.add_argument("--model", help="only this model")
    op.add_argument(
        "--interval", type=float, default=30.0, metavar="SECONDS", help="between rounds (30)"
    )
    op.add_argument("--rounds", type=int, metavar="N", help="stop after N rounds (default: never)")
    st = _command(sub, "status", "versions x devices, per label, from the reports")
    _common(st, model=False)
    st.add_argument("--model", help="only this model")
    st.add_argument("--by", default="", metavar="LABEL", help="one row group per value, e.g. site")
    st.add_argument(
        "--silent-after",
        type=float,
        default=view.DEFAULT_SILENT_AFTER_S,
        metavar="SECONDS",
        help="a device is silent when its report is older "
        f"(default {view.DEFAULT_SILENT_AFTER_S:g})",
    )
    st.add_argument(
        "--devices",
        action="store_true",
        help="also one line per device and model: what it serves, its probation and why",
    )
    st.add_argument("--json", action="store_true", help="print it as one JSON object")
    _tuf_commands(sub)
    return p


def run(args: argparse.Namespace) -> list[str]:
    """Carry out a parsed command; the lines to print. Raises FleetError."""
    tuf_lines = _run_tuf(args)
    if tuf_lines is not None:
        return tuf_lines
    key = None
    if getattr(args, "sign_key", None) is not None:
        try:
            key = load_private_key(args.sign_key)
        except ManifestError as exc:
            raise FleetError(str(exc)) from None
    bucket = FleetBucket(args.url)
    command = args.fleet_command
    if command == "publish":
        plan = publish.Plan(
            model=args.model,
            version=args.version,
            folder=args.folder,
            stages=getattr(args, "stage_specs", None) or publish.DEFAULT_STAGES,
            start=args.start,
            baseline=args.baseline,
            probation=(
                args.probation_window,
                args.probation_max_error_rate,
                args.probation_max_latency_ratio,
            )
            if args.probation_window > 0
            else None,
            halt=(args.halt_max_failed_share, args.halt_min_verdicts, not args.no_halt_rollback),
            model_files=args.model_files,
            tuf_keys=args.tuf_keys,
            policy=_policy(args),
        )
        return publish.publish(bucket, plan, key)
    if command == "advance":
        return [control.advance(bucket, args.model, args.to, key, args.force)]
    if command in ("halt", "rollback"):
        return [control.halt(bucket, args.model, args.reason, key, command == "rollback")]
    if command == "resume":
        rollback = not args.no_halt_rollback
        return [control.resume(bucket, args.model, key, args.clear_verdicts, rollback)]
    if command == "operator":
        operator.loop(bucket, args.model, args.interval, args.rounds, _say)
        return []
    fleet = view.summarize(view.gather(bucket, args.model), args.by, args.silent_after)
    if args.json:
        return [json.dumps(view.as_json(fleet), indent=2)]
    return [view.render(fleet), *(["", view.render_devices(fleet)] if args.devices else [])]


def _say(line: str) -> None:
    print(line, flush=True)  # noqa: T201


def _policy(args: argparse.Namespace) -> dict[str, Any]:
    """--policy's object, with --auto / --soak-s / --min-verdicts / --min-passed-share."""
    policy: dict[str, Any] = {}
    if args.policy is not None:
        try:
            policy = json.loads(args.policy.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FleetError(f"--policy {args.policy}: {exc}") from None
        if not isinstance(policy, dict):
            raise FleetError(f"--policy {args.policy}: not a JSON object")
    if args.auto:
        policy["advance"] = "auto"
    rule = {
        key: value
        for key, value in (
            ("soak_s", args.soak_s),
            ("min_verdicts", args.min_verdicts),
            ("min_passed_share", args.min_passed_share),
        )
        if value is not None
    }
    if rule:
        stages = len(getattr(args, "stage_specs", None) or publish.DEFAULT_STAGES)
        policy["stage_rules"] = [dict(rule) for _ in range(stages)]
    return policy


def main(argv: Sequence[str]) -> int:
    args = parser(Parser(prog=PROG)).parse_args(list(argv))
    try:
        lines = run(args)
    except FleetError as exc:
        print(f"{PROG} {args.fleet_command}: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    for line in lines:
        print(line)  # noqa: T201
    return 0

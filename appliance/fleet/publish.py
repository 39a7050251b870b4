"""`fleet publish`: a new version into the bucket and a rollout document that targets it.

The order makes every moment safe for a device that polls in between:

1. the rollout document with the new target at stage -1 (nobody takes it) — so even a model that
   had no document yet never sees the version appear under today's "newest wins" policy;
2. with --model-files, the model-level files (config.pbtxt, labels, ...: what devices with
   --manifest-public-key take only when the model's own signed manifest lists them), their
   SHA256SUMS.sig, then their SHA256SUMS;
3. the version's files, then SHA256SUMS.sig, then SHA256SUMS last: a device takes a version only
   once every file its manifest lists is there and matches (appliance/repository/s3.py);
4. with --tuf-keys, the TUF metadata signed over the bucket's files (targets, snapshot, then
   the timestamp last: what TUF-mode devices take starts here);
5. with --start, the next revision at stage 0.

The first version of a model (nothing to roll out from) is uploaded without a document.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.fleet import control
from appliance.fleet.bucket import FleetBucket, FleetError
from appliance.repository import rollout
from appliance.repository.manifest import (
    MANIFEST,
    SIGNATURE,
    ManifestError,
    files_in,
    model_level_files,
    write_manifest,
    write_model_manifest,
)
from appliance.repository.rollout import RolloutDocument, RolloutError

DEFAULT_STAGES = ("1", "10", "50", "100")
_VERSION_KEY = re.compile(r"^(\d+)/")
NO_VERDICTS = rollout.VerdictCount(0, 0)


@dataclass(frozen=True)
class Plan:
    """What `publish` was asked for (from the flags)."""

    model: str
    version: int
    folder: Path
    stages: Sequence[str]  # "10" (percent) or "site=berlin|munich,hw=orin" (labels)
    start: bool
    baseline: int | None = None
    # window_requests, max_error_rate, max_latency_ratio (None: latency not judged)
    probation: tuple[int, float, float | None] | None = (50, 0.05, None)
    halt: tuple[float, int, bool] = (0.2, 2, True)  # max_failed_share, min_verdicts, rollback
    # --model-files: the folder of the files beside the version folders (config.pbtxt, ...)
    model_files: Path | None = None
    # --tuf-keys: sign the bucket's TUF metadata after the upload (tuf_keys.py)
    tuf_keys: Path | None = None
    # A rollout that runs itself (docs/fleet.md): any of "advance", "windows", "budget",
    # "defer", "shadow", and "stage_rules" (one object per stage, merged into it).
    policy: dict[str, Any] = dataclasses.field(default_factory=dict)


def stage_json(spec: str) -> dict[str, Any]:
    """One stage from its flag text: '10' or 'site=berlin|munich,hw=orin-nano'."""
    spec = spec.strip()
    if "=" not in spec:
        try:
            return {"percent": float(spec)}
        except ValueError:
            raise FleetError(
                f"stage {spec!r} is neither a percentage nor key=value labels"
            ) from None
    labels: dict[str, Any] = {}
    for item in spec.split(","):
        key, _, values = item.partition("=")
        accepted = values.split("|")
        labels[key.strip()] = accepted[0] if len(accepted) == 1 else accepted
    return {"labels": labels}


def document_for(plan: Plan, revision: int, baseline: int, stage: int) -> RolloutDocument:
    raw: dict[str, Any] = {
        "format": rollout.FORMAT,
        "model": plan.model,
        "revision": revision,
        "target": plan.version,
        "baseline": baseline,
        "stages": [stage_json(s) for s in plan.stages],
        "stage": stage,
        "halt": dict(zip(("max_failed_share", "min_verdicts", "rollback"), plan.halt, strict=True)),
        "halted": False,
        "reason": "",
    }
    policy = dict(plan.policy)
    rules = policy.pop("stage_rules", None)
    if rules is not None:
        if not isinstance(rules, list) or len(rules) != len(raw["stages"]):
            raise FleetError(
                f"model '{plan.model}': stage_rules must be a list of one object per stage "
                f"({len(raw['stages'])})"
            )
        for stage_raw, rule in zip(raw["stages"], rules, strict=True):
            if not isinstance(rule, dict):
                raise FleetError(f"model '{plan.model}': stage_rules entries must be objects")
            stage_raw.update(rule)
    unknown = sorted(set(policy) - {"advance", "windows", "budget", "defer", "shadow"})
    if unknown:
        raise FleetError(f"model '{plan.model}': the policy has unknown key(s) {unknown}")
    raw.update(policy)
    if plan.probation is not None:
        window, rate, ratio = plan.probation
        raw["probation"] = {"window_requests": window, "max_error_rate": rate}
        if ratio is not None:
            raw["probation"]["max_latency_ratio"] = ratio
    try:
        return rollout.from_mapping(raw)
    except RolloutError as exc:
        raise FleetError(f"model '{plan.model}': {exc}") from None


def remote_versions(bucket: FleetBucket, model: str) -> set[int]:
    objects, _ = bucket.listing(f"{model}/")
    base = bucket.key(f"{model}/")
    found = set()
    for obj in objects:
        match = _VERSION_KEY.match(obj.key[len(base) :])
        if match and str(int(match.group(1))) == match.group(1) and int(match.group(1)) > 0:
            found.add(int(match.group(1)))
    return found


def choose_baseline(
    plan: Plan,
    current: RolloutDocument | None,
    versions: set[int],
    verdicts: rollout.VerdictCount = NO_VERDICTS,
) -> tuple[int | None, str]:
    """The version devices outside the stage serve, and why it was chosen. `verdicts`: the
    current target's; a rollout they halted is not completed, even at its last stage."""
    if plan.baseline is not None:
        if plan.baseline not in versions:
            raise FleetError(f"--baseline {plan.baseline}: no such version in the bucket")
        return plan.baseline, "--baseline"
    if current is not None:
        if current.target == plan.version:
            return current.baseline, "the current document's baseline"
        halted = rollout.halted(current, verdicts.passed, verdicts.failed)
        if current.stage == len(current.stages) - 1 and not halted:
            return current.target, f"version {current.target}'s rollout completed"
        return current.baseline, (
            f"version {current.target}'s rollout was "
            f"{'halted' if halted else 'not completed'}, so its baseline stays"
        )
    others = sorted(v for v in versions if v != plan.version)
    if others:
        return others[-1], "the highest version in the bucket"
    return None, ""


def check_folder(plan: Plan) -> None:
    if not plan.folder.is_dir():
        raise FleetError(f"'{plan.folder}' is not a folder")
    if not [f for f in files_in(plan.folder) if f not in (MANIFEST, SIGNATURE)]:
        raise FleetError(f"'{plan.folder}' has no files to publish")
    try:
        rollout.check_model_name(plan.model)
    except RolloutError as exc:
        raise FleetError(f"MODEL: {exc}") from None
    if plan.version < 1:
        raise FleetError(f"--version must be a positive integer, got {plan.version}")
    if plan.model_files is not None and not plan.model_files.is_dir():
        raise FleetError(f"--model-files '{plan.model_files}' is not a folder")


def prepare(bucket: FleetBucket, plan: Plan, key: Any, already: bool) -> None:
    """Write the manifest (and signature) into the folder. `already`: the bucket holds this
    version; its manifest must be ours (a resumed upload), checked before anything is written."""
    try:
        manifest = write_manifest(plan.folder, key)
    except ManifestError as exc:
        raise FleetError(str(exc)) from None
    if already:
        theirs = bucket.get(f"{plan.model}/{plan.version}/{MANIFEST}")
        if theirs is not None and theirs != manifest.read_bytes():
            raise FleetError(
                f"model '{plan.model}' version {plan.version} is already in the bucket with "
                "other content; publish it under a new version number (devices keep "
                "verdicts per version)"
            )


def upload_model_files(bucket: FleetBucket, plan: Plan, key: Any) -> int:
    """--model-files: write their model-level manifest (signed with the key) and upload them,
    the manifest last; how many files."""
    folder = plan.model_files
    if folder is None:
        return 0
    try:
        write_model_manifest(folder, key)
    except ManifestError as exc:
        raise FleetError(f"--model-files: {exc}") from None
    names = [f for f in model_level_files(folder) if f not in (MANIFEST, SIGNATURE)]
    if key is not None:
        names.append(SIGNATURE)
    for name in [*names, MANIFEST]:
        bucket.put_file(f"{plan.model}/{name}", folder / name)
    return len(names) + 1


def upload(bucket: FleetBucket, plan: Plan, key: Any) -> int:
    """Upload the model-level files (--model-files), then the prepared folder, each manifest
    last; how many files."""
    count = upload_model_files(bucket, plan, key)
    prefix = f"{plan.model}/{plan.version}/"
    names = [f for f in files_in(plan.folder) if f not in (MANIFEST, SIGNATURE)]
    if key is not None:
        names.append(SIGNATURE)
    for name in [*names, MANIFEST]:
        bucket.put_file(prefix + name, plan.folder / name)
    return count + len(names) + 1


def sign_tuf(bucket: FleetBucket, plan: Plan) -> list[str]:
    """--tuf-keys: the uploaded files become targets (hashed from the local copies), then new
    TUF metadata; the lines to print ([] without the flag)."""
    if plan.tuf_keys is None:
        return []
    from appliance.fleet import tuf_keys

    local = {f"{plan.model}/{plan.version}/{n}": plan.folder / n for n in files_in(plan.folder)}
    if plan.model_files is not None:
        local.update(
            {
                f"{plan.model}/{rel}": path
                for rel, path in model_level_files(plan.model_files).items()
            }
        )
    return tuf_keys.sign_bucket(bucket, plan.tuf_keys, local=local)


def publish(bucket: FleetBucket, plan: Plan, key: Any) -> list[str]:
    """Do it; the lines to print."""
    check_folder(plan)
    for spec in plan.stages:
        stage_json(spec)
    current = control.read(bucket, plan.model)
    control.require_key(plan.model, current, key)
    versions = remote_versions(bucket, plan.model)
    verdicts = NO_VERDICTS
    if current.document is not None and current.document.target != plan.version:
        verdicts = control.verdicts(bucket, plan.model, current.document.target)
    baseline, why = choose_baseline(plan, current.document, versions, verdicts)
    prepare(bucket, plan, key, plan.version in versions)
    lines = []
    if baseline is None:
        count = upload(bucket, plan, key)
        lines.append(
            f"model '{plan.model}' version {plan.version}: {count} files uploaded; the model's "
            "first version, so no rollout document: every device takes it"
        )
        return lines + sign_tuf(bucket, plan)
    revision = current.document.revision + 1 if current.document is not None else 1
    document = document_for(plan, revision, baseline, -1)
    if current.document is not None and current.document == repeated(document, current):
        document = current.document  # the same publish again: resume the upload
    else:
        current = control.write(bucket, document, key, current)
    count = upload(bucket, plan, key)
    lines.append(
        f"model '{plan.model}' version {plan.version}: {count} files uploaded; baseline "
        f"{baseline} ({why})"
    )
    lines += sign_tuf(bucket, plan)
    if plan.start and document.stage < 0:
        document = control.change(document, stage=0)
        control.write(bucket, document, key, current)
    lines.append(
        f"rollout revision {document.revision}: version {plan.version} at "
        f"{control.describe_stage(document)}"
        + ("" if plan.start else "; `fleet advance` starts it")
    )
    return lines


def repeated(document: RolloutDocument, current: control.Current) -> RolloutDocument:
    """`document` with the current revision and stage: equal to the current document when a
    publish is repeated (a resumed upload writes no new revision)."""
    assert current.document is not None
    return dataclasses.replace(
        document, revision=current.document.revision, stage=current.document.stage
    )

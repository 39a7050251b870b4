"""Changing a running rollout: advance, halt, roll back, resume (one new revision each).

Every change reads the model's rollout.json (and its signature) with their ETags and writes the
next revision as a compare-and-swap: the signature first, only over the one read, then the
document, only over the one read. The signature's condition is the lock: of two operators who
read the same revision, the second to write fails before touching anything, and a device never
acts on a document whose signature is still to come. The document is read back at the end (the
only check on a store without conditional writes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from appliance.fleet.bucket import Conflict, FleetBucket, FleetError
from appliance.repository import rollout
from appliance.repository.rollout import HaltRule, RolloutDocument, RolloutError
from appliance.repository.rollout_policy import (
    AUTO,
    PROGRESS,
    PolicyError,
    Progress,
    StageCheck,
    check_stage,
)

# The contract's example thresholds (docs/fleet.md); publish's defaults.
DEFAULT_HALT = HaltRule(max_failed_share=0.2, min_verdicts=2, rollback=True)


@dataclasses.dataclass(frozen=True)
class Current:
    """A model's rollout document as the bucket holds it."""

    document: RolloutDocument | None  # with an automatic rollout's progress folded in
    signed: bool
    etag: str = ""  # the document's ("" : none)
    signature_etag: str = ""  # its signature's ("" : none)
    # An automatic rollout (`advance: auto`): the progress object, its ETag ("" : none), when
    # the current stage began and the bucket's clock at the read.
    progress: Progress | None = None
    progress_etag: str = ""
    stage_started_s: float | None = None
    now_s: float = 0.0
    written: RolloutDocument | None = None  # the document as written (no progress folded in)


def rollout_rel(model: str) -> str:
    return f"{model}/{rollout.ROLLOUT}"


def signature_rel(model: str) -> str:
    return f"{model}/{rollout.ROLLOUT_SIGNATURE}"


def progress_rel(model: str) -> str:
    return f"{model}/{PROGRESS}"


def read(bucket: FleetBucket, model: str) -> Current:
    entry = bucket.read_object(rollout_rel(model))
    signature = bucket.read(signature_rel(model))
    signature_etag = signature[1] if signature is not None else ""
    if entry is None:
        return Current(None, False, "", signature_etag)
    try:
        document = RolloutDocument.parse(entry.data, model)
    except RolloutError as exc:
        raise FleetError(f"{bucket.url}: {model}/{rollout.ROLLOUT}: {exc}") from None
    current = Current(
        document,
        signature is not None,
        entry.etag,
        signature_etag,
        stage_started_s=entry.modified_s,
        now_s=entry.now_s,
        written=document,
    )
    if document.advance != AUTO:
        return current
    found = bucket.read_object(progress_rel(model))
    if found is None:
        return current
    try:
        progress = Progress.parse(found.data, model)
    except PolicyError:  # a bad one is overwritten by the next advance (over its ETag)
        return dataclasses.replace(current, progress_etag=found.etag)
    moved = rollout.effective(document, progress)
    return dataclasses.replace(
        current,
        document=moved,
        progress=progress,
        progress_etag=found.etag,
        stage_started_s=found.modified_s if moved.stage > document.stage else entry.modified_s,
        now_s=found.now_s,
    )


def stage_check(current: Current, count: rollout.VerdictCount) -> StageCheck | None:
    """An automatic rollout's stage: whether it advances, halts or waits, and why."""
    document, written = current.document, current.written
    if document is None or written is None or written.advance != AUTO:
        return None
    in_stage_s = current.now_s - (current.stage_started_s or current.now_s)
    return check_stage(
        document.stage,
        len(document.stages),
        document.stages[max(document.stage, 0)].advance_rule,
        count.passed,
        count.failed,
        in_stage_s,
        document.halted,
        rollout.halted(document, count.passed, count.failed),
    )


def write(bucket: FleetBucket, document: RolloutDocument, key: Any, current: Current) -> Current:
    """Write a revision over `current` (signed with the Ed25519 private key `key`, or unsigned);
    what the bucket holds then. FleetError when another writer came first."""
    require_key(document.model, current, key)
    data = document.to_json()
    raced = (
        f"model '{document.model}': {rollout.ROLLOUT} changed since revision "
        f"{current.document.revision if current.document else 0} was read (another operator?); "
        "run `fleet status` and retry"
    )
    signature_etag = current.signature_etag
    try:
        if key is not None:
            signature_etag = bucket.put(
                signature_rel(document.model), key.sign(data), current.signature_etag
            )
        etag = bucket.put(rollout_rel(document.model), data, current.etag)
    except Conflict:
        raise FleetError(raced) from None
    if bucket.get(rollout_rel(document.model)) != data:
        raise FleetError(raced)
    return Current(document, key is not None or current.signed, etag, signature_etag)


def require_key(model: str, current: Current, key: Any) -> None:
    if key is None and current.signed:
        raise FleetError(
            f"model '{model}': the rollout document in the bucket is signed; pass --sign-key "
            "(devices with --manifest-public-key ignore an unsigned one)"
        )


def change(document: RolloutDocument, **fields: Any) -> RolloutDocument:
    """The next revision with these fields changed (RolloutError becomes FleetError)."""
    try:
        return dataclasses.replace(document, revision=document.revision + 1, **fields)
    except RolloutError as exc:
        raise FleetError(str(exc)) from None


def verdicts(bucket: FleetBucket, model: str, version: int) -> rollout.VerdictCount:
    listed = rollout.verdict_prefix(bucket.prefix, model, version)
    objects, _ = bucket.listing(listed[len(bucket.prefix) :])
    return rollout.count_verdicts(listed, (o.key for o in objects))


def existing(bucket: FleetBucket, model: str) -> Current:
    current = read(bucket, model)
    if current.document is None:
        raise FleetError(
            f"model '{model}' has no {rollout.ROLLOUT} in {bucket.url} (`fleet publish` first)"
        )
    return current


def describe_stage(document: RolloutDocument, index: int | None = None) -> str:
    """'stage 1 of 4 (10%)', 'not started'."""
    index = document.stage if index is None else index
    if index < 0:
        return "not started (stage -1)"
    stage = document.stages[index]
    if stage.percent is not None:
        what = f"{stage.percent:g}%"
    else:
        what = ", ".join(f"{k}={'|'.join(v)}" for k, v in stage.labels)
    return f"stage {index} of {len(document.stages) - 1} ({what})"


def advance(bucket: FleetBucket, model: str, to: int | None, key: Any, force: bool = False) -> str:
    """The next stage (or `to`). A halted rollout is refused unless `force`: the document then
    moves on, and devices still keep off the target while it is halted (what an automated
    pipeline that advances on a timer gets)."""
    current = existing(bucket, model)
    document = current.document
    assert document is not None
    note = ""
    if document.halted:
        why = (
            f"model '{model}': the rollout of version {document.target} is halted "
            f"({document.reason or 'no reason given'})"
        )
        if not force:
            raise FleetError(f"{why}; `fleet resume` first")
        note = "; halted: no device takes it"
    count = verdicts(bucket, model, document.target)
    if not note and rollout.halted(document, count.passed, count.failed):
        why = (
            f"model '{model}': the rollout of version {document.target} halted itself: "
            f"{count.failed} of {count.passed + count.failed} verdicts failed"
        )
        if not force:
            raise FleetError(f"{why}; publish a fixed version (or `fleet resume --clear-verdicts`)")
        note = "; halted by the fleet's verdicts: no device takes it"
    last = len(document.stages) - 1
    index = document.stage + 1 if to is None else to
    if index > last:
        raise FleetError(
            f"model '{model}': already at its last stage ({describe_stage(document)})"
            if to is None
            else f"model '{model}': --to {to}: the rollout has stages 0 to {last}"
        )
    if index <= document.stage:
        raise FleetError(
            f"model '{model}': --to {to} is not past the current {describe_stage(document)}; "
            "a lower stage would take devices back (use `fleet rollback` for that)"
        )
    new = change(document, stage=index)
    write(bucket, new, key, current)
    return (
        f"model '{model}': version {new.target} now at {describe_stage(new)} "
        f"(revision {new.revision}){note}"
    )


def halt(bucket: FleetBucket, model: str, reason: str, key: Any, rollback: bool) -> str:
    """halted: true; `rollback` says whether devices on the target go back to the baseline."""
    current = existing(bucket, model)
    document = current.document
    assert document is not None
    rule = dataclasses.replace(document.halt or DEFAULT_HALT, rollback=rollback)
    what = "rolled back" if rollback else "halted"
    new = change(document, halted=True, halt=rule, reason=reason or f"{what} by an operator")
    write(bucket, new, key, current)
    where = (
        f"devices on version {new.target} go back to {new.baseline}"
        if rollback
        else f"devices on version {new.target} keep it, no other device takes it"
    )
    return f"model '{model}': rollout of version {new.target} {what}: {where} " + (
        f"(revision {new.revision})"
    )


def resume(bucket: FleetBucket, model: str, key: Any, clear_verdicts: bool, rollback: bool) -> str:
    """halted: false, and the halt rule's rollback back on (by default)."""
    current = existing(bucket, model)
    document = current.document
    assert document is not None
    count = verdicts(bucket, model, document.target)
    rule = dataclasses.replace(document.halt or DEFAULT_HALT, rollback=rollback)
    resumed = change(document, halted=False, halt=rule, reason="")
    still = rollout.halted(resumed, count.passed, count.failed)
    cleared = 0
    if still and not clear_verdicts:
        raise FleetError(
            f"model '{model}': {count.failed} of {count.passed + count.failed} devices failed "
            f"version {document.target}'s probation, so the rollout would halt again at once; "
            "`fleet resume --clear-verdicts` forgets their verdicts (those devices still keep "
            "the version out until its content changes)"
        )
    if clear_verdicts:
        listed = rollout.verdict_prefix(bucket.prefix, model, document.target)
        objects, _ = bucket.listing(listed[len(bucket.prefix) :])
        for obj in objects:
            parsed = rollout.parse_verdict_key(listed, obj.key)
            if parsed is not None and parsed[0] == rollout.FAILED:
                bucket.delete(obj.key[len(bucket.prefix) :])
                cleared += 1
    write(bucket, resumed, key, current)
    note = f", {cleared} failed verdict(s) cleared" if cleared else ""
    return (
        f"model '{model}': rollout of version {resumed.target} resumed at "
        f"{describe_stage(resumed)} (revision {resumed.revision}{note})"
    )

"""`edge-appliance fleet operator`: a small loop that moves automatic rollouts along.

Devices move an automatic rollout (`advance: auto`) themselves; this loop does the same from
the operator's side, for a fleet whose devices may not write the progress object, or to see
it happen. Every round, per model with an automatic rollout: read the document, its progress
and the target's verdicts; check the stage's rule (rollout_policy.check_stage); when the stage
passed or failed, write the next progress as a compare-and-swap over the one read, as a
device does, so the loop and the devices never move a stage twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from appliance.fleet import control
from appliance.fleet.bucket import Conflict, FleetBucket, FleetError
from appliance.repository import rollout
from appliance.repository.rollout_policy import ADVANCE, AUTO, HALT, Progress, Step


def step(bucket: FleetBucket, model: str, by: str = "operator") -> str:
    """One check of one model's automatic rollout; a line saying what it did or why it waits."""
    current = control.read(bucket, model)
    document, written = current.document, current.written
    if document is None or written is None:
        return f"model '{model}': no {rollout.ROLLOUT}"
    if written.advance != AUTO:
        return f"model '{model}': advance is manual (`fleet advance` moves it)"
    count = control.verdicts(bucket, model, document.target)
    check = control.stage_check(current, count)
    assert check is not None
    where = control.describe_stage(document)
    if check.action not in (ADVANCE, HALT):
        return f"model '{model}': version {document.target} at {where}: {check.why}"
    history = current.progress.history if current.progress is not None else ()
    if current.progress is not None and not current.progress.applies_to(
        model, written.revision, written.target
    ):
        history = ()
    stage = document.stage + 1 if check.action == ADVANCE else document.stage
    new = Progress(
        model,
        written.revision,
        written.target,
        stage,
        halted=check.action == HALT,
        reason=f"halted by the fleet: {check.why}" if check.action == HALT else "",
        history=(
            *history,
            Step(
                stage, rollout.utc_text(time.time()), by, count.passed, count.failed, check.action
            ),
        ),
    )
    try:
        bucket.put(control.progress_rel(model), new.to_json(), current.progress_etag)
    except Conflict:
        return f"model '{model}': another advancer moved the rollout first"
    if check.action == HALT:
        return f"model '{model}': version {document.target} HALTED at {where}: {check.why}"
    moved = control.describe_stage(document, stage)
    return f"model '{model}': version {document.target} moved to {moved}: {check.why}"


def models(bucket: FleetBucket, only: str | None) -> list[str]:
    if only is not None:
        return [only]
    return sorted(m for m in bucket.folders() if not m.startswith("."))


def loop(
    bucket: FleetBucket,
    only: str | None,
    interval_s: float,
    rounds: int | None,
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Check every automatic rollout each `interval_s` (`rounds`: how many; None: forever).
    A round that fails (the bucket unreachable) is said and the next one tries again."""
    last: dict[str, str] = {}
    for index in _count(rounds):
        if index:
            sleep(interval_s)
        try:
            names = models(bucket, only)
        except FleetError as exc:
            say(f"cannot list the models: {exc}")
            continue
        for name in names:
            try:
                line = step(bucket, name)
            except FleetError as exc:
                line = f"model '{name}': {exc}"
            if last.get(name) != line:  # what changed, not the same line every round
                say(line)
            last[name] = line


def _count(rounds: int | None) -> Iterator[int]:
    index = 0
    while rounds is None or index < rounds:
        yield index
        index += 1

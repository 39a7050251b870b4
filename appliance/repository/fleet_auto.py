"""The device's part in a rollout that runs itself: the progress object, the advance, and the
disruption budget's probation slots (the rules and decisions are pure, in rollout_policy.py).

- **Progress** (`<model>/rollout.progress.json`): read only when its ETag in the poll's listing
  changed (the listing holds it beside rollout.json), so it costs an idle poll nothing.
- **Advance**: a device that counted the target's verdicts this poll (it does while they can
  change its choice) checks the stage's rule. When the stage passes or fails it writes the next
  progress as a compare-and-swap over the one it read (If-Match on its ETag, If-None-Match
  when there was none): of the devices that saw the stage pass in the same poll, one moves it;
  the others' writes are refused (412) and they read the new progress on their next poll.
- **Slots**: before switching, a device of a group with a budget claims a slot
  (`.fleet/slots/<model>/<version>/<group>/<index>.json`, If-None-Match), or takes over one
  whose holder's lease ran out (If-Match on the stale slot's ETag), and deletes it once its
  verdict is written.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from appliance.repository.rollout import (
    RolloutDocument,
    VerdictCount,
    halted,
    progress_key,
    slots_prefix,
    utc_text,
)
from appliance.repository.rollout_policy import (
    ADVANCE,
    HALT,
    PROGRESS,
    BudgetRule,
    PolicyError,
    Progress,
    StageCheck,
    Step,
    check_stage,
    free_slot,
)
from appliance.repository.s3 import RemoteObject, S3Source, SourceError, WriteConflict

log = logging.getLogger(__name__)

MEMBERS = "members/"  # under a group's slots: one key per device of the group (a percent budget)


@dataclass(frozen=True)
class HeldSlot:
    group: str
    index: int
    key: str


class AutoRollouts:
    """One source's automatic progress and probation slots, for one device."""

    def __init__(self, source: S3Source, device_id: str) -> None:
        self.source = source
        self.device_id = device_id
        self._progress: dict[str, tuple[str, Progress | None]] = {}  # model -> (etag, parsed)
        self.checks: dict[str, StageCheck] = {}  # model -> the stage's state as last checked
        self.slots: dict[tuple[str, int], HeldSlot] = {}  # (model, version) -> the slot held
        self._registered: set[tuple[str, int]] = set()  # (model, version) counted in its group
        self.advanced = 0  # progress writes that won (for the log and the tests)
        self.conflicts = 0  # ... and that another advancer won

    async def progress(
        self, name: str, objects: dict[str, RemoteObject]
    ) -> tuple[Progress | None, RemoteObject | None]:
        """The model's progress object, parsed (None: none, or unreadable: logged once)."""
        found = objects.get(PROGRESS)
        if found is None:
            self._progress.pop(name, None)
            return None, None
        cached = self._progress.get(name)
        if cached is None or cached[0] != found.etag:
            parsed: Progress | None = None
            try:
                data = await self.source.read_object(found.key, 16 * 1024)
                if data is not None:
                    parsed = Progress.parse(data, name)
            except (SourceError, PolicyError) as exc:
                log.error("model '%s': %s ignored: %s", name, found.key, exc)
            self._progress[name] = (found.etag, parsed)
        return self._progress[name][1], found

    async def consider(
        self,
        document: RolloutDocument,
        effective: RolloutDocument,
        progress: Progress | None,
        objects: dict[str, RemoteObject],
        counts: VerdictCount,
        bucket_now_s: float | None,
    ) -> StageCheck:
        """Check the stage's rule on the counts; advance or halt it (compare-and-swap)."""
        name = document.model
        check = stage_check(document, effective, progress, objects, counts, bucket_now_s)
        self.checks[name] = check
        if check.action not in (ADVANCE, HALT):
            return check
        applies = progress is not None and progress.applies_to(
            name, document.revision, document.target
        )
        history = progress.history if applies and progress is not None else ()
        stage = effective.stage + 1 if check.action == ADVANCE else effective.stage
        step = Step(
            stage, utc_text(time.time()), self.device_id, counts.passed, counts.failed, check.action
        )
        new = Progress(
            name,
            document.revision,
            document.target,
            stage,
            halted=check.action == HALT,
            reason=f"halted by the fleet: {check.why}" if check.action == HALT else "",
            history=(*history, step),
        )
        found = objects.get(PROGRESS)
        key = progress_key(self.source.location.prefix, name)
        try:
            etag = await self.source.write_object(
                key, new.to_json(), found.etag if found is not None else ""
            )
        except WriteConflict:
            self.conflicts += 1
            log.info("model '%s': another advancer moved the rollout first", name)
            return check
        except SourceError as exc:
            log.error("model '%s': cannot write the rollout's progress: %s", name, exc)
            return check
        self.advanced += 1
        self._progress[name] = (etag, new)
        log.info(
            "model '%s': rollout of version %d %s by this device (%s)",
            name,
            document.target,
            f"moved to stage {stage}" if check.action == ADVANCE else f"halted at stage {stage}",
            check.why,
        )
        return check

    # ---- the disruption budget ---------------------------------------------------------------

    async def claim(
        self, name: str, version: int, rule: BudgetRule, group: str, bucket_now_s: float | None
    ) -> str:
        """Claim a probation slot of the device's group; '' when held, else why it waits."""
        if (name, version) in self.slots:
            return ""
        listed = slots_prefix(self.source.location.prefix, name, version, group)
        try:
            objects = await self.source.list_objects(listed)
        except SourceError as exc:
            return f"waiting for a probation slot: cannot list them: {exc}"
        taken: dict[int, float] = {}
        etags: dict[int, str] = {}
        members = {self.device_id}
        for obj in objects:
            rel = obj.key[len(listed) :]
            if rel.startswith(MEMBERS) and rel.endswith(".json"):
                members.add(rel[len(MEMBERS) : -len(".json")])
                continue
            stem = rel.removesuffix(".json")
            if stem.isdigit() and stem.isascii():
                taken[int(stem)], etags[int(stem)] = obj.modified, obj.etag
        now_s = bucket_now_s if bucket_now_s is not None else time.time()
        free = free_slot(rule, taken, now_s, len(members))
        slots = rule.slots(len(members))
        in_use = sum(1 for i in taken if i < slots)
        waiting = (
            f"waiting for a probation slot: {in_use} of {slots} in use in group {group}"
            + (f" ({len(members)} devices)" if rule.max_percent is not None else "")
        )
        if free is None:
            return waiting
        index, stale = free
        key = f"{listed}{index}.json"
        body = {"device": self.device_id, "model": name, "version": version}
        body["time"] = utc_text(time.time())
        try:
            await self.source.write_object(
                key, json.dumps(body).encode(), etags[index] if stale else ""
            )
        except WriteConflict:
            return waiting
        except SourceError as exc:
            return f"waiting for a probation slot: {exc}"
        self.slots[(name, version)] = HeldSlot(group, index, key)
        log.info(
            "model '%s' version %d: probation slot %d of %d in group %s claimed%s",
            name,
            version,
            index + 1,
            rule.max_devices,
            group,
            " (its holder's lease ran out)" if stale else "",
        )
        return ""

    async def register(self, name: str, version: int, group: str) -> None:
        """Count this device in its group for a percent budget (once per version)."""
        if (name, version) in self._registered:
            return
        key = slots_prefix(self.source.location.prefix, name, version, group)
        key += f"{MEMBERS}{self.device_id}.json"
        try:
            await self.source.write_object(key, b"{}\n")
        except SourceError as exc:
            log.warning("model '%s': cannot count this device in its group: %s", name, exc)
            return
        self._registered.add((name, version))

    async def release(self, name: str, version: int) -> None:
        held = self.slots.pop((name, version), None)
        if held is None:
            return
        try:
            await self.source.delete_object(held.key)
        except SourceError as exc:  # its lease frees it
            log.warning("model '%s': cannot free probation slot %s: %s", name, held.key, exc)
            return
        log.info("model '%s' version %d: probation slot freed", name, version)


def stage_check(
    document: RolloutDocument,
    effective: RolloutDocument,
    progress: Progress | None,
    objects: dict[str, RemoteObject],
    counts: VerdictCount,
    bucket_now_s: float | None,
) -> StageCheck:
    """The stage's state from the listing: it began when the object that moved it there was
    written (the progress object, else rollout.json), by the bucket's clock."""
    moved_by_progress = progress is not None and effective.stage > document.stage
    began = objects.get(PROGRESS if moved_by_progress else "rollout.json")
    now_s = bucket_now_s if bucket_now_s is not None else time.time()
    in_stage_s = now_s - began.modified if began is not None else 0.0
    stage = effective.stage
    rule = effective.stages[max(stage, 0)].advance_rule
    return check_stage(
        stage,
        len(effective.stages),
        rule,
        counts.passed,
        counts.failed,
        in_stage_s,
        effective.halted,
        halted(effective, counts.passed, counts.failed),
    )

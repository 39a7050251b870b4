"""The device's side of fleet rollouts: reads each model's rollout.json, chooses the version this
device serves, counts the fleet's verdicts, and writes the device's report and verdicts.

Every poll, before a source syncs any version (s3.py asks `plan`): for each model with a
`rollout.json` (signature checked with --manifest-public-key; a revision lower than one acted on
is a stale read and ignored), the device decides alone (rollout.py): in the stage -> `target`,
else `baseline`; a target that failed here (probation, load, warm-up, verification: the ledger
holds it with its content) is never taken again; a halted rollout (the operator's `halted`, or
the fleet's verdicts past the document's halt rule, counted with one listing of the verdict
keys while they can change this device's choice) keeps devices off the target, and sends those
on it back to `baseline` when it says so. Only the chosen version is fetched. The choice goes
into the ledger (the runtime serves it, a pin wins, and it holds across restarts before the
network answers), and a model whose choice changed is loaded again.

Writes (a task of its own, never in the way of serving): the verdict marker when the device's
probation of a target ends (`.fleet/verdicts/<model>/<version>/<verdict>/<id>.json`, the other
verdict's key deleted), and the device report (`.fleet/devices/<id>.json`) on a change and
every --fleet-report-interval. A write that fails is logged once per outage and tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from appliance import __version__
from appliance.repository.fleet_auto import AutoRollouts
from appliance.repository.ledger import (
    LedgerEntry,
    ModelLedger,
    listing_id,
    record_rollout,
    record_rollout_revision,
)
from appliance.repository.manifest import ManifestError, verify_signature
from appliance.repository.rollout import (
    FAILED,
    HALTED,
    MAX_ROLLOUT_BYTES,
    MAX_ROLLOUT_SIGNATURE_BYTES,
    NONE,
    PASSED,
    ROLLOUT,
    ROLLOUT_SIGNATURE,
    RUNNING,
    DeviceIdentity,
    ModelReport,
    ProbationRule,
    RolloutDocument,
    RolloutError,
    VerdictCount,
    choose_version,
    count_verdicts,
    effective,
    halted,
    membership,
    needs_verdicts,
    report_body,
    report_key,
    verdict_body,
    verdict_key,
    verdict_prefix,
)
from appliance.repository.rollout_policy import AUTO, ShadowRule, open_at, window_for
from appliance.repository.s3 import (
    FleetPlan,
    ObjectTooLarge,
    RemoteModel,
    RemoteObject,
    S3Source,
    SourceError,
)

log = logging.getLogger(__name__)

_MIN_WRITE_GAP_S = 1.0  # changes that come together make one report
DEFER_FILE = "fleet-defer"  # in the state directory: while it exists, no switch to a target
# Without the document's defer.max_s, a deferring device reports itself as holding back after:
DEFAULT_MAX_DEFER_S = 24 * 3600.0


@dataclass(frozen=True)
class ServingView:
    """What the runtime serves of a model, for the report (built by the composition root)."""

    versions: tuple[int, ...]
    requests: int = 0
    errors: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    on_probation: int | None = None  # the version on probation now


@dataclass(frozen=True)
class RolloutState:
    """One model's rollout as this device last decided it."""

    document: RolloutDocument
    in_stage: bool
    halted: bool
    failed_here: str  # why the target failed on this device ('' : it did not)
    chosen: int
    reason: str
    waiting: str = ""  # why the device does not switch to the target yet (windows, budget, defer)
    prefetch: int | None = None  # the target, downloaded ahead of its switch window
    window: str = ""  # "open", "download closed", "switch closed" ("": no window rule)


@dataclass(frozen=True)
class _Marker:
    model: str
    version: int
    verdict: str
    reason: str


class FleetAgent:
    """One S3 source's rollouts, reports and verdicts for this device."""

    def __init__(
        self,
        source: S3Source,
        identity: DeviceIdentity,
        report_interval_s: float,
        report_always: bool,
        public_key: object = None,
    ) -> None:
        self.source = source
        self.identity = identity
        self.report_interval_s = report_interval_s  # 0: no reports
        self.report_always = report_always  # else only once the bucket holds a rollout
        self.public_key = public_key
        self.ledger: ModelLedger = source.ledger
        # Set by the composition root: what the runtime serves, and whether the device's own
        # flags put a switched-in version on probation.
        self.serving: Callable[[str], ServingView | None] = lambda name: None
        self.flag_probation = False
        # The shadow probation's numbers of a model's version (None: none ran), from the runtime.
        self.shadow_view: Callable[[str, int], dict[str, object] | None] = lambda n, v: None
        self.states: dict[str, RolloutState] = {}
        self._read: dict[str, tuple[tuple[str, str], RolloutDocument | str]] = {}
        self._acted: dict[str, RolloutDocument] = {}
        self._stale_logged: dict[str, int] = {}  # model -> the refused revision, logged once
        self._passed: set[tuple[str, int]] = set()
        self._markers: dict[tuple[str, int], _Marker] = {}
        self._written: set[_Marker] = set()
        self._seen_rollout = False
        self._last_ok: bool | None = None
        self._dirty = True
        self._failing = ""  # the write error being logged once
        self._verdicts_failing = ""
        # (model, target, revision) -> when its verdicts were last listed (monotonic)
        self._verdicts_listed_s: dict[tuple[str, int, int], float] = {}
        # How often a device settled on a completed rollout's target looks for a halt.
        self.settled_s = report_interval_s or 300.0
        self._wake = asyncio.Event()
        self.auto = AutoRollouts(source, identity.device_id)
        self._counts: dict[str, VerdictCount] = {}  # model -> the target's verdicts, this poll
        # (model, version) -> [when the device switched to it, when its probation ended]
        self.probation_times: dict[tuple[str, int], list[float | None]] = {}
        self.deferring_since: float | None = None  # the defer file's time, while it exists
        self.max_defer_s = DEFAULT_MAX_DEFER_S
        source.fleet = self

    # ---- the plan of one sync ----------------------------------------------------------------

    async def plan(
        self, remote: dict[str, RemoteModel], bucket_now_s: float | None = None
    ) -> FleetPlan:
        """Which versions to fetch and which models to load again, from the listing."""
        fetch: dict[str, frozenset[int]] = {}
        switch: set[str] = set()
        self.deferring_since = await asyncio.to_thread(self._defer_file_time)
        for name, model in sorted(remote.items()):
            folder = self.source.store.root / name
            entry = await asyncio.to_thread(self.ledger.entry, folder)
            document, frozen = await self._document(name, model.rollout, entry.rollout_revision)
            if document is None:
                self.states.pop(name, None)
                if frozen:  # an unreadable first document: take nothing new
                    fetch[name] = frozenset()
                elif entry.rollout is not None:
                    log.info("model '%s': its rollout ended; the version policy applies", name)
                    await self._record(name, folder, None)
                    switch.add(name)
                continue
            self._seen_rollout = True
            await self._record_revision(name, folder, document.revision)
            written = document
            progress = None
            if document.advance == AUTO:
                progress, _ = await self.auto.progress(name, model.rollout)
                document = effective(document, progress)
            self._counts.pop(name, None)
            state = await self._decide(name, document, model, entry, bucket_now_s)
            counts = self._counts.get(name)
            if written.advance == AUTO and counts is not None:
                await self.auto.consider(
                    written, document, progress, model.rollout, counts, bucket_now_s
                )
            if state.chosen != document.target or state.failed_here:
                await self.auto.release(name, document.target)
            budget = document.budget
            if budget is not None and budget.max_percent is not None and not document.halted:
                group = budget.group(self.identity.labels)
                await self.auto.register(name, document.target, group)
            previous = self.states.get(name)
            self.states[name] = state
            wanted = {state.chosen} if state.prefetch is None else {state.chosen, state.prefetch}
            fetch[name] = frozenset(wanted)
            if state.failed_here:
                self._mark(_Marker(name, document.target, FAILED, state.failed_here))
            if previous != state:
                self._changed()
            if entry.rollout != state.chosen:
                log.info(
                    "model '%s': rollout revision %d has this device serve version %d (%s)",
                    name,
                    document.revision,
                    state.chosen,
                    state.reason,
                )
                await self._record(name, folder, state.chosen)
                if state.chosen == document.target:
                    self.probation_times[(name, state.chosen)] = [time.time(), None]
                served = self.serving(name)
                if served is None or set(served.versions) != {state.chosen}:
                    switch.add(name)
        return FleetPlan(fetch, frozenset(switch))

    async def _decide(
        self,
        name: str,
        document: RolloutDocument,
        model: RemoteModel,
        entry: LedgerEntry,
        bucket_now_s: float | None = None,
    ) -> RolloutState:
        target = document.target
        failure = entry.failed.get(target)
        failed_here = ""
        if failure is not None:  # of the content the bucket holds now (or of one now gone)
            files = model.versions.get(target)
            held = {rel: [obj.etag, obj.size] for rel, obj in (files or {}).items()}
            if files is None or failure.content == listing_id(held):
                failed_here = failure.reason
        on_target = entry.rollout == target
        in_stage = membership(document, self.identity.device_id, self.identity.labels)
        previous = self.states.get(name)
        is_halted = document.halted or (
            previous is not None
            and previous.halted
            and previous.document.target == target
            and previous.document.revision == document.revision
        )
        reason = ""
        # A device that took the target and served it well at the last stage (the rollout is
        # complete) looks for a halt at the report interval, not every poll: at 10,000 devices
        # a listing per poll would double the fleet's idle S3 cost for good.
        settled = (
            on_target and entry.last_good == target and document.stage == len(document.stages) - 1
        )
        listed_s = self._verdicts_listed_s.get((name, target, document.revision))
        due = not settled or listed_s is None or time.monotonic() - listed_s >= self.settled_s
        # An automatic rollout is moved (or halted) by the devices of its stage, those that
        # failed the target included: they count the verdicts while it is not halted.
        moves = document.advance == AUTO and in_stage and not document.halted
        if due and (moves or needs_verdicts(document, in_stage, bool(failed_here), on_target)):
            self._verdicts_listed_s[(name, target, document.revision)] = time.monotonic()
            listed = verdict_prefix(self.source.location.prefix, name, target)
            try:
                counts = count_verdicts(listed, await self.source.list_keys(listed))
            except SourceError as exc:
                if str(exc) != self._verdicts_failing:
                    log.error("model '%s': cannot count the fleet's verdicts: %s", name, exc)
                self._verdicts_failing = str(exc)
            else:
                self._verdicts_failing = ""
                self._counts[name] = counts
                is_halted = halted(document, counts.passed, counts.failed)
                if is_halted and not document.halted:
                    reason = (
                        f"halted: {counts.failed} of {counts.passed + counts.failed} devices "
                        f"failed version {target}"
                    )
        if document.halted and document.reason.startswith("halted by the fleet"):
            reason = document.reason
        elif document.halted:
            reason = f"halted by the operator: {document.reason}".rstrip(": ")
        elif is_halted and not reason and previous is not None:
            reason = previous.reason  # not listed this poll: the halt seen before
        chosen = choose_version(document, in_stage, is_halted, bool(failed_here), on_target)
        if failed_here:
            reason = f"version {target} failed here: {failed_here}"
        elif not reason:
            reason = "in the stage" if in_stage else "not in the stage"
        waiting, prefetch, window = "", None, ""
        if chosen == target and not on_target and not failed_here:
            waiting, prefetch, window = await self._gates(name, document, bucket_now_s)
            if waiting:
                chosen = entry.rollout if entry.rollout not in (None, target) else document.baseline
                reason = waiting
        return RolloutState(
            document, in_stage, is_halted, failed_here, chosen, reason, waiting, prefetch, window
        )

    async def _gates(
        self, name: str, document: RolloutDocument, bucket_now_s: float | None
    ) -> tuple[str, int | None, str]:
        """What keeps a device from switching to the target now: (why it waits, the version to
        download ahead, the window's state). Only taking the target waits; going back never."""
        target = document.target
        served = self.serving(name)
        if served is not None and target in served.versions:
            return "", None, ""  # it serves the target already (taken before the rollout)
        rule = window_for(document.windows, self.identity.labels)
        local = time.localtime()
        stored = await asyncio.to_thread((self.source.store.root / name / str(target)).is_dir)
        window = ""
        if rule is not None:
            window = "open"
            if not stored and not open_at(rule.download, local):
                spans = ", ".join(s.text for s in rule.download)
                return f"waiting: the download window ({spans}) is closed", None, "download closed"
            if not open_at(rule.switch, local):
                spans = ", ".join(s.text for s in rule.switch)
                return f"waiting: the switch window ({spans}) is closed", target, "switch closed"
        if self.deferring_since is not None:
            limit = document.defer.max_s if document.defer is not None else self.max_defer_s
            self.max_defer_s = limit
            deferred = max(0.0, time.time() - self.deferring_since)
            back = f" (holding back: longer than the {limit:g} s the rollout allows)"
            return (
                f"deferred on this device ({DEFER_FILE})" + (back if deferred > limit else ""),
                target,
                window,
            )
        if document.budget is not None:
            group = document.budget.group(self.identity.labels)
            why = await self.auto.claim(name, target, document.budget, group, bucket_now_s)
            if why:
                return why, target, window
        return "", None, window

    def _defer_file_time(self) -> float | None:
        """When the defer file was made (None: there is none), blocking."""
        try:
            return (self.source.store.state_dir / DEFER_FILE).stat().st_mtime
        except OSError:
            return None

    async def _record(self, name: str, folder: Path, version: int | None) -> None:
        if self.ledger.change(folder, record_rollout(version)):
            try:
                await asyncio.to_thread(self.ledger.save, folder)
            except OSError as exc:  # serves all the same; a restart decides again
                log.error("model '%s': cannot write its record to the ledger: %s", name, exc)

    async def _record_revision(self, name: str, folder: Path, revision: int) -> None:
        """Keep the highest revision acted on in the ledger (on disk before the device acts on
        it), so that a lower one is refused after a restart too."""
        if self.ledger.change(folder, record_rollout_revision(revision)):
            try:
                await asyncio.to_thread(self.ledger.save, folder)
            except OSError as exc:
                log.error("model '%s': cannot write its record to the ledger: %s", name, exc)

    async def _document(
        self, name: str, objects: dict[str, RemoteObject], recorded_revision: int | None = None
    ) -> tuple[RolloutDocument | None, bool]:
        """The document to act on (None: none), and whether the model is frozen (its document
        cannot be read or verified and no earlier one was). `recorded_revision`: the highest
        revision acted on before (the ledger's, across restarts): a lower one is refused."""
        found = objects.get(ROLLOUT)
        if found is None:
            self._read.pop(name, None)
            self._acted.pop(name, None)
            return None, False
        signature = objects.get(ROLLOUT_SIGNATURE)
        etags = (found.etag, signature.etag if signature is not None else "")
        cached = self._read.get(name)
        if cached is None or cached[0] != etags:
            result = await self._fetch_document(name, found, signature)
            self._read[name] = (etags, result)
            if isinstance(result, str):  # once per revision: the etags changed
                log.error(
                    "model '%s': %s ignored, %s: %s",
                    name,
                    found.key,
                    "keeping its last good revision"
                    if name in self._acted
                    else "taking no new version",
                    result,
                )
                self._changed()
        result = self._read[name][1]
        acted = self._acted.get(name)
        if isinstance(result, str):
            return acted, acted is None
        if acted is not None and result.revision < acted.revision:
            return acted, False  # a stale read (an eventually consistent copy): ignored
        if acted is None and recorded_revision is not None and result.revision < recorded_revision:
            # A stale or replayed document after a restart: refused; the ledger's choice of
            # version keeps serving, and nothing new is fetched until a newer revision.
            if self._stale_logged.get(name) != result.revision:
                self._stale_logged[name] = result.revision
                log.error(
                    "model '%s': %s revision %d ignored: revision %d was acted on before "
                    "(a stale or replayed document); keeping the version it chose",
                    name,
                    found.key,
                    result.revision,
                    recorded_revision,
                )
                self._changed()
            return None, True
        self._acted[name] = result
        return result, False

    async def _fetch_document(
        self, name: str, found: RemoteObject, signature: RemoteObject | None
    ) -> RolloutDocument | str:
        """The verified document, or why not."""
        data = await self._read_capped(found, MAX_ROLLOUT_BYTES)
        if not isinstance(data, bytes):
            return data or f"{ROLLOUT} vanished while it was read"
        if self.public_key is not None:
            if signature is None:
                return f"no {ROLLOUT_SIGNATURE} and --manifest-public-key is set"
            raw = await self._read_capped(signature, MAX_ROLLOUT_SIGNATURE_BYTES)
            if not isinstance(raw, bytes):
                return raw or f"{ROLLOUT_SIGNATURE} vanished while it was read"
            try:
                verify_signature(self.public_key, data, raw)
            except ManifestError:
                return (
                    f"{ROLLOUT_SIGNATURE} does not verify with the --manifest-public-key key "
                    "(changed, signed by another key, or its signature is still to come)"
                )
        try:  # ~2 ms at the caps (100 stages, 64 KiB): in a thread all the same
            return await asyncio.to_thread(RolloutDocument.parse, data, name)
        except RolloutError as exc:
            return str(exc)

    async def _read_capped(self, found: RemoteObject, most: int) -> bytes | str | None:
        """A document's bytes; None when it vanished; why not when it is over `most` bytes
        (by the listing, before a byte is fetched, or by what the endpoint sends)."""
        name = found.key.rsplit("/", 1)[-1]
        too_big = f"{name} is over the {most} bytes it may have"
        if found.size > most:
            return f"{name} is {found.size} bytes, more than the {most} it may have"
        try:
            return await self.source.read_object(found.key, most)
        except ObjectTooLarge:
            return too_big

    # ---- what the runtime tells ----------------------------------------------------------

    def probation_rule(self, name: str, version: int) -> ProbationRule | None:
        """The rollout's probation thresholds for a version switched in (its target only)."""
        state = self.states.get(name)
        if state is None or state.document.target != version:
            return None
        return state.document.probation

    def shadow_rule(self, name: str, version: int) -> ShadowRule | None:
        """The rollout's shadow probation rule for its target, when this device takes it."""
        state = self.states.get(name)
        if state is None or state.document.target != version or state.chosen != version:
            return None
        return state.document.shadow

    def verdict(self, name: str, version: int, why: str) -> None:
        """Probation's verdict on a version ('' : passed): a marker when it is the target."""
        state = self.states.get(name)
        if state is None or state.document.target != version:
            return
        if not why:
            self._passed.add((name, version))
        times = self.probation_times.setdefault((name, version), [None, None])
        times[1] = time.time()
        self._mark(_Marker(name, version, FAILED if why else PASSED, why))

    def _mark(self, marker: _Marker) -> None:
        key = (marker.model, marker.version)
        if marker in self._written or self._markers.get(key) == marker:
            return
        self._markers[key] = marker
        self._changed()

    def synced(self, ok: bool) -> None:
        """A sync of the source ended (`ok`: the bucket answered)."""
        if ok != self._last_ok:
            self._dirty = True
        self._last_ok = ok
        self._wake.set()  # a bucket back after an outage gets the writes that waited

    def _changed(self) -> None:
        self._dirty = True
        self._wake.set()

    # ---- the writes ----------------------------------------------------------------------

    @property
    def reporting(self) -> bool:
        return self.report_interval_s > 0 and (self.report_always or self._seen_rollout)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Write verdicts and reports until the context exits (the source's client open)."""
        task = asyncio.ensure_future(self._loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        next_report_s = time.monotonic()
        while True:
            wait_s = max(0.0, next_report_s - time.monotonic()) if self.reporting else None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
            self._wake.clear()
            due = self.reporting and (self._dirty or time.monotonic() >= next_report_s)
            try:
                await self.flush(report=due)
            except Exception:  # a bug must not end the writes for good
                log.exception("fleet: writing to the bucket failed")
            if due:  # a report that failed waits for the next sync (or the interval)
                next_report_s = time.monotonic() + self.report_interval_s
            await asyncio.sleep(_MIN_WRITE_GAP_S)

    async def flush(self, report: bool) -> None:
        """Write the verdicts that wait, then (with `report`) the device report."""
        try:
            for key, marker in sorted(self._markers.items()):
                await self._write_marker(marker)
                await self.auto.release(marker.model, marker.version)
                self._written.add(marker)
                if self._markers.get(key) == marker:
                    del self._markers[key]
            if report:
                self._dirty = False
                try:
                    await self._write_report()
                except SourceError:
                    self._dirty = True
                    raise
        except SourceError as exc:
            if not self._failing:
                log.error(
                    "fleet: cannot write to the bucket (%s); serving goes on, writes are tried "
                    "again",
                    exc,
                )
            self._failing = str(exc)
            return
        if self._failing:
            log.info("fleet: writing to the bucket works again")
            self._failing = ""

    async def _write_marker(self, marker: _Marker) -> None:
        prefix = self.source.location.prefix
        device = self.identity.device_id
        body = verdict_body(
            device, marker.model, marker.version, marker.verdict, marker.reason, time.time()
        )
        await self.source.write_object(
            verdict_key(prefix, marker.model, marker.version, marker.verdict, device), body
        )
        other = PASSED if marker.verdict == FAILED else FAILED
        try:  # a device keeps only its latest verdict; counting treats both as failed anyway
            await self.source.delete_object(
                verdict_key(prefix, marker.model, marker.version, other, device)
            )
        except SourceError as exc:
            log.warning("model '%s': cannot delete the earlier verdict: %s", marker.model, exc)
        log.info(
            "model '%s' version %d: verdict '%s' written for the fleet",
            marker.model,
            marker.version,
            marker.verdict,
        )

    async def _write_report(self) -> None:
        names = set(self.states) | await asyncio.to_thread(self.source_folders)
        # One view per model (it sorts each served version's recent latencies for p50 / p99).
        views = {name: self.serving(name) for name in sorted(names)}
        models = {
            name: self.model_report(name, view)
            for name, view in views.items()
            if view is not None or name in self.states
        }
        source = self.source
        body = report_body(
            self.identity,
            time.time(),
            __version__,
            source.last_sync_s or None,
            source.reachable,
            models,
            source.frozen_since_s,
        )
        await source.write_object(report_key(source.location.prefix, self.identity.device_id), body)

    def source_folders(self) -> set[str]:
        """The model folders in this source's store (blocking)."""
        root = self.source.store.root
        try:
            return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
        except OSError:
            return set()

    def shadow_report(self, name: str, version: int) -> dict[str, object] | None:
        return self.shadow_view(name, version)

    def model_report(self, name: str, view: ServingView | None = None) -> ModelReport:
        """A model's part of the report (`view`: what serves, if already read)."""
        served = view or self.serving(name) or ServingView(())
        state = self.states.get(name)
        report = ModelReport(
            served.versions,
            requests=served.requests,
            errors=served.errors,
            p50_ms=served.p50_ms,
            p99_ms=served.p99_ms,
        )
        if state is None:
            return report
        document = state.document
        target = document.target
        if state.failed_here:
            probation = FAILED
        elif served.on_probation == target:
            probation = RUNNING
        elif state.halted and target not in served.versions:
            probation = HALTED
        elif target in served.versions and (
            (name, target) in self._passed or document.probation is not None or self.flag_probation
        ):
            probation = PASSED
        else:
            probation = NONE
        times = self.probation_times.get((name, target), [None, None])
        deferred = self.deferring_since is not None and state.waiting.startswith("deferred")
        deferred_s = max(0.0, time.time() - self.deferring_since) if deferred else None  # type: ignore[operator]  # deferred: not None
        check = self.auto.checks.get(name)
        return dataclasses.replace(
            report,
            rollout_revision=document.revision,
            target=target,
            in_stage=state.in_stage,
            probation=probation,
            reason=state.reason,
            stage=document.stage,
            waiting=state.waiting,
            window=state.window,
            deferred_s=round(deferred_s, 1) if deferred_s is not None else None,
            holding_back=deferred_s is not None and deferred_s > self.max_defer_s,
            probation_started=times[0],
            probation_ended=times[1],
            stage_check=check.to_json() if check is not None else None,
            shadow=self.shadow_report(name, target),
        )

"""The same requests to tritonserver and to this server, every answer compared.

A difference fails the test unless declared.toml declares it, with its reason. The counts
(identical, declared) are printed and written to the log folder; docs/compatibility.md quotes
them.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

if sys.version_info < (3, 11):  # the suite runs once, under the main Python (it has tomllib)
    pytest.skip("the differential suite runs under Python 3.11+", allow_module_level=True)

import grpc
import tomllib

from tests.differential import cases, repo
from tests.differential.harness import Case, Metrics, Target, answer
from tests.differential.servers import ReferenceServer, ours, reference_missing

_MISSING = reference_missing()
needs_reference = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")

DECLARED_PATH = Path(__file__).with_name("declared.toml")


def declared() -> dict[str, str]:
    """Case id (or an fnmatch pattern of ids) -> why the difference is kept."""
    table = tomllib.loads(DECLARED_PATH.read_text())["declared"]
    return {case: entry["reason"] for case, entry in table.items()}


def declaration(key: str, table: dict[str, str]) -> str | None:
    if key in table:
        return key
    return next((pattern for pattern in table if fnmatch.fnmatchcase(key, pattern)), None)


def _start_pair(
    repository: Path, logs: Path, flags: tuple[str, ...], our_flags: tuple[str, ...] = ()
) -> tuple[ReferenceServer, Any]:
    reference = ReferenceServer(repository, *flags, log_path=logs / "tritonserver.log")
    mine = ours(repository, *flags, *our_flags, log_path=logs / "ours.log")
    try:
        with ThreadPoolExecutor(2) as pool:
            for started in [
                pool.submit(reference.wait_ready, 90),
                pool.submit(mine.wait_ready, 90),
            ]:
                started.result()
    except BaseException:
        reference.stop()
        mine.stop()
        raise
    return reference, mine


def _targets(reference: ReferenceServer, mine: Any) -> tuple[Target, Target]:
    return (
        Target(
            reference.http_url, reference.metrics_url, grpc.insecure_channel(reference.grpc_url)
        ),
        Target(mine.http_url, mine.metrics_url, grpc.insecure_channel(mine.grpc_url)),
    )


def _expand(case: Case, value: Any) -> Iterator[tuple[str, Any]]:
    """A metrics answer compares series by series; any other answer as one."""
    if isinstance(case.request, Metrics):
        for key, item in value.items():
            yield f"metrics: {key}", item
    else:
        yield case.id, value


def _compare(corpus: list[Case], reference: Target, mine: Target) -> dict[str, Any]:
    theirs: dict[str, Any] = {}
    here: dict[str, Any] = {}
    for case in corpus:
        theirs.update(_expand(case, answer(case, reference)))
    for case in corpus:
        here.update(_expand(case, answer(case, mine)))
    missing = object()
    differences = {
        key: {"tritonserver": theirs.get(key, "(absent)"), "here": here.get(key, "(absent)")}
        for key in {**theirs, **here}
        if theirs.get(key, missing) != here.get(key, missing)
    }
    return {"compared": len({**theirs, **here}), "differences": differences}


def _judge(result: dict[str, Any], logs: Path, name: str) -> None:
    table = declared()
    differences = result["differences"]
    undeclared = {
        key: value for key, value in differences.items() if declaration(key, table) is None
    }
    counts = {
        "compared": result["compared"],
        "identical": result["compared"] - len(differences),
        "declared": len(differences) - len(undeclared),
        "undeclared": len(undeclared),
    }
    (logs / f"{name}.json").write_text(json.dumps({"counts": counts, **result}, indent=1))
    print(f"\ndifferential {name}: {counts}")  # noqa: T201 - the counts the docs quote
    report = "\n".join(
        f"- {key}\n    tritonserver: {json.dumps(value['tritonserver'])[:600]}\n"
        f"    here:         {json.dumps(value['here'])[:600]}"
        for key, value in sorted(undeclared.items())
    )
    assert not undeclared, f"{len(undeclared)} undeclared differences ({counts}):\n{report}"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("differential")


@needs_reference
def test_the_corpus_answers_as_tritonserver_does(logs: Path) -> None:
    repository = repo.build(logs / "models")
    reference, mine = _start_pair(
        repository,
        logs,
        ("--model-control-mode=explicit", "--load-model=*"),
        ("--allow-client-shm=true",),
    )
    try:
        result = _compare(cases.corpus(), *_targets(reference, mine))
    finally:
        reference.stop()
        mine.stop()
    _judge(result, logs, "corpus")


@needs_reference
@pytest.mark.parametrize("mode", ["none", "poll"])
def test_model_control_in_each_mode(logs: Path, mode: str) -> None:
    repository = repo.build(logs / f"models-{mode}", ("identity_int32",))
    flags = (f"--model-control-mode={mode}",)
    if mode == "poll":
        flags += ("--repository-poll-secs=60",)
    folder = logs / mode
    folder.mkdir()
    reference, mine = _start_pair(repository, folder, flags)
    try:
        result = _compare(cases.control_mode_cases(mode), *_targets(reference, mine))
    finally:
        reference.stop()
        mine.stop()
    _judge(result, logs, f"mode-{mode}")


@needs_reference
def test_a_repository_given_twice(logs: Path) -> None:
    """tritonserver keeps its repositories in a set: the same path twice is one repository."""
    repository = repo.build(logs / "models-twice", ("identity_int32",))
    folder = logs / "twice"
    folder.mkdir()
    reference, mine = _start_pair(repository, folder, (f"--model-repository={repository}",))
    try:
        result = _compare(cases.repeated_repository_cases(), *_targets(reference, mine))
    finally:
        reference.stop()
        mine.stop()
    _judge(result, logs, "twice")


def test_every_declared_difference_names_a_case() -> None:
    corpus_ids = {case.id for case in cases.corpus()}
    corpus_ids |= {case.id for case in cases.repeated_repository_cases()}
    for mode in ("none", "poll"):
        corpus_ids |= {case.id for case in cases.control_mode_cases(mode)}
    stale = [
        key
        for key in declared()
        if not key.startswith("metrics: ")
        and key not in corpus_ids
        and not any(fnmatch.fnmatchcase(case, key) for case in corpus_ids)
    ]
    assert not stale, f"declared.toml names cases the corpus does not have: {stale}"
    assert all(reason.strip() for reason in declared().values())

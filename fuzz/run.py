"""Run one fuzz target (or all) for a while: atheris, coverage-guided, where it is installed
(the `fuzz` extra), else hypothesis with random bytes.

    python -m fuzz.run http_json --seconds 120
    python -m fuzz.run all --seconds 120      # each target in its own process
    python -m fuzz.run rollout,ledger --seconds 300

A run starts from the target's corpus in the repository (fuzz/corpus/<target>/) and grows a
working copy; with several targets, each run's new inputs are merged back into the corpus
(libFuzzer's -merge=1) and a table of the counts is printed (docs/fuzzing.md). A finding
prints its input and the traceback, is saved under fuzz/findings/, and exits non-zero.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

FINDINGS = Path(__file__).parent / "findings"
# fuzz.targets' names, kept here so that atheris instruments appliance before it is imported.
NAMES = (
    "http_json",
    "http_binary",
    "http_framing",
    "bytes",
    "grpc",
    "grpc_stream",
    "grpc_control",
    "shm_registry",
    "config",
    "manifest",
    "rollout",
    "ledger",
    "labels",
    "fleet_report",
    "s3",
)


def _save(name: str, data: bytes) -> Path:
    FINDINGS.mkdir(exist_ok=True)
    path = FINDINGS / f"{name}-{int(time.time())}.bin"
    path.write_bytes(data)
    return path


def _scratch(name: str) -> Path:
    """The folder a target's files go to under atheris (removed by run_all after each)."""
    return Path(tempfile.gettempdir()) / f"edge-fuzz-{name}-{os.getuid()}"


def _clean(name: str) -> None:
    shutil.rmtree(_scratch(name), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.unlink(f"/dev/shm/edge-fuzz-{name}")


def _merge_command(name: str) -> str:
    """An executable for libFuzzer's merge, which runs its inner passes as `argv[0] FLAGS...`:
    a script that starts this target again with those flags."""
    FINDINGS.mkdir(exist_ok=True)
    script = FINDINGS / f"merge-{name}.sh"  # fuzz/findings/ is not tracked
    root = Path(__file__).resolve().parent.parent
    script.write_text(
        f'#!/bin/sh\ncd "{root}" && exec "{sys.executable}" -m fuzz.run {name} '
        '--engine=atheris --inner "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def run_atheris(
    name: str, seconds: int, merge_from: str = "", inner: list[str] | None = None
) -> int:
    """Fuzz `name` for `seconds` from its corpus (fuzz/corpus/<name>/ and the seeds), growing a
    working corpus in a temporary folder (its path is printed). With `merge_from` (a working
    corpus of an earlier run), merge instead: the inputs of it that reach code the repository's
    corpus does not are added to fuzz/corpus/<name>/ (libFuzzer's -merge=1 keeps the smallest)."""
    import atheris  # type: ignore[import-untyped]  # no stubs

    os.environ["EDGE_FUZZ_SCRATCH"] = str(_scratch(name))
    os.environ["EDGE_FUZZ_SHM"] = f"edge-fuzz-{name}"
    with atheris.instrument_imports(include=["appliance", "fuzz"]):
        from fuzz.targets import TARGETS
    from fuzz.targets import CORPUS, corpus, seeds

    target = TARGETS[name]
    FINDINGS.mkdir(exist_ok=True)
    kept = CORPUS / name
    if inner is not None:  # a pass of libFuzzer's merge
        argv = [sys.argv[0], *inner]
    elif merge_from:
        argv = [
            _merge_command(name),
            "-merge=1",
            "-max_len=4096",
            "-rss_limit_mb=2048",
            str(kept),
            merge_from,
        ]
    else:
        work = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))  # grows as coverage does
        print(f"working corpus: {work}", flush=True)
        for i, seed in enumerate(seeds()[name]):
            (work / f"seed{i}").write_bytes(seed)
        for path in corpus(name):
            (work / path.name).write_bytes(path.read_bytes())
        argv = [
            sys.argv[0],
            f"-max_total_time={seconds}",
            "-print_final_stats=1",
            "-rss_limit_mb=2048",
            "-timeout=20",
            f"-artifact_prefix={FINDINGS}/{name}-",
            "-max_len=4096",
            str(work),
        ]
    atheris.Setup(argv, target)  # before Fuzz: the targets read these at their first run
    atheris.Fuzz()  # exits the process: 0 when time is up, non-zero on a finding
    return 0


def run_hypothesis(name: str, seconds: int) -> int:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fuzz.targets import TARGETS

    target = TARGETS[name]
    runs = 0
    deadline = time.monotonic() + seconds

    @settings(
        max_examples=10_000,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.binary(max_size=2048))
    def case(data: bytes) -> None:
        nonlocal runs
        runs += 1
        try:
            target(data)
        except Exception:
            print(f"finding in {name}: {data!r} (saved to {_save(name, data)})")
            raise

    while time.monotonic() < deadline:
        try:
            case()
        except Exception:
            traceback.print_exc()
            print(f"{name}: {runs} runs, FINDING")
            return 1
    print(f"{name}: {runs} runs in {seconds}s (hypothesis), no finding")
    return 0


_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


def run_all(seconds: int, engine: str, names: tuple[str, ...] = NAMES) -> int:
    """Every target in its own process, one after the other; with atheris, each run's new
    inputs are then merged into the repository's corpus, and a table of the counts printed
    (docs/fuzzing.md keeps the last long run's)."""
    failed, rows = [], []
    FINDINGS.mkdir(exist_ok=True)
    for name in names:
        command = [sys.executable, "-m", "fuzz.run", name, f"--seconds={seconds}"]
        log_path = FINDINGS / f"{name}.log"
        with log_path.open("w") as log:
            code = subprocess.call([*command, f"--engine={engine}"], stdout=log, stderr=log)
        text = log_path.read_text(errors="replace")
        if code != 0:
            failed.append(name)
        if engine != "atheris":
            print(text.strip().splitlines()[-1] if text.strip() else f"{name}: no output")
            continue
        done = _DONE.findall(text)
        work = re.search(r"working corpus: (\S+)", text)
        execs, cov, ft, corp = done[-1] if done else ("?", "?", "?", "?")
        rows.append((name, execs, cov, ft, corp, "FINDING" if code else "none"))
        print(f"{name}: {execs} runs, cov {cov}, ft {ft}, corpus {corp}, exit {code}", flush=True)
        if work and code == 0:
            merge = [*command, "--engine=atheris", f"--merge-from={work.group(1)}"]
            subprocess.call(merge, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            shutil.rmtree(work.group(1), ignore_errors=True)
        _clean(name)
    if rows:
        print(f"\n| target | runs ({seconds} s) | coverage (edges) | features | corpus | finding |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    print("findings in: " + ", ".join(failed) if failed else "no findings")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__)
    parser.add_argument(
        "target", help=f"one of {', '.join(NAMES)}; several, comma-separated; or all"
    )
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--engine", choices=("auto", "atheris", "hypothesis"), default="auto")
    parser.add_argument(
        "--merge-from", default="", metavar="DIR", help="atheris: merge DIR into the corpus"
    )
    parser.add_argument("--inner", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401
        except ImportError:
            print("atheris is not installed (pip install -e '.[fuzz]'): using hypothesis")
            engine = "hypothesis"
        else:
            engine = "atheris"
    names = NAMES if args.target == "all" else tuple(args.target.split(","))
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        parser.error(f"unknown target(s): {', '.join(unknown)}")
    if len(names) > 1:
        return run_all(args.seconds, engine, names)
    if engine == "atheris":
        return run_atheris(args.target, args.seconds, args.merge_from, args.inner)
    return run_hypothesis(args.target, args.seconds)


if __name__ == "__main__":
    sys.exit(main())

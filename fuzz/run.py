"""Run one fuzz target (or all) for a while: atheris, coverage-guided, where it is installed
(the `fuzz` extra), else hypothesis with random bytes.

    python -m fuzz.run http_json --seconds 120
    python -m fuzz.run all --seconds 120      # each target in its own process

A finding prints its input and the traceback, is saved under fuzz/findings/, and exits 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

FINDINGS = Path(__file__).parent / "findings"
# fuzz.targets' names, kept here so that atheris instruments appliance before it is imported.
NAMES = ("http_json", "http_binary", "bytes", "grpc", "config", "s3")


def _save(name: str, data: bytes) -> Path:
    FINDINGS.mkdir(exist_ok=True)
    path = FINDINGS / f"{name}-{int(time.time())}.bin"
    path.write_bytes(data)
    return path


def run_atheris(name: str, seconds: int) -> int:
    import atheris  # type: ignore[import-untyped]  # no stubs

    with atheris.instrument_imports(include=["appliance", "fuzz"]):
        from fuzz.targets import TARGETS
    from fuzz.targets import seeds

    target = TARGETS[name]
    FINDINGS.mkdir(exist_ok=True)
    corpus = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))  # grows as coverage does
    for i, seed in enumerate(seeds()[name]):
        (corpus / f"seed{i}").write_bytes(seed)
    argv = [
        sys.argv[0],
        f"-max_total_time={seconds}",
        "-print_final_stats=1",
        "-rss_limit_mb=2048",
        f"-artifact_prefix={FINDINGS}/{name}-",
        "-max_len=4096",
        str(corpus),
    ]
    atheris.Setup(argv, target)
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


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__)
    parser.add_argument("target", choices=[*NAMES, "all"])
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--engine", choices=("auto", "atheris", "hypothesis"), default="auto")
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
    if args.target == "all":
        failed = []
        for name in NAMES:
            command = [sys.executable, "-m", "fuzz.run", name, f"--seconds={args.seconds}"]
            if subprocess.call([*command, f"--engine={engine}"]) != 0:
                failed.append(name)
        print("findings in: " + ", ".join(failed) if failed else "no findings")
        return 1 if failed else 0
    if engine == "atheris":
        return run_atheris(args.target, args.seconds)
    return run_hypothesis(args.target, args.seconds)


if __name__ == "__main__":
    sys.exit(main())

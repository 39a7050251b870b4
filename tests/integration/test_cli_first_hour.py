"""What a newcomer types in the first hour (issue 37), run as the real command: a mistyped flag
gets a short usage and a suggestion, `--version` prints the version, a missing optional package
stops the start in one line that says how to get it, `python -m configs.generate --help` helps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from appliance import __version__
from tests.serverproc import ROOT


def _run(
    *args: str, block: tuple[str, ...] = (), frozen: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python -m appliance ARGS`, optionally with modules made unimportable (as if not
    installed) and as the one-file binary (sys.frozen) would see itself."""
    prelude = "".join(f"sys.modules[{m!r}] = None; " for m in block)
    if frozen:
        prelude += "sys.frozen = True; "
    code = f"import sys; {prelude}from appliance.face.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_a_mistyped_flag_gets_a_short_usage_and_the_nearest_flag() -> None:
    result = _run("serve", "--model-repository", "x", "--http-prot", "8000")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "usage: edge-appliance serve [FLAGS]", result.stderr
    assert (
        "edge-appliance serve: error: unrecognized argument --http-prot "
        "(did you mean --http-port" in result.stderr
    )
    assert "--help" in lines[-1]
    assert len(lines) <= 4, result.stderr  # not the 95-flag usage


def test_tritonservers_spelling_without_serve_suggests_too() -> None:
    result = _run("--model-repository", "x", "--grpc-prot=9")
    assert result.returncode == 2
    assert "unrecognized argument --grpc-prot (did you mean --grpc-port" in result.stderr
    assert len(result.stderr.splitlines()) <= 4, result.stderr


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag_prints_the_version(flag: str) -> None:
    for args in ((flag,), ("serve", flag)):
        result = _run(*args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"edge-appliance {__version__} (commit "), result.stdout


def test_lowercase_v_is_unknown_and_points_at_version_and_verbosity() -> None:
    result = _run("-v")
    assert result.returncode == 2
    assert "unrecognized argument -v (did you mean --version or --log-verbose?)" in result.stderr


def test_an_unknown_command_suggests_the_nearest() -> None:
    result = _run("stauts")
    assert result.returncode == 2
    assert "unknown command 'stauts' (did you mean status?)" in result.stderr


def test_other_commands_suggest_too() -> None:
    result = _run("status", "--urll", "x")
    assert result.returncode == 2
    assert "unrecognized argument --urll (did you mean --url?)" in result.stderr
    assert result.stderr.splitlines()[0].startswith("usage: edge-appliance status")


def test_s3_without_the_s3_extra_is_one_line_with_the_pip_command(tmp_path: Path) -> None:
    result = _run(
        "serve",
        "--model-repository",
        "s3://bucket/models",
        "--model-store-dir",
        str(tmp_path),
        block=("aiobotocore",),
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "edge-appliance: --model-repository s3://bucket/models needs aiobotocore, which is not "
        "installed: pip install 'edge-appliance[s3]'"
    )


def test_a_public_key_without_cryptography_is_one_line(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not read: the check comes first\n")
    result = _run(
        "serve",
        "--model-repository",
        str(tmp_path),
        "--manifest-public-key",
        str(key),
        block=("cryptography",),
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "edge-appliance: --manifest-public-key needs cryptography, which is not installed: "
        "pip install 'edge-appliance[signing]'"
    )


def test_the_binary_says_what_it_lacks_not_pip() -> None:
    result = _run("version", block=("torch",), frozen=True)
    assert result.returncode == 0, result.stderr
    backends = next(line for line in result.stdout.splitlines() if line.startswith("backends:"))
    assert "pytorch (unavailable: this binary does not include torch)" in backends
    assert "pip install" not in backends


def _torch_model(root: Path) -> Path:
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.pt").write_bytes(b"not read: the backend is missing")
    (root / "m" / "config.pbtxt").write_text(
        'name: "m"\nplatform: "pytorch_libtorch"\nmax_batch_size: 0\n'
        'input [{ name: "x", data_type: TYPE_FP32, dims: [ 2 ] }]\n'
        'output [{ name: "y", data_type: TYPE_FP32, dims: [ 2 ] }]\n'
    )
    return root


def test_a_model_whose_backend_library_is_missing_says_how_to_get_it(tmp_path: Path) -> None:
    result = _run("check", str(_torch_model(tmp_path)), block=("torch",))
    assert result.returncode == 1
    assert (
        "model 'm': backend 'pytorch' needs torch, which is not installed: "
        "pip install 'edge-appliance[torch]'" in result.stdout
    ), result.stdout
    assert "Traceback" not in result.stderr, result.stderr


def test_configs_generate_help_is_help_not_a_folder(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "configs.generate", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "OUTPUT_DIR" in result.stdout
    assert list(tmp_path.iterdir()) == []  # no folder named --help
    typo = subprocess.run(
        [sys.executable, "-m", "configs.generate", "--out", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert typo.returncode == 2
    assert list(tmp_path.iterdir()) == []

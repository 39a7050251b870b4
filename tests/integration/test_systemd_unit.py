"""systemd/: the unit verifies without a warning, scores as hardened, and installs into a root.

`systemd-analyze verify` exits 0 on unknown keys and bad values and only prints them, so any
output fails here. The running behaviour (notify, watchdog, sandbox) is checked in a booted
container by scripts/systemd-nspawn-check.sh (docs/systemd.md).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.serverproc import ROOT

SYSTEMD = ROOT / "systemd"
UNIT = SYSTEMD / "edge-appliance.service"
BINARY = "/opt/edge-appliance/edge-appliance"  # where install.sh puts it; ExecStart runs it
MAX_EXPOSURE = 3.0

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze not installed (Debian: apt-get install systemd)"
)


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run([ANALYZE, *args], capture_output=True, text=True, timeout=60, check=False)


def _unit_copy(folder: Path, binary: Path, dropins: tuple[Path, ...] = ()) -> Path:
    """The unit in `folder`, ExecStart pointed at `binary` (verify needs an executable there);
    drop-ins go into the unit's .d folder beside it, where systemd-analyze finds them."""
    text = UNIT.read_text()
    assert f"ExecStart={BINARY} " in text, "ExecStart no longer runs what install.sh installs"
    unit = folder / UNIT.name
    unit.write_text(text.replace(f"ExecStart={BINARY} ", f"ExecStart={binary} "))
    if dropins:
        (folder / f"{UNIT.name}.d").mkdir()
        for dropin in dropins:
            shutil.copy(dropin, folder / f"{UNIT.name}.d" / dropin.name)
    return unit


def _stub_binary(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def _exposure(unit: Path) -> float:
    result = _analyze("security", "--offline=true", str(unit))
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    return float(found.group(1))


@needs_analyze
@pytest.mark.parametrize("dropins", [(), (SYSTEMD / "jetson.conf",)], ids=["x86", "jetson"])
def test_unit_verifies_without_a_warning(tmp_path: Path, dropins: tuple[Path, ...]) -> None:
    unit = _unit_copy(tmp_path, _stub_binary(tmp_path / "bin" / "edge-appliance"), dropins)
    result = _analyze("verify", str(unit))
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


@needs_analyze
def test_verify_would_catch_a_bad_setting(tmp_path: Path) -> None:
    """Guards the test above: a typo must produce output."""
    unit = _unit_copy(tmp_path, _stub_binary(tmp_path / "bin" / "edge-appliance"))
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSystem=strikt"))
    assert "ProtectSystem" not in _analyze("verify", str(unit)).stdout  # it goes to stderr
    assert "strikt" in _analyze("verify", str(unit)).stderr


@needs_analyze
def test_exposure_score_is_low(tmp_path: Path) -> None:
    unit = _unit_copy(tmp_path, _stub_binary(tmp_path / "bin" / "edge-appliance"))
    score = _exposure(unit)
    assert score <= MAX_EXPOSURE
    # README.md ("Running as a service") and the unit's header record the score.
    assert f"exposure {score}" in UNIT.read_text()
    assert f"exposure level {score}" in (ROOT / "README.md").read_text()


@needs_analyze
def test_jetson_dropin_keeps_the_score_low(tmp_path: Path) -> None:
    binary = _stub_binary(tmp_path / "bin" / "edge-appliance")
    assert _exposure(_unit_copy(tmp_path, binary, (SYSTEMD / "jetson.conf",))) <= MAX_EXPOSURE


def _fake_build(folder: Path) -> Path:
    _stub_binary(folder / "edge-appliance")
    (folder / "_internal").mkdir()
    (folder / "_internal" / "libpython.so").write_text("")
    return folder


def _install(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SYSTEMD / "install.sh"), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "DESTDIR"},
    )


def test_install_into_a_root_is_idempotent(tmp_path: Path) -> None:
    dist = _fake_build(tmp_path / "dist" / "edge-appliance")
    models = tmp_path / "models"
    (models / "m" / "1").mkdir(parents=True)
    (models / "m" / "1" / "model.onnx").write_bytes(b"x")
    (models / "m" / "1" / "model.onnx").chmod(0o600)  # made readable for the dynamic user
    root = tmp_path / "root"

    first = _install(root, "--dist", str(dist), "--models", str(models), "--jetson")
    assert first.returncode == 0, first.stderr
    assert os.access(root / BINARY.lstrip("/"), os.X_OK)
    assert (root / "opt/edge-appliance/_internal/libpython.so").is_file()
    assert os.readlink(root / "usr/local/bin/edge-appliance") == BINARY
    assert (root / "etc/systemd/system/edge-appliance.service").read_text() == UNIT.read_text()
    assert (root / "etc/systemd/system/edge-appliance.service.d/jetson.conf").is_file()
    env = root / "etc/edge-appliance/edge-appliance.env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600  # it may hold credentials
    model = root / "var/lib/edge-appliance-models/m/1/model.onnx"
    assert stat.S_IMODE(model.stat().st_mode) & 0o004

    env.write_text("EDGE_APPLIANCE_ARGS=--log-verbose 1\n")  # the admin's edit survives
    (dist / "_internal" / "new.so").write_text("")
    (dist / "_internal" / "libpython.so").unlink()
    again = _install(root, "--dist", str(dist))
    assert again.returncode == 0, again.stderr
    assert env.read_text() == "EDGE_APPLIANCE_ARGS=--log-verbose 1\n"
    assert (root / "opt/edge-appliance/_internal/new.so").is_file()
    assert not (root / "opt/edge-appliance/_internal/libpython.so").exists()  # replaced whole
    assert sorted(p.name for p in (root / "opt").iterdir()) == ["edge-appliance"]
    assert model.is_file()  # a repository is replaced only with --models


@needs_analyze
def test_the_installed_unit_verifies(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert _install(root, "--dist", str(_fake_build(tmp_path / "dist"))).returncode == 0
    unit = _unit_copy(tmp_path, root / BINARY.lstrip("/"))
    result = _analyze("verify", str(unit))
    assert result.stdout + result.stderr == ""


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="systemctl not installed")
def test_install_can_enable_the_unit_offline(tmp_path: Path) -> None:
    root = tmp_path / "root"
    result = _install(root, "--dist", str(_fake_build(tmp_path / "dist")), "--enable")
    assert result.returncode == 0, result.stderr
    wants = root / "etc/systemd/system/multi-user.target.wants/edge-appliance.service"
    assert wants.is_symlink()

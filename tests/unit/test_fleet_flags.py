"""serve's fleet flags: --device-id, --device-label, --fleet-report-interval and their env."""

from __future__ import annotations

import argparse

import pytest

from appliance.common.settings import ServerSettings
from appliance.flags.serve import add_serve_flags, settings_from_args


def _settings(*flags: str) -> ServerSettings:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    return settings_from_args(parser.parse_args(["--model-repository", "models", *flags]))


def test_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_DEVICE_ID", "from-env")
    monkeypatch.setenv("EDGE_DEVICE_LABELS", "site=paris")
    settings = _settings(
        "--device-id=dev-7",
        "--device-label=site=berlin",
        "--device-label=hw=orin-nano",
        "--fleet-report-interval=60",
    )
    assert settings.device_id == "dev-7"
    assert settings.device_labels == (("site", "berlin"), ("hw", "orin-nano"))
    assert settings.fleet_report_interval_secs == 60.0


def test_the_environment_and_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGE_DEVICE_ID", raising=False)
    monkeypatch.delenv("EDGE_DEVICE_LABELS", raising=False)
    settings = _settings()
    assert (settings.device_id, settings.device_labels) == (None, ())  # machine id at start
    assert settings.fleet_report_interval_secs == 300.0
    monkeypatch.setenv("EDGE_DEVICE_ID", "cam-12")
    monkeypatch.setenv("EDGE_DEVICE_LABELS", "site=berlin,hw=orin-nano")
    settings = _settings("--fleet-report-interval=0")
    assert settings.device_id == "cam-12"
    assert settings.device_labels == (("site", "berlin"), ("hw", "orin-nano"))
    assert settings.fleet_report_interval_secs == 0.0


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--device-id=a b"], {}, "--device-id 'a b' is not a device id"),
        ([], {"EDGE_DEVICE_ID": "x/y"}, "EDGE_DEVICE_ID 'x/y' is not a device id"),
        (["--device-label=site"], {}, "--device-label 'site' is not key=value"),
        ([], {"EDGE_DEVICE_LABELS": "a=1,a=2"}, "label 'a' given twice"),
        (["--fleet-report-interval=10"], {}, "must be 0 (never) or at least 30, got 10"),
    ],
)
def test_a_bad_identity_stops_the_start(
    flags: list[str], env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGE_DEVICE_ID", raising=False)
    monkeypatch.delenv("EDGE_DEVICE_LABELS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        _settings(*flags)
    assert message in str(stopped.value)

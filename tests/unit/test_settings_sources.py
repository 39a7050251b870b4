"""One source of settings: serve's flags, `check` and `tune` run the runtime by the same rules."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from appliance.common.settings import ServerSettings
from appliance.flags.serve import add_serve_flags, settings_from_args
from appliance.runtime.settings import RuntimeSettings
from appliance.tools import check, tune

REPO = Path("models")


def _serve_settings(*flags: str) -> ServerSettings:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    return settings_from_args(parser.parse_args(["--model-repository", str(REPO), *flags]))


def _comparable(settings: RuntimeSettings) -> RuntimeSettings:
    """Without what differs by design: how many models load at once, where engines go, and
    the state folder (serve keeps the memory budget's measured costs there; check and tune
    keep nothing)."""
    return dataclasses.replace(settings, load_concurrency=0, cache_dir=None, state_dir=None)


def test_serve_flags_default_to_the_settings_dataclasses() -> None:
    served = _serve_settings()
    # Where the state goes depends on the environment ($STATE_DIRECTORY); everything else is
    # the dataclass's default.
    assert dataclasses.replace(served, model_store_dir=None) == ServerSettings(
        model_repositories=(REPO,)
    )


def test_check_tune_and_serve_read_the_same_runtime_defaults() -> None:
    serve = RuntimeSettings.from_server(_serve_settings())
    checked = check.runtime_settings((REPO,), strict=False, require_manifest=False)
    tuned = tune.runtime_settings(REPO)
    assert _comparable(checked) == _comparable(serve)
    assert _comparable(tuned) == _comparable(serve)
    # The queue-wait bound that once differed (1 s for serve, 10 s for tune):
    assert tuned.scheduling.max_queue_wait_ms == serve.scheduling.max_queue_wait_ms == 1_000


def test_a_flag_reaches_the_runtime() -> None:
    serve = RuntimeSettings.from_server(_serve_settings("--max-queue-wait-ms", "250"))
    assert serve.scheduling.max_queue_wait_ms == 250

"""The command sets gRPC core's environment before grpc is imported (appliance/face/__init__.py):
core reads GRPC_EXPERIMENTS once, when grpc is first imported, so a value set later does
nothing. Each check runs in a fresh interpreter, as the command starts."""

from __future__ import annotations

import os
import subprocess
import sys

from appliance.face import GRPC_EXPERIMENTS

PROBE = (
    "import sys, appliance\n"
    "before = 'grpc' in sys.modules\n"
    "import os, appliance.face.cli\n"
    "print(before, 'grpc' in sys.modules, os.environ.get('GRPC_EXPERIMENTS'))\n"
)


def _probe(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_experiments_are_set_before_grpc_is_imported() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    before, after, value = _probe(env)
    # `appliance` itself must not import grpc: the face's package sets the variable first.
    assert (before, after, value) == ("False", "True", GRPC_EXPERIMENTS)
    assert GRPC_EXPERIMENTS == "-event_engine_listener"


def test_a_value_given_is_kept() -> None:
    env = {**os.environ, "GRPC_EXPERIMENTS": "event_engine_listener"}
    assert _probe(env)[2] == "event_engine_listener"

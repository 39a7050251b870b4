"""Every flag of every command has help, and its default is shown (issue 37): walking the
parsers makes the rule hold for flags added later."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from appliance.common.settings import ServerSettings
from appliance.face.cli import build_parser
from appliance.flags.values import parse_bool
from tests.serverproc import ROOT

COMMANDS = (
    "serve",
    "tune",
    "check",
    "status",
    "pin",
    "unpin",
    "fleet publish",
    "version",
    "manifest",
)
EMPTY = (None, False, "", [], ())


def _walk(parser: argparse.ArgumentParser) -> list[tuple[argparse.ArgumentParser, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _walk(sub)
        elif action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
            found.append((parser, action))
    return found


ACTIONS = _walk(build_parser())


def _actions() -> list[tuple[str, argparse.Action]]:
    return [(parser.prog, action) for parser, action in ACTIONS]


def _shown(prog: str, action: argparse.Action) -> str:
    """The help text `--help` prints for the action, by its parser's own formatter."""
    parser = next(p for p, a in ACTIONS if a is action)
    return parser._get_formatter()._get_help_string(action)


def test_the_walk_reaches_every_command() -> None:
    progs = {prog for prog, _ in _actions()}
    for command in COMMANDS:
        assert f"edge-appliance {command}" in progs


@pytest.mark.parametrize(("prog", "action"), _actions(), ids=lambda x: getattr(x, "dest", x))
def test_every_argument_has_help(prog: str, action: argparse.Action) -> None:
    assert (action.help or "").strip(), f"{prog} {action.option_strings or action.dest}: no help"
    assert "(see --help)" not in action.help


@pytest.mark.parametrize(("prog", "action"), _actions(), ids=lambda x: getattr(x, "dest", x))
def test_every_default_is_shown(prog: str, action: argparse.Action) -> None:
    """A flag with a value unless given shows it; tritonserver's booleans (true/false, default
    None here) say which they are."""
    shown = _shown(prog, action).lower()
    flag = f"{prog} {action.option_strings}"
    if action.option_strings and action.default not in (*EMPTY, argparse.SUPPRESS):
        assert "default" in shown, f"{flag}: its default {action.default!r} is not shown"
    if action.type is parse_bool:
        assert "default" in shown, f"{flag}: true or false unless given?"


def test_serve_help_shows_ports_addresses_and_control_mode_defaults() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    entries: dict[str, str] = {}  # "--flag METAVAR" -> its help, unwrapped
    for line in result.stdout.splitlines():
        if line.startswith("  -"):
            head, _, rest = line.strip().partition("  ")
            current = head
            entries[current] = rest
        elif line.startswith("   ") and entries:
            entries[current] += " " + line.strip()
    defaults = ServerSettings(model_repositories=())
    for flag, value in (
        ("--http-port PORT", defaults.http_port),
        ("--grpc-port PORT", defaults.grpc_port),
        ("--metrics-port PORT", defaults.metrics_port),
        ("--http-address ADDRESS", defaults.http_address),
        ("--model-control-mode {none,poll,explicit}", defaults.model_control_mode),
    ):
        assert f"(default: {value})" in " ".join(entries[flag].split()), entries[flag]

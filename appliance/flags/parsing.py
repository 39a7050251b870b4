"""The argument parser every `edge-appliance` command uses: a mistake gets a short usage, the
error and, for a mistyped flag, the nearest real ones (`did you mean --http-port?`), exit 2;
`--help` shows every flag's default.

Python 3.12+ has `ArgumentParser(suggest_on_error=True)`; 3.10 and 3.11 have nothing, so the
suggestions are difflib's closest matches over the parser's own option strings.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

# Words that users of other tools type, and what they mean here.
_KNOWN_MISTAKES = {
    "-v": ("--version", "--log-verbose"),  # kubectl's -v is verbosity, python's -V the version
    "--verbose": ("--log-verbose",),
}


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to a flag's help unless the help already says its default or the
    default is empty (None, False, "", []: the flag is off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default in (None, False, "", [], ())
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with a short usage and suggestions on errors (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_args(  # type: ignore[override]  # typeshed's overloads; same behaviour
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized(extras))
        return parsed

    def unrecognized(self, extras: list[str]) -> str:
        """`unrecognized argument --http-prot (did you mean --http-port?)`: each unknown flag
        with its nearest real ones (the values after an unknown flag are not named)."""
        flags = [e for e in extras if e.startswith("-") and e != "-"]
        if not flags:
            return f"unrecognized argument{'s' if len(extras) > 1 else ''} {' '.join(extras)}"
        known = sorted(set(self.option_strings()))
        said = []
        for flag in flags:
            name = flag.split("=", 1)[0]
            close = [m for m in _KNOWN_MISTAKES.get(name, ()) if m in known]
            close += [
                m for m in difflib.get_close_matches(name, known, n=2, cutoff=0.6) if m not in close
            ]
            said.append(f"{name} (did you mean {' or '.join(close)}?)" if close else name)
        return f"unrecognized argument{'s' if len(said) > 1 else ''} {', '.join(said)}"

    def option_strings(self) -> Iterator[str]:
        """Every flag of this parser and of its subcommands' parsers."""
        for action in self._actions:
            yield from action.option_strings
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if isinstance(sub, Parser):
                        yield from sub.option_strings()

    def error(self, message: str) -> NoReturn:
        """The usage (`usage: PROG [FLAGS]` where argparse's runs past two lines), the error,
        where the help is; exit 2 (argparse's status)."""
        usage = self.format_usage().rstrip()
        if usage.count("\n") > 1:
            usage = f"usage: {self.prog} [FLAGS]"
        sys.stderr.write(f"{usage}\n{self.prog}: error: {message}\n(see {self.prog} --help)\n")
        sys.exit(2)


def every_action(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """(prog, action) for each argument of the parser and of its subcommands' parsers."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from every_action(sub)
        else:
            yield parser.prog, action

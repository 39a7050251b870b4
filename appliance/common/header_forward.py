"""Header forwarding, as tritonserver's `--http-header-forward-pattern` and
`--grpc-header-forward-pattern`.

    --http-header-forward-pattern 'x-tenant.*'

Each HTTP header (infer requests) or gRPC metadata key (ModelInfer, and every request of a
ModelStreamInfer stream) whose name the pattern matches becomes a string request parameter,
under the name as the client sent it, with its value: the model reads it in its request
parameters (`request.parameters()` in a Python model). As tritonserver: the pattern is a
search (it may match anywhere in the name) and case-insensitive unless it turns that off
itself (`(?-i)`); a matching name that is a reserved parameter (`sequence_id`, `priority`, ...,
or one starting `triton_`, compared as sent) refuses the request, 400 / INVALID_ARGUMENT, in
tritonserver's words. gRPC metadata keys are always lower case on the wire.

tritonserver compiles `(?i)` + the pattern with RE2; this module gives Python's `re` the same
reading: RE2's inline flag groups (`(?-i)`, `(?s)` anywhere, which `re` accepts only at the
start) become scoped groups, and a pattern `re` would read differently (a POSIX class
`[[:alpha:]]`, a flag `re` lacks) stops the start with the reason. Without the flag nothing
of this runs: the front ends hold None and never enter it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from typing import Any

from appliance.common.errors import InvalidInput

# tritonserver's reserved parameter keys (its src/common.h), refused as forwarded headers;
# so is any name starting with RESERVED_PREFIX.
RESERVED_KEYS = frozenset(
    (
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "binary_data_output",
    )
)
RESERVED_PREFIX = "triton_"
# Distinct header names whose match is remembered (clients send the same few with every
# request); past it the memory starts afresh, so ever new names cost a bounded amount.
MAX_REMEMBERED_NAMES = 256

# An RE2 inline flag group that is not scoped: (?i), (?-i), (?is-m), ...
_FLAG_GROUP = re.compile(r"\(\?([A-Za-z]+(?:-[A-Za-z]*)?|-[A-Za-z]+)\)")


def scoped_flags(pattern: str) -> str:
    """`pattern` (RE2 syntax) with every unscoped inline flag group made a scoped one, which
    Python's `re` reads the same: RE2's `(?f)` applies to the rest of its enclosing group,
    across `|`, so `a(?-i)b|c` becomes `a(?-i:b)|(?-i:c)`. Pure; a malformed pattern is left
    for `re` to refuse."""
    if "(?" not in pattern:
        return pattern
    out: list[str] = []
    levels: list[list[str]] = [[]]  # per open group: the flag groups opened in it
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[":  # a character class: copied as it is, `(` and `|` are literal in it
            end = _class_end(pattern, i)
            out.append(pattern[i:end])
            i = end
            continue
        if c == "(":
            match = _FLAG_GROUP.match(pattern, i)
            if match is not None:
                opener = f"(?{match.group(1)}:"
                levels[-1].append(opener)
                out.append(opener)
                i = match.end()
                continue
            levels.append([])
        elif c == "|":
            opened = levels[-1]
            out.append(")" * len(opened) + "|" + "".join(opened))
            i += 1
            continue
        elif c == ")" and len(levels) > 1:
            out.append(")" * len(levels.pop()))
        out.append(c)
        i += 1
    out.append(")" * len(levels[0]))
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """The index after the character class that opens at `start` (the end of the pattern
    when it does not close: `re` refuses it then)."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):  # a `]` first is literal
        i += 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "]":
            return i + 1
        i += 1
    return len(pattern)


def compile_pattern(pattern: str, flag: str) -> re.Pattern[str]:
    """tritonserver's reading of a forward pattern (`(?i)` + it, RE2), for Python's `re`;
    ValueError naming `flag` when it is not a pattern, or one `re` would read differently."""
    try:
        with warnings.catch_warnings():
            # re warns of what it reads differently from other engines (`[[:alpha:]]`).
            warnings.simplefilter("error")
            return re.compile(scoped_flags(pattern), re.IGNORECASE)
    except (re.error, Warning) as exc:
        raise ValueError(f"{flag} '{pattern}' is not a usable regular expression: {exc}") from None


def reserved_refusal(name: str) -> InvalidInput:
    """tritonserver's refusal of a forwarded header whose name is a reserved parameter."""
    return InvalidInput(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")


class HeaderForward:
    """One protocol's forwarding: which headers become request parameters. Built once at
    start-up from a flag's pattern; `None` stands for no flag (`from_pattern`)."""

    __slots__ = ("_matches", "_regex", "pattern")

    def __init__(self, pattern: str, flag: str) -> None:
        self.pattern = pattern
        self._regex = compile_pattern(pattern, flag)
        self._matches: dict[str, bool] = {}  # name -> whether the pattern matches it

    @classmethod
    def from_pattern(cls, pattern: str | None, flag: str) -> HeaderForward | None:
        """None when the flag was not given: the front end's code path is never entered."""
        return None if pattern is None else cls(pattern, flag)

    def _match(self, name: str) -> bool:
        matches = self._matches
        found = matches.get(name)
        if found is None:
            found = self._regex.search(name) is not None
            if len(matches) >= MAX_REMEMBERED_NAMES:
                matches.clear()
            matches[name] = found
        return found

    def parameters(self, headers: Iterable[tuple[Any, Any]]) -> dict[str, str]:
        """The parameters the matching `headers` become: HTTP's (name, value) bytes as
        received, or gRPC metadata (key, str value, or bytes for a `-bin` key). Raises
        InvalidInput (tritonserver's words) at a matching reserved name. Values are UTF-8
        text (a byte that is not: U+FFFD); a repeated name keeps its last value."""
        forwarded: dict[str, str] = {}
        for name, value in headers:
            if type(name) is not str:
                name = name.decode("latin-1")
            if not self._match(name):
                continue
            if name in RESERVED_KEYS or name.startswith(RESERVED_PREFIX):
                raise reserved_refusal(name)
            if type(value) is not str:
                value = bytes(value).decode("utf-8", "replace")
            forwarded[name] = value
        return forwarded

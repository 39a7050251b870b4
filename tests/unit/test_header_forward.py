"""Header forwarding's pure parts: tritonserver's reading of the pattern (`(?i)` + it, RE2) in
Python's `re`, which names match, the reserved names, and the flags' checks at start-up."""

from __future__ import annotations

import pytest

from appliance.common.errors import InvalidInput
from appliance.common.header_forward import HeaderForward, compile_pattern, scoped_flags
from appliance.common.settings import ServerSettings
from appliance.face.cli import build_parser
from appliance.flags.serve import settings_from_args

RESERVED = (
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "headers",
    "binary_data_output",
    "triton_enable_empty_final_response",
    "triton_anything",
)


def _settings(*flags: str) -> ServerSettings:
    args = build_parser().parse_args(["serve", "--model-repository", "/models", *flags])
    return settings_from_args(args)


@pytest.mark.parametrize(
    ("pattern", "python"),
    [
        ("MY_HEADER.*", "MY_HEADER.*"),
        ("(?-i)MY_HEADER.*", "(?-i:MY_HEADER.*)"),
        # RE2's flags hold to the end of their group, across its alternatives.
        ("a(?-i)b|c", "a(?-i:b)|(?-i:c)"),
        ("(x(?-i)y|z)w|v", "(x(?-i:y)|(?-i:z))w|v"),
        ("(?s)a(?-i)b", "(?s:a(?-i:b))"),
        # Inside a class or escaped, `(?i)` is no flag group.
        ("[(?i)]x", "[(?i)]x"),
        (r"\(?i)", r"\(?i)"),
        ("[]|(]a", "[]|(]a"),
        ("(?:a|b)(?P<n>c)", "(?:a|b)(?P<n>c)"),
    ],
)
def test_re2_inline_flag_groups_become_scoped_groups(pattern: str, python: str) -> None:
    assert scoped_flags(pattern) == python


def test_the_pattern_is_a_case_insensitive_search_unless_it_says_otherwise() -> None:
    forward = compile_pattern("MY_HEADER.*", "--http-header-forward-pattern")
    assert forward.search("my_header_1")
    assert forward.search("x-my_header")  # a search: anywhere in the name
    assert not forward.search("header_1")
    strict = compile_pattern("(?-i)MY_HEADER.*", "--grpc-header-forward-pattern")
    assert strict.search("MY_HEADER_1")
    assert not strict.search("my_header_1")
    mixed = compile_pattern("a(?-i)B|c", "--grpc-header-forward-pattern")
    assert mixed.search("AB")
    assert not mixed.search("Ab")
    assert mixed.search("c")
    assert not mixed.search("C")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(", "missing )"),
        ("[[:alpha:]]", "nested set"),  # POSIX class: RE2 reads it, `re` would not
        (r"\pL", r"bad escape \p"),
        ("(?U)a", "?U"),  # RE2's ungreedy flag: `re` has none
    ],
)
def test_a_pattern_re_cannot_read_as_re2_stops_the_start(pattern: str, why: str) -> None:
    for flag in ("--http-header-forward-pattern", "--grpc-header-forward-pattern"):
        with pytest.raises(SystemExit) as info:
            _settings(flag, pattern)
        message = str(info.value)
        assert message.startswith(f"edge-appliance: {flag} '{pattern}' is not a usable regular")
        assert why in message


def test_the_flags_reach_the_settings_and_are_no_longer_ignored() -> None:
    settings = _settings(
        "--http-header-forward-pattern=MY_.*", "--grpc-header-forward-pattern", "(?-i)x-"
    )
    assert settings.http_header_forward_pattern == "MY_.*"
    assert settings.grpc_header_forward_pattern == "(?-i)x-"
    assert not any("forward" in flag for flag in settings.ignored_flags)
    unset = _settings()
    assert unset.http_header_forward_pattern is None
    assert unset.grpc_header_forward_pattern is None
    assert HeaderForward.from_pattern(None, "--http-header-forward-pattern") is None
    # Given empty, it matches every name, as tritonserver's `(?i)` does.
    assert _settings("--http-header-forward-pattern=").http_header_forward_pattern == ""


def test_matching_headers_become_string_parameters_under_their_names_as_sent() -> None:
    forward = HeaderForward("MY_HEADER.*", "--http-header-forward-pattern")
    raw = [
        (b"Host", b"127.0.0.1"),
        (b"My_Header_1", b"v1"),
        (b"my_header_2", b'a "quoted" value\\ '),
        (b"header_1", b"no"),
        (b"my_header_3", "caf\u00e9".encode()),
        (b"my_header_4", b"\xff"),
    ]
    assert forward.parameters(raw) == {
        "My_Header_1": "v1",
        "my_header_2": 'a "quoted" value\\ ',
        "my_header_3": "caf\u00e9",
        "my_header_4": "\ufffd",
    }
    grpc_metadata = [("my_header_1", "v"), ("user-agent", "grpc"), ("my_header_bin", b"\x01")]
    assert forward.parameters(grpc_metadata) == {"my_header_1": "v", "my_header_bin": "\x01"}
    assert forward.parameters([]) == {}


@pytest.mark.parametrize("name", RESERVED)
def test_a_matching_reserved_name_is_refused_in_tritons_words(name: str) -> None:
    forward = HeaderForward(".*", "--grpc-header-forward-pattern")
    with pytest.raises(InvalidInput) as info:
        forward.parameters([("fine", "1"), (name, "x")])
    assert info.value.message == (
        f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    )
    # Only a name the pattern matches is looked at, and the check is on the name as sent.
    assert HeaderForward("^fine$", "--x").parameters([("fine", "1"), (name, "x")]) == {"fine": "1"}
    assert HeaderForward(".*", "--x").parameters([(name.upper(), "x")]) == {name.upper(): "x"}


def test_the_names_remembered_stay_bounded() -> None:
    forward = HeaderForward("^keep", "--http-header-forward-pattern")
    for i in range(1000):
        forward.parameters([(f"name-{i}".encode(), b"v")])
    assert len(forward._matches) <= 256
    assert forward.parameters([(b"keep-me", b"v")]) == {"keep-me": "v"}

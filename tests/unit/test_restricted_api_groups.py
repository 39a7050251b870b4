"""Restricted API groups refuse, at start, a key or value that would protect nothing."""

from __future__ import annotations

import pytest

from appliance.common.access import Restriction, parse_groups


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("logging:admin-key=", "the value of header 'admin-key' is empty"),
        ("logging:admin-key=   ", "the value of header 'admin-key' is empty"),
        ("logging:=s3cret", "the header name \\(KEY in KEY=VALUE\\) is empty"),
        ("logging: =s3cret", "the header name \\(KEY in KEY=VALUE\\) is empty"),
        (
            "logging:admin-key= s3cret",
            "the value of header 'admin-key' starts or ends with whitespace",
        ),
    ],
)
def test_empty_keys_and_values_are_refused(value: str, message: str) -> None:
    shown = value.replace("s3cret", "...").replace("= ...", "=...")
    with pytest.raises(ValueError, match=f"^--http-restricted-api '{shown}': {message}"):
        parse_groups([value], "--http-restricted-api")


def test_errors_never_repeat_the_secret() -> None:
    for bad in ("logging:=s3cret", "logging:admin-key= s3cret", "nope:admin-key=s3cret"):
        with pytest.raises(ValueError, match="--http-restricted-api") as info:
            parse_groups([bad], "--http-restricted-api")
        assert "s3cret" not in str(info.value)


def test_a_good_group_still_parses() -> None:
    assert parse_groups(["logging,trace:Admin-Key=s3cret"], "--grpc-restricted-protocol") == {
        "logging": Restriction("admin-key", "s3cret"),
        "trace": Restriction("admin-key", "s3cret"),
    }

"""Restricted API groups, as tritonserver's `--http-restricted-api` / `--grpc-restricted-protocol`.

    --http-restricted-api=model-repository,shared-memory,logging:admin-key=s3cret

A call to an API in a group must carry the group's header with the group's value: over HTTP
the header is `admin-key`, over gRPC the metadata key is `triton-grpc-protocol-admin-key`.
Otherwise it is refused with 403 / PERMISSION_DENIED and the call does nothing. An API may be
in one group only. APIs in no group are open, as in Triton.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from appliance.common.errors import ApplianceError, ErrorCode

APIS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
    # The status page: GET /, /status, /status.json, /openapi.json (HTTP only; naming it in
    # --grpc-restricted-protocol restricts nothing, as gRPC serves no page).
    "status",
)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


class PermissionDenied(ApplianceError):
    code = ErrorCode.PERMISSION_DENIED


@dataclass(frozen=True)
class Restriction:
    key: str  # lower case: HTTP and gRPC header names are case-insensitive
    value: str


def parse_groups(values: Sequence[str], flag: str) -> dict[str, Restriction]:
    """API -> its restriction, from repeated `API,API,...:key=value` flags."""
    restricted: dict[str, Restriction] = {}
    for text in values:
        apis, sep, pair = text.rpartition(":")
        key, eq, value = pair.partition("=")
        # Errors quote the flag without its secret (they reach the journal).
        text = f"{apis}{sep}{key}{eq}{'...' if value.strip() else value}"
        if not sep or not apis or not eq:
            raise ValueError(f"{flag} {text!r}: expected API[,API...]:KEY=VALUE")
        if not key.strip():
            raise ValueError(f"{flag} {text!r}: the header name (KEY in KEY=VALUE) is empty")
        if not value.strip():
            # An empty value would restrict nothing a client cannot send.
            raise ValueError(
                f"{flag} {text!r}: the value of header '{key.strip()}' is empty; "
                "give the secret a client must send"
            )
        if value != value.strip():
            # HTTP strips a header value's surrounding whitespace: it could never match.
            raise ValueError(
                f"{flag} {text!r}: the value of header '{key.strip()}' starts or ends with "
                "whitespace, which HTTP clients cannot send"
            )
        for api in (a.strip() for a in apis.split(",")):
            if api not in APIS:
                raise ValueError(
                    f"{flag} {text!r}: unknown API '{api}'; expected one of {', '.join(APIS)}"
                )
            if api in restricted:
                raise ValueError(f"{flag}: API '{api}' is in more than one group")
            restricted[api] = Restriction(key.strip().lower(), value)
    return restricted


class Restrictions:
    def __init__(self, restricted: Mapping[str, Restriction], header_prefix: str = "") -> None:
        self._restricted = dict(restricted)
        self._prefix = header_prefix

    def __bool__(self) -> bool:
        return bool(self._restricted)

    def restricts(self, api: str) -> bool:
        return api in self._restricted

    def check_all(self, apis: Sequence[str], headers: Mapping[str, str]) -> None:
        """`check` for each of `apis`: an endpoint that shows what several APIs show."""
        for api in apis:
            self.check(api, headers)

    def check(self, api: str, headers: Mapping[str, str]) -> None:
        """Raise PermissionDenied unless the call may use `api`."""
        rule = self._restricted.get(api)
        if rule is None:
            return
        header = self._prefix + rule.key
        sent: str | bytes | None = headers.get(header)
        # Compared as bytes: aiohttp keeps a value's non-UTF-8 bytes as surrogates (which a
        # plain encode() refuses), gRPC gives a "-bin" key's value as bytes.
        if isinstance(sent, str):
            sent = sent.encode("utf-8", "surrogateescape")
        if sent is None or not hmac.compare_digest(sent, rule.value.encode()):
            # tritonserver's words: gRPC's name the protocol, HTTP's the API
            kind = "protocol" if self._prefix == GRPC_HEADER_PREFIX else "API"
            raise PermissionDenied(
                f"This {kind} is restricted, expecting header '{header}' with the configured "
                f"value ({api} API)"
            )

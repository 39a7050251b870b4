"""JSON helpers shared by the front ends: fast orjson, with NaN / Infinity kept as Triton does.

orjson is several times faster than the json module for tensor-sized documents, but it refuses
the NaN / Infinity tokens that tritonclient writes and would write NaN as null. Both directions
fall back to the json module only when such values are present.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from appliance.common.errors import InvalidInput
from appliance.common.protojson import message_to_dict as message_to_dict


def loads(data: bytes | bytearray | str, what: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as first:
        if "depth limit" in str(first):  # nested deeper than orjson allows (1024)
            raise InvalidInput(f"malformed JSON in {what}: nested too deeply") from None
        try:
            return json.loads(data)  # NaN / Infinity, which orjson refuses
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise InvalidInput(f"malformed JSON in {what}: {first}") from None


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_has_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    return False


def dumps(value: Any, float_data: list[Any] | None = None) -> bytes:
    """Serialize; `float_data` are the float lists to scan for NaN / Infinity (None: scan all)."""
    scan = value if float_data is None else float_data
    if _has_nonfinite(scan):
        return json.dumps(value, separators=(",", ":")).encode()
    return orjson.dumps(value)

"""Protobuf messages as Triton writes them in JSON (model config responses, Python model args)."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def message_to_dict(message: Message) -> dict[str, Any]:
    """A protobuf message as Triton writes it in JSON: field names as in the .proto, every
    field present, in the .proto's order, and 64-bit integers as numbers (protobuf's own JSON
    makes them strings)."""
    try:
        raw = json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    except TypeError:  # protobuf < 5
        raw = json_format.MessageToDict(
            message, preserving_proto_field_name=True, including_default_value_fields=True
        )
    _as_triton_writes(message, raw)
    return raw  # type: ignore[no-any-return]  # MessageToDict returns dict[str, Any]


def _repeated(field: FieldDescriptor) -> bool:
    # protobuf 6 deprecates `label` for the `is_repeated` attribute; protobuf 4 lacks it.
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _as_triton_writes(message: Message, raw: dict[str, Any]) -> None:
    # Python's JSON puts the fields that are set first; C++'s (Triton's) writes the .proto's
    # order, which readers of the served config see.
    ordered = {f.name: raw[f.name] for f in message.DESCRIPTOR.fields if f.name in raw}
    raw.clear()
    raw.update(ordered)
    for field in message.DESCRIPTOR.fields:
        if field.name not in raw:
            continue
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                if value_field.message_type is not None:
                    _as_triton_writes(item, raw[field.name][str(key)])
                elif value_field.type in _INT64_TYPES:
                    raw[field.name][str(key)] = int(item)
        elif field.message_type is not None:
            if _repeated(field):
                for item, item_raw in zip(value, raw[field.name], strict=True):
                    _as_triton_writes(item, item_raw)
            else:
                _as_triton_writes(value, raw[field.name])
        elif field.type in _INT64_TYPES:
            if _repeated(field):
                raw[field.name] = [int(v) for v in value]
            else:
                raw[field.name] = int(value)


def parse_lenient(text: str, message: Message) -> Message:
    """`text` (JSON) into `message` as tritonserver's C++ protobuf JSON parser reads it: a
    repeated field given one value instead of a list holds that one value
    (`"instance_group": {"count": 2}`). Otherwise json_format.Parse's reading and errors."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # nesting past json's depth too
        return json_format.Parse(text, message)  # its ParseError, in its words
    if isinstance(value, dict):
        _listed(message.DESCRIPTOR, value)
        return json_format.ParseDict(value, message)
    return json_format.Parse(text, message)


def _listed(descriptor: Any, raw: dict[str, Any]) -> None:
    """Each repeated field of `raw` given a single value, made a list of it (in place)."""
    for key, value in raw.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        if field is None:
            continue
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map:
            value_type = field.message_type.fields_by_name["value"].message_type
            if value_type is not None and isinstance(value, dict):
                for item in value.values():
                    if isinstance(item, dict):
                        _listed(value_type, item)
            continue
        if _repeated(field) and not isinstance(value, list) and value is not None:
            value = raw[key] = [value]
        if field.message_type is not None:
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, dict):
                    _listed(field.message_type, item)

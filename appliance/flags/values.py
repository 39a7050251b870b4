"""tritonserver's flag values, parsed: the words its booleans and integers take, and its
compound flags (`--trace-config`, `--backend-config`, `--cache-config`, `--metrics-config`,
`--rate-limit-resource`), each into the settings it sets and the entries accepted but ignored.
Pure; a value tritonserver refuses stops the start here too (SystemExit with the reason)."""

from __future__ import annotations

import argparse
from typing import Any


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None


def on(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def add_bool(parser: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    # tritonserver takes `--flag=true`; a bare `--flag` means true here.
    parser.add_argument(flag, type=parse_bool, nargs="?", const=True, default=None, help=help_text)


def parse_cache_config(values: list[str], legacy_bytes: int) -> int:
    """The response cache size from Triton's `--cache-config local,size=N` (0: no cache)."""
    size = legacy_bytes
    for value in values:
        name, _, rest = value.partition(",")
        if name != "local":
            raise SystemExit(
                f"edge-appliance: --cache-config: only the 'local' cache exists, got '{name}'"
            )
        key, _, number = rest.partition("=")
        if key != "size" or not number.isdigit():
            raise SystemExit(
                f"edge-appliance: --cache-config expects local,size=BYTES, got '{value}'"
            )
        size = int(number)
    return size


def parse_rate_limit_resources(values: list[str]) -> tuple[tuple[str, int], ...]:
    resources = []
    for value in values:
        parts = value.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise SystemExit(
                f"edge-appliance: --rate-limit-resource expects NAME:COUNT[:DEVICE], got '{value}'"
            )
        resources.append((parts[0], int(parts[1])))
    return tuple(resources)


TRACE_MODES = ("triton", "opentelemetry")
# tritonserver's --trace-config settings that this server's trace flags carry: (mode, setting)
# -> the ServerSettings field (mode "": a global setting).
_TRACE_FIELDS = {
    ("", "rate"): "trace_rate",
    ("", "count"): "trace_count",
    ("", "level"): "trace_level",
    ("triton", "file"): "trace_file",
    ("triton", "log-frequency"): "trace_log_frequency",
}
_TRACE_FORMAT = "--trace-config expects [MODE,]SETTING=VALUE (MODE: triton or opentelemetry)"


def trace_level(text: str, flag: str) -> str:
    """A trace level in tritonserver's words, any case: OFF (off, false), TIMESTAMPS
    (timestamps, true, on, min, max) or TENSORS (tensors)."""
    word = text.lower()
    if word in ("off", "false"):
        return "OFF"
    if word in ("timestamps", "true", "on", "min", "max"):
        return "TIMESTAMPS"
    if word == "tensors":
        return "TENSORS"
    raise SystemExit(
        f"edge-appliance: {flag}: invalid value for trace level option: {text} (OFF, "
        "TIMESTAMPS or TENSORS)"
    )


def parse_trace_config(
    values: list[str], level_flag: str | None = None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """tritonserver's `--trace-config [MODE,]SETTING=VALUE` entries (`level_flag`: the
    deprecated --trace-level, if given): the trace settings they set (they win over
    --trace-rate, --trace-count and --trace-file, and their levels combine with
    --trace-level's, as there) and the entries accepted but ignored (OpenTelemetry mode and
    its settings, unknown settings). The level is OFF, TIMESTAMPS, TENSORS or
    `TIMESTAMPS,TENSORS` (both, as tritonserver combines them). A malformed
    entry stops the start, as it stops tritonserver's."""
    chosen: dict[str, Any] = {}
    ignored: list[str] = []
    levels = [] if level_flag is None else [trace_level(level_flag, "--trace-level")]
    for value in values:
        head, comma, rest = value.partition(",")
        mode, entry = (head.lower(), rest) if comma else ("", value)
        setting, equals, setting_value = entry.partition("=")
        if (comma and mode not in TRACE_MODES) or not (equals and setting and setting_value):
            raise SystemExit(f"edge-appliance: {_TRACE_FORMAT}, got '{value}'")
        if (mode, setting) == ("", "mode"):
            if setting_value.lower() not in TRACE_MODES:
                raise SystemExit(f"edge-appliance: {_TRACE_FORMAT}, got '{value}'")
            if setting_value.lower() != "triton":
                ignored.append(f"--trace-config {value}")
            continue
        field = _TRACE_FIELDS.get((mode, setting))
        if field is None:
            ignored.append(f"--trace-config {value}")
        elif field == "trace_level":
            levels.append(trace_level(setting_value, "--trace-config level"))
        elif field == "trace_file":
            chosen[field] = setting_value
        else:
            try:
                chosen[field] = int(setting_value)
                if field == "trace_log_frequency" and chosen[field] < 0:
                    raise ValueError
            except ValueError:
                raise SystemExit(
                    f"edge-appliance: --trace-config {setting} must be an integer, "
                    f"got '{setting_value}'"
                ) from None
    if levels:  # tritonserver combines the levels; --trace-level=OFF turns tracing off
        off = set(levels) == {"OFF"} or (level_flag is not None and levels[0] == "OFF")
        chosen["trace_level"] = (
            "OFF" if off else ",".join(w for w in ("TIMESTAMPS", "TENSORS") if w in levels)
        )
    return chosen, tuple(ignored)


def parse_backend_config(values: list[str]) -> tuple[dict[str, int], tuple[str, ...]]:
    """tritonserver's `--backend-config [BACKEND,]SETTING=VALUE` entries: the
    default-max-batch-size they set, by backend ('': every backend, the global setting) and
    the entries accepted but ignored (the backends' own settings: this server's backends take
    theirs from each model's config). A malformed entry stops the start, as it stops
    tritonserver's."""
    batch_defaults: dict[str, int] = {}
    ignored: list[str] = []
    for value in values:
        comma, equals = value.find(","), value.find("=")
        backend, entry = ("", value)
        if comma != -1 and (equals == -1 or comma < equals):
            backend, entry = value[:comma], value[comma + 1 :]
        setting, equals_sign, setting_value = entry.partition("=")
        if (comma == 0) or not (equals_sign and setting and setting_value):
            raise SystemExit(
                f"edge-appliance: --backend-config expects [BACKEND,]SETTING=VALUE, got '{value}'"
            )
        if setting != "default-max-batch-size":
            ignored.append(f"--backend-config {value}")
            continue
        if not setting_value.isdigit():
            raise SystemExit(
                "edge-appliance: --backend-config default-max-batch-size must be an integer "
                f">= 0, got '{setting_value}'"
            )
        batch_defaults[backend] = int(setting_value)
    return batch_defaults, tuple(ignored)


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """`--metrics-config summary_quantiles=0.5:0.05,0.9:0.01`: (quantile, error) pairs, as
    tritonserver reads them (comma-separated QUANTILE:ERROR); () when none is given."""
    pairs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        quantile, sep, error = item.partition(":")
        try:
            pair = (float(quantile), float(error))
        except ValueError:
            pair = (-1.0, -1.0)
        if not sep or not 0 <= pair[0] <= 1 or not 0 <= pair[1] <= 1:
            raise SystemExit(
                "edge-appliance: --metrics-config summary_quantiles expects QUANTILE:ERROR "
                f"pairs between 0 and 1, separated by commas (e.g. 0.5:0.05,0.9:0.01), got "
                f"'{item}'"
            )
        pairs.append(pair)
    return tuple(pairs)


def parse_metrics_config(values: list[str]) -> dict[str, str]:
    """Triton's `--metrics-config key=value` pairs; unknown keys are warned about later."""
    pairs = {}
    for value in values:
        key, sep, setting = value.partition("=")
        if not sep:
            raise SystemExit(f"edge-appliance: --metrics-config expects KEY=VALUE, got '{value}'")
        pairs[key] = setting
    return pairs

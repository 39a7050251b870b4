"""A repository load request's parameters: pins, config and file overrides, and whether the
load served what it was asked to."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import errno
import shutil
import tempfile
from pathlib import Path
from typing import Any

from appliance.common.errors import ApplianceError, ConfigError, InvalidInput
from appliance.runtime.registry import ModelRecord


def pin_parameters(name: str, parameters: dict[str, Any]) -> int | None:
    """The version a pin request asks for (None: unpin). A load request with
    `{"pin_version": N}` serves version N alone from now on, across polls and restarts, in
    every control mode; `{"unpin": true}` goes back to the version policy."""
    others = sorted(str(k) for k in parameters if k not in ("pin_version", "unpin"))
    if others or len(parameters) != 1:
        raise InvalidInput(
            f"model '{name}': 'pin_version' or 'unpin' comes alone in a load request "
            f"(also given: {', '.join(others) or 'both'})"
        )
    if "unpin" in parameters:
        if parameters["unpin"] is not True:
            raise InvalidInput(f"model '{name}': 'unpin' must be true")
        return None
    value = parameters["pin_version"]
    # ASCII digits only: str.isdigit() is true for '²' too, which int() refuses.
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"model '{name}': 'pin_version' must be a version number, got {value!r}")
    return value


def check_loaded(
    record: ModelRecord, served_before: dict[int, Any], failed_before: dict[int, str]
) -> None:
    """ConfigError with each version's reason when a load brought no version into service, or
    a version failed in it (a version still rolled back since before does not count)."""
    new = [v for v, served in record.versions.items() if served_before.get(v) is not served]
    failed_now = {v: why for v, why in record.failed.items() if failed_before.get(v) != why}
    failures = failed_now or ({} if new else dict(record.failed))
    if not failures and (new or record.versions):
        return
    reasons = "; ".join(
        f"version {v} is at UNAVAILABLE state: {why}" for v, why in sorted(failures.items())
    ) or (record.reason or "no version loaded")
    if new:
        serving = f"; version(s) {sorted(new)} loaded and serve"
    elif record.versions:
        serving = f"; the versions loaded before keep serving: {sorted(record.versions)}"
    else:
        serving = ""
    raise ConfigError(f"load failed for model '{record.name}': {reasons}{serving}")


async def write_overrides(name: str, files: dict[str, Any]) -> Path:
    """`override_folder` off the loop (up to the request size of files to decode and write).
    A request cancelled meanwhile (its client went away) still removes what the thread wrote."""
    write = asyncio.ensure_future(asyncio.to_thread(override_folder, name, files))
    try:
        return await asyncio.shield(write)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # a refusal: the thread removed it already
            folder = await write
            await asyncio.to_thread(shutil.rmtree, folder.parent, True)
        raise


def override_folder(name: str, files: dict[str, Any]) -> Path:
    """Write a load request's `file:` overrides into a model folder of their own (blocking).

    Returns the model folder; its parent is the server's to remove. On any refusal nothing is
    left behind (a refused request must not fill the disk)."""
    folder = Path(tempfile.mkdtemp(prefix="edge-appliance-override-"))
    try:
        root = folder / name
        for relative in sorted(files):  # the same answer whatever order the client used
            _write_override(name, root, relative, files[relative])
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return root


def _write_override(name: str, root: Path, relative: str, content: Any) -> None:
    where = f"model '{name}': file override {relative!r}"  # repr: the client's characters
    if isinstance(content, str):  # HTTP sends base64 text, gRPC raw bytes
        try:
            content = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where} is not valid base64") from None
    elif not isinstance(content, bytes):  # bytes(an integer) would allocate that many
        raise ConfigError(
            f"{where} must be base64 text (HTTP) or bytes (gRPC), got {type(content).__name__}"
        )
    if "\0" in relative:
        raise ConfigError(f"{where}: a path cannot contain a NUL character")
    path = (root / relative).resolve()
    if root.resolve() not in path.parents or not relative:
        raise ConfigError(  # tritonserver's prefix, then the reason (its log's)
            f"failed to load '{name}', failed to poll from model repository: file override "
            f"path {relative!r} is not allowed"
        )
    # A name the file system refuses (too long, a path both file and folder) is the client's
    # input: 400 / INVALID_ARGUMENT with the words of tritonserver's failed poll (which answers
    # 500 there; its own test says 400 is the right status). A full or read-only disk is ours.
    failed = f"failed to load '{name}', failed to poll from model repository: {where}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        raise InvalidInput(
            f"{failed} cannot be written: {exc.strerror}; the overrides name a path as both "
            "a file and a folder"
        ) from None
    except OSError as exc:
        refusal = InvalidInput if exc.errno in _REFUSED_NAMES else ApplianceError
        raise refusal(f"{failed} cannot be written: {exc.strerror}") from None


# errno values that say the file's name is at fault, not the server's disk
_REFUSED_NAMES = frozenset({errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ, errno.ELOOP})

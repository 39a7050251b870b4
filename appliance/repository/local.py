"""Reading a Triton model repository folder: which models, which numbered versions."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from appliance.common.errors import ConfigError, InvalidInput

log = logging.getLogger(__name__)


def check_model_name(name: str) -> None:
    """A model name is one folder name: it can never point outside the repository. The
    refusals start with tritonserver's words: it trims ASCII whitespace first, so an empty or
    whitespace-only name is refused before any lookup, and ' ..' is a traversal."""
    trimmed = name.strip(_ASCII_SPACE)
    if not trimmed:
        raise InvalidInput("Model name cannot be empty. Please enter a valid name to deploy.")
    if name == "." or trimmed == ".." or any(c in name for c in "/\\\0"):
        raise InvalidInput(
            f"invalid model name '{name}', model name must not contain path traversal "
            "characters (one folder name expected)"
        )


_ASCII_SPACE = " \t\n\v\f\r"  # what tritonserver's trim removes (C isspace)

# The longest folder or file name a repository entry may have, in UTF-8 bytes: the file
# system's 255 less what the store and the ledger add to a name (`.part-etag`, the ledger's
# `.<model>.json.<8 hex>.tmp`), so that no write of an accepted name fails ENAMETOOLONG.
MAX_NAME_BYTES = 200
# A version is a positive int64 in Triton: at most 18 decimal digits (a longer folder name
# would not fit, and int() of thousands of digits raises).
_MAX_VERSION_DIGITS = 18
_VERSION = re.compile(r"0|[1-9][0-9]{0,17}")


def version_number(name: str) -> int | None:
    """The version a folder name stands for: canonical ASCII digits ('1', not '01', not '²',
    which str.isdigit() accepts and int() refuses), else None."""
    return int(name) if _VERSION.fullmatch(name) else None


def looks_like_version(name: str) -> bool:
    """A name of digits that no version can have: other scripts' digits or superscripts
    (str.isdigit: '²', U+0661), or more digits than an int64 ('01' is a plain folder, as ever)."""
    if not name.isdigit() or version_number(name) is not None:
        return False
    return not (name.isascii() and len(name) <= _MAX_VERSION_DIGITS)


def name_problem(name: str) -> str:
    """Why a model or file name cannot be kept in a repository ('' when it can)."""
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > MAX_NAME_BYTES:
        return f"its name is {size} bytes, more than the {MAX_NAME_BYTES} a name may have"
    return ""


def escapes(path: Path, root: Path) -> bool:
    """Whether `path`, symlinks resolved, lies outside `root`."""
    return not path.resolve().is_relative_to(root.resolve())


# Between a model's name and its repository's index in the key of a model whose name more than
# one repository holds (--model-namespacing): a character no model name may have (a load
# request's name is refused with it) and every file system keeps in a file name (the ledger).
NAMESPACE_SEPARATOR = "\\"


def namespaced_key(name: str, repository_index: int) -> str:
    """The runtime's key of the copy of `name` in the `repository_index`-th repository."""
    return f"{name}{NAMESPACE_SEPARATOR}{repository_index}"


def plain_name(key: str) -> str:
    """The model name a runtime key stands for (the key itself for a name only one holds)."""
    name, separator, index = key.rpartition(NAMESPACE_SEPARATOR)
    return name if separator and index.isdigit() else key


def list_models(repositories: list[Path], namespacing: bool = False) -> dict[str, Path]:
    """Model key -> folder over every repository. The key is the model's name; a name found in
    two repositories is an error, unless `namespacing` (tritonserver's --model-namespacing):
    then each copy's key is `namespaced_key(name, index of its repository)`.

    A model folder that is a symlink to somewhere outside its repository is skipped: the
    repository is the boundary of what this server loads (and runs, for Python models).
    """
    if namespacing:
        return _namespaced(repositories)
    models: dict[str, Path] = {}
    for repo in repositories:
        if not repo.is_dir():
            raise ConfigError(f"model repository '{repo}' is not a directory")
        for entry in sorted(repo.iterdir()):
            if entry.name.startswith(".") or not _is_dir(entry):
                continue
            problem = name_problem(entry.name)
            if problem:
                _warn_once(f"model folder '{entry}' skipped: {problem}")
                continue
            if entry.is_symlink() and escapes(entry, repo):
                log.warning(
                    "model folder '%s' links outside the repository (to '%s'); skipped",
                    entry,
                    entry.resolve(),
                )
                continue
            if entry.name in models:
                raise ConfigError(
                    f"model '{entry.name}' is in two repositories: '{models[entry.name]}' and "
                    f"'{entry}'"
                )
            models[entry.name] = entry
    return models


def _namespaced(repositories: list[Path]) -> dict[str, Path]:
    copies: dict[str, list[tuple[int, Path]]] = {}
    for index, repo in enumerate(repositories):
        for name, path in list_models([repo]).items():
            if NAMESPACE_SEPARATOR in name:
                _warn_once(f"model folder '{path}' skipped: '\\' in its name (--model-namespacing)")
                continue
            copies.setdefault(name, []).append((index, path))
    models: dict[str, Path] = {}
    for name, found in copies.items():
        if len(found) == 1:
            models[name] = found[0][1]
        else:
            models.update((namespaced_key(name, index), path) for index, path in found)
    return models


def list_versions(model_dir: Path) -> list[int]:
    """The numbered version folders of a model (folders with other names are ignored; a name
    of digits that is no version, such as '²', is skipped with a warning)."""
    versions = []
    for entry in model_dir.iterdir():
        version = version_number(entry.name)
        if version is not None:
            if _is_dir(entry):
                versions.append(version)
            else:
                _warn_once(f"'{entry}' is not a folder; version {version} skipped")
        elif looks_like_version(entry.name):
            _warn_once(f"'{entry}' is not a version folder (versions are ASCII digits); skipped")
    return sorted(versions)


def _is_dir(entry: Path) -> bool:
    """is_dir() that says False for an entry it cannot look at (a name too long, a loop of
    symlinks, no permission) instead of raising."""
    try:
        return entry.is_dir()
    except OSError:
        return False


_warned: set[str] = set()
_MAX_WARNED = 4096  # a folder churning bad names must not grow this for ever


def _warn_once(message: str) -> None:
    """A repository problem, logged once (every poll scans the folders again)."""
    if message in _warned:
        return
    if len(_warned) >= _MAX_WARNED:
        _warned.clear()
    _warned.add(message)
    log.warning("%s", message)


def fingerprint(model_dir: Path) -> str:
    """A digest of every file's relative path, size and modification time."""
    digest = hashlib.blake2b(digest_size=16)
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            try:
                stat = path.stat()
            except OSError:
                continue  # vanished while listing: the next poll sees the settled state
            digest.update(
                f"{path.relative_to(model_dir)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()
            )
    return digest.hexdigest()

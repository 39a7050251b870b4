"""Reading a Triton model repository folder: which models, which numbered versions."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from appliance.errors import ConfigError, InvalidInput

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


def escapes(path: Path, root: Path) -> bool:
    """Whether `path`, symlinks resolved, lies outside `root`."""
    return not path.resolve().is_relative_to(root.resolve())


def list_models(repositories: list[Path]) -> dict[str, Path]:
    """Model name -> folder over every repository; a name found twice is an error.

    A model folder that is a symlink to somewhere outside its repository is skipped: the
    repository is the boundary of what this server loads (and runs, for Python models).
    """
    models: dict[str, Path] = {}
    for repo in repositories:
        if not repo.is_dir():
            raise ConfigError(f"model repository '{repo}' is not a directory")
        for entry in sorted(repo.iterdir()):
            if not entry.is_dir() or entry.name.startswith("."):
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


def list_versions(model_dir: Path) -> list[int]:
    """The numbered version folders of a model (folders with other names are ignored)."""
    versions = []
    for entry in model_dir.iterdir():
        if entry.is_dir() and entry.name.isdigit() and str(int(entry.name)) == entry.name:
            versions.append(int(entry.name))
    return sorted(versions)


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

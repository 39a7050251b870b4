"""--model-repository-tuf-root: the trusted root a device starts from is checked at start-up
(signed TUF root metadata, its own threshold met), with one clear line when it is not."""

from __future__ import annotations

from pathlib import Path

import pytest
from tuf.api.metadata import Metadata, Root, Targets

from appliance.fleet import tuf_keys
from appliance.repository.tuf_source import TufError, check_root, reason
from appliance.server.app import ConfigurationError, _tuf_root


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    tuf_keys.create_keys(tmp_path / "keys", {"root": 2})
    return tmp_path / "keys"


def test_a_root_signed_by_its_threshold_is_taken(keys: Path) -> None:
    data = (keys / "1.root.json").read_bytes()
    check_root(data, "root.json")
    assert _tuf_root(keys / "1.root.json") == data
    assert _tuf_root(None) is None


def test_a_root_below_its_threshold_is_refused(keys: Path) -> None:
    root = Metadata[Root].from_file(str(keys / "1.root.json"))
    root.signatures.pop(next(iter(root.signatures)))  # 1 of the 2 root signatures
    with pytest.raises(TufError, match=r"not a trusted TUF root\.json: root was signed by 1/2"):
        check_root(root.to_bytes(), "root.json")


def test_other_files_are_refused_in_one_line(keys: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read '.*missing\.json'"):
        _tuf_root(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match=r"is not a trusted TUF root\.json"):
        _tuf_root(tmp_path / "junk.json")
    targets = Metadata(Targets())
    with pytest.raises(TufError, match=r"not a trusted TUF root\.json"):
        check_root(targets.to_bytes(), "targets.json")


def test_refusals_are_named_by_what_they_stop() -> None:
    from tuf.api import exceptions

    assert reason(exceptions.ExpiredMetadataError("timestamp.json is expired")).startswith(
        "TUF metadata expired (a freeze): ExpiredMetadataError"
    )
    assert "rollback or mix-and-match" in reason(exceptions.BadVersionNumberError("v2 < v3"))
    assert "threshold" in reason(exceptions.UnsignedMetadataError("signed by 1/2"))


def test_the_flag_reaches_the_settings() -> None:
    import argparse

    from appliance.flags.serve import add_serve_flags, settings_from_args

    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    args = ["--model-repository", "models", "--model-repository-tuf-root", "/etc/root.json"]
    assert settings_from_args(parser.parse_args(args)).model_repository_tuf_root == Path(
        "/etc/root.json"
    )
    assert settings_from_args(parser.parse_args(args[:2])).model_repository_tuf_root is None

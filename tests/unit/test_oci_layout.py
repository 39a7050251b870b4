"""The OCI layout's pure parts: locations, an artifact's layers, the repository index."""

from __future__ import annotations

import json

import pytest

from appliance.repository.oci_registry import (
    TITLE,
    WEIGHT,
    WEIGHT_CONFIG,
    ContentRejected,
    Descriptor,
    ModelEntry,
    OciLocation,
    artifact_files,
    index_document,
    layer_type,
    parse_index,
)
from appliance.repository.sources import check_location

DIGEST = "sha256:" + "ab" * 32


def test_locations_take_plain_http_only_on_loopback_or_when_asked() -> None:
    local = OciLocation.parse("oci://127.0.0.1:5000/fleet/models")
    assert (local.base, local.repository) == ("http://127.0.0.1:5000", "fleet/models")
    assert OciLocation.parse("oci://localhost:5000/m").base == "http://localhost:5000"
    assert OciLocation.parse("oci://registry.example:443/m").base == "https://registry.example:443"
    assert OciLocation.parse("oci+http://10.0.0.2:5000/m").base == "http://10.0.0.2:5000"
    assert OciLocation.parse("oci+https://127.0.0.1:5000/m").base == "https://127.0.0.1:5000"
    with pytest.raises(ValueError, match="names no repository"):
        OciLocation.parse("oci://127.0.0.1:5000")
    with pytest.raises(ValueError, match="'Models' is not a registry repository name"):
        OciLocation.parse("oci://127.0.0.1:5000/Models")
    check_location("oci://127.0.0.1:5000/m")  # accepted by the flag's check
    with pytest.raises(ValueError, match=r"oci://host\[:port\]/repository"):
        check_location("ftp://x/y")


def _layers(*paths: str) -> dict[str, object]:
    return {
        "schemaVersion": 2,
        "layers": [
            {"mediaType": WEIGHT, "digest": DIGEST, "size": 3, "annotations": {TITLE: p}}
            for p in paths
        ],
    }


def test_an_artifact_s_layers_are_its_files_and_a_bad_path_rejects_it_whole() -> None:
    files = artifact_files(_layers("model.onnx", "sub/labels.txt"), "v1")
    assert files == {
        "model.onnx": Descriptor(DIGEST, 3, WEIGHT),
        "sub/labels.txt": Descriptor(DIGEST, 3, WEIGHT),
    }
    for paths, why in (
        (("../evil.onnx",), "leaves the model folder"),
        (("/etc/passwd",), "leaves the model folder"),
        (("a", "a"), "is two layers"),
        (("a", "a/b"), "'a' is both a file and a folder"),
    ):
        with pytest.raises(ContentRejected, match=why):
            artifact_files(_layers(*paths), "v1")
    untitled = {"schemaVersion": 2, "layers": [{"digest": DIGEST, "size": 3}]}
    with pytest.raises(ContentRejected, match=f"no {TITLE} annotation"):
        artifact_files(untitled, "v1")
    bad = _layers("x")
    bad["layers"][0]["digest"] = "sha256:short"  # type: ignore[index]
    with pytest.raises(ContentRejected, match="is not sha256:<64 hex digits>"):
        artifact_files(bad, "v1")


def test_the_index_round_trips_and_a_bad_model_entry_is_left_out_alone() -> None:
    models = {
        "m": ModelEntry(
            Descriptor(DIGEST, 10), {1: Descriptor(DIGEST, 20), 3: Descriptor(DIGEST, 30)}
        ),
        "n": ModelEntry(None, {2: Descriptor(DIGEST, 5)}),
    }
    raw = index_document(models)
    parsed, problems = parse_index(raw)
    assert problems == {}
    assert parsed["m"].versions.keys() == {1, 3}
    assert parsed["m"].files == Descriptor(DIGEST, 10, "")
    assert parsed["n"].files is None
    doc = json.loads(raw)
    doc["models"]["bad"] = {"versions": {"x1": {"digest": DIGEST, "size": 1}}}
    doc["models"][".."] = {"versions": {}}
    parsed, problems = parse_index(json.dumps(doc).encode())
    assert set(parsed) == {"m", "n"}
    assert problems == {"bad": "'x1' is not a version number", "..": "not a folder name"}
    with pytest.raises(ContentRejected, match="not JSON"):
        parse_index(b"{")


def test_layer_media_types_follow_modelpack() -> None:
    assert layer_type("model.onnx") == WEIGHT
    assert layer_type("config.pbtxt") == WEIGHT_CONFIG
    assert layer_type("labels.txt") == WEIGHT_CONFIG
    assert layer_type("model.py").endswith("code.v1.raw")
    assert layer_type("README.md").endswith("doc.v1.raw")

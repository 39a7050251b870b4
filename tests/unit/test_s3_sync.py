"""The pure parts of S3 syncing: locations, grouping a listing, the store's part files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from appliance.repository.poller import plan_changes
from appliance.repository.s3 import RemoteObject, S3Location, group_objects
from appliance.repository.store import ModelStore, PartFile, read_record, reserve_bytes


@pytest.mark.parametrize(
    ("url", "endpoint", "bucket", "prefix"),
    [
        ("s3://models", None, "models", ""),
        ("s3://models/fleet/a/", None, "models", "fleet/a/"),
        ("s3://127.0.0.1:9000/models/repo", "http://127.0.0.1:9000", "models", "repo/"),
        ("s3://https://s3.local:443/models/repo", "https://s3.local:443", "models", "repo/"),
        ("s3://http://minio:9000/b", "http://minio:9000", "b", ""),
    ],
)
def test_triton_s3_locations(url: str, endpoint: str | None, bucket: str, prefix: str) -> None:
    location = S3Location.parse(url)
    assert (location.endpoint, location.bucket, location.prefix) == (endpoint, bucket, prefix)


@pytest.mark.parametrize("url", ["s3://", "s3://127.0.0.1:9000/", "gs://bucket"])
def test_bad_locations_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"bucket|s3://"):
        S3Location.parse(url)


def test_cache_folders_differ_per_location() -> None:
    a = S3Location.parse("s3://h:1/bucket/repo").source_id
    b = S3Location.parse("s3://h:2/bucket/repo").source_id
    assert a != b
    assert a.startswith("bucket_repo-")


def _obj(key: str, etag: str = "e") -> RemoteObject:
    return RemoteObject(key=key, size=1, etag=etag, modified=0.0)


def test_listing_groups_into_model_files_and_versions() -> None:
    models = group_objects(
        "repo/",
        [
            _obj("repo/m/config.pbtxt"),
            _obj("repo/m/labels/en.txt"),
            _obj("repo/m/1/model.onnx"),
            _obj("repo/m/1/sub/weights.bin"),
            _obj("repo/m/01/ignored_as_not_canonical.onnx"),
            _obj("repo/m/2/"),  # a folder marker
            _obj("repo/README.md"),  # not in a model folder
            _obj("repo/.hidden/1/x"),
        ],
    )
    assert list(models) == ["m"]
    m = models["m"]
    assert sorted(m.files) == ["01/ignored_as_not_canonical.onnx", "config.pbtxt", "labels/en.txt"]
    assert {v: sorted(f) for v, f in m.versions.items()} == {1: ["model.onnx", "sub/weights.bin"]}


def test_md5_is_only_trusted_for_single_part_etags() -> None:
    assert _obj("k", "0" * 32).md5 == "0" * 32
    assert _obj("k", "0" * 32 + "-3").md5 is None


def test_store_folders_change_without_a_settle_poll() -> None:
    changes = plan_changes(
        {"a": "1", "b": "1"}, {"a": "1", "b": "1"}, {"a": "2", "b": "2"}, frozenset({"b"})
    )
    assert changes.load == ("b",)


def test_part_file_resumes_only_for_the_same_etag(tmp_path: Path) -> None:
    final = tmp_path / "v" / "model.onnx"
    part = PartFile(final, "etag-1")
    part.write(b"hello ")
    part.close()
    resumed = PartFile(final, "etag-1")
    assert resumed.size == 6
    resumed.write(b"world")
    resumed.commit()
    assert final.read_bytes() == b"hello world"
    assert resumed.sha256.hexdigest() == hashlib.sha256(b"hello world").hexdigest()
    stale = PartFile(tmp_path / "w" / "x", "etag-1")
    stale.write(b"old")
    stale.close()
    fresh = PartFile(tmp_path / "w" / "x", "etag-2")  # the object changed: start over
    assert fresh.size == 0
    fresh.close()


def test_publish_moves_a_whole_version_and_records_what_it_holds(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "src", reserve_bytes=0)
    store.open()
    staged = store.staging_dir("m", 1)
    staged.mkdir(parents=True)
    (staged / "model.onnx").write_bytes(b"new")
    old = store.version_dir("m", 1)
    old.mkdir(parents=True)
    (old / "model.onnx").write_bytes(b"old")
    store.publish("m", 1, {"model.onnx": ["etag", 3]})
    assert (old / "model.onnx").read_bytes() == b"new"
    # Each file's sha256 is kept with it (damage at rest is found at load: issue 31 item 5).
    assert read_record(old) == {"model.onnx": ["etag", 3, hashlib.sha256(b"new").hexdigest()]}
    assert not staged.exists()
    assert list((tmp_path / "trash").iterdir()) == []


def test_what_a_good_listing_no_longer_has_leaves_the_store(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "src", reserve_bytes=0)
    store.open()
    for model, version in (("kept", 1), ("kept", 2), ("gone", 1), ("other", 3)):
        store.version_dir(model, version).mkdir(parents=True)
    (store.root / "kept" / "config.pbtxt").write_text("")  # not a version folder: stays
    changed, removed = store.remove_unlisted(
        {"kept": {1}, "other": set()}, {"kept", "gone"}, "s3://b"
    )
    assert changed == {"kept", "gone"}
    assert removed == [("kept", 2)]
    assert sorted(p.name for p in (store.root / "kept").iterdir()) == ["1", "config.pbtxt"]
    assert not (store.root / "gone").exists()
    assert store.version_dir("other", 3).is_dir()  # outside `only`: untouched
    assert list((tmp_path / "trash").iterdir()) == []


def test_disk_reserve_is_checked_before_a_download(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "src", reserve_bytes=1 << 60)
    store.open()
    with pytest.raises(OSError, match="not enough disk for model 'm' version 2"):
        store.check_space(10, "model 'm' version 2")


def test_the_default_reserve_scales_with_the_file_system() -> None:
    mib = 1024 * 1024
    assert reserve_bytes(None, 150 * mib) == 15 * mib  # a small store partition
    assert reserve_bytes(None, 2560 * mib) == 256 * mib
    assert reserve_bytes(None, 64 * 1024 * mib) == 256 * mib
    assert reserve_bytes(100 * mib, 150 * mib) == 100 * mib  # --model-store-reserve-mb wins
    assert reserve_bytes(0, 150 * mib) == 0


def test_a_refusal_for_space_gives_the_numbers(tmp_path: Path) -> None:
    mib = 1024 * 1024
    store = ModelStore(
        tmp_path, "src", None, free_bytes=lambda _: 40 * mib, total_bytes=lambda _: 150 * mib
    )
    store.check_space(25 * mib, "model 'm' version 1")  # leaves 15 MiB: just fits
    with pytest.raises(OSError, match="not enough disk for model 'm' version 2") as caught:
        store.check_space(26 * mib, "model 'm' version 2")
    assert str(caught.value) == (
        f"not enough disk for model 'm' version 2: needs 26.0 MiB, 40.0 MiB free in "
        f"'{tmp_path}', and 15.0 MiB must stay free (--model-store-reserve-mb: by default the "
        "smaller of 256 MiB and 10% of the 150 MiB file system)"
    )


def test_a_key_the_store_cannot_hold_is_left_out_alone() -> None:
    """Issue 31 item 2: one such object stopped the whole listing (int('²') raised)."""
    long_name = "x" * 300
    models = group_objects(
        "repo/",
        [
            _obj("repo/m/config.pbtxt"),
            _obj("repo/m/1/model.onnx"),
            _obj("repo/m/\u00b2/model.onnx"),  # '²'.isdigit() and int('²') raises
            _obj("repo/m/\u0661/model.onnx"),  # an Arabic-Indic one
            _obj("repo/m/2"),  # a file where version 2's folder is
            _obj("repo/m/2/model.onnx"),
            _obj("repo/m/3/model.onnx"),
            _obj("repo/m/3/model.onnx/x"),  # version 3 cannot be written
            _obj("repo/m/4/" + long_name),
            _obj("repo/m/" + "9" * 40 + "/model.onnx"),  # no int64 version
            _obj(f"repo/{long_name}/1/model.onnx"),
            _obj("repo/b\\ad/1/model.onnx"),
            _obj("repo/ok/1/model.onnx"),
        ],
    )
    m = models["m"]
    assert sorted(m.versions) == [1, 2]
    assert sorted(m.files) == ["config.pbtxt"]
    assert m.bad_versions == {
        3: "'model.onnx' is both a file and a folder",
        4: f"'{long_name}': its name is 300 bytes, more than the 200 a name may have",
    }
    assert sorted(m.skipped) == [
        "repo/m/2",
        "repo/m/" + "9" * 40 + "/model.onnx",
        "repo/m/\u00b2/model.onnx",
        "repo/m/\u0661/model.onnx",
    ]
    assert m.skipped["repo/m/2"] == "'2' is both a file and a folder"
    assert "is not a version folder" in m.skipped["repo/m/\u00b2/model.onnx"]
    assert models[long_name].problem.startswith("model skipped: its name is 300 bytes")
    assert models[long_name].bad_versions == {1: models[long_name].problem}
    assert "path traversal" in models["b\\ad"].problem
    assert sorted(models["ok"].versions) == [1]


def test_model_level_files_that_clash_with_each_other_are_left_out() -> None:
    m = group_objects("", [_obj("m/labels"), _obj("m/labels/en.txt"), _obj("m/1/a")])["m"]
    assert sorted(m.files) == ["labels/en.txt"]
    assert m.skipped == {"m/labels": "'labels' is both a file and a folder"}

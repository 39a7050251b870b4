"""--model-namespacing's keys: a name in two repositories is a model per repository, and a
lookup by the shared name is refused with tritonserver's words (a unique name as before)."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.common.errors import ConfigError, InvalidInput, UnknownModel
from appliance.repository.local import list_models, namespaced_key, plain_name
from appliance.runtime.registry import ModelRegistry


def _repos(root: Path) -> list[Path]:
    for repo, names in (("a", ("shared", "only_a")), ("b", ("shared", "only_b"))):
        for name in names:
            (root / repo / name).mkdir(parents=True)
    return [root / "a", root / "b"]


def test_without_namespacing_a_name_in_two_repositories_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model 'shared' is in two repositories"):
        list_models(_repos(tmp_path))


def test_with_namespacing_each_copy_has_a_key(tmp_path: Path) -> None:
    repos = _repos(tmp_path)
    found = list_models(repos, namespacing=True)
    assert found == {
        "only_a": repos[0] / "only_a",
        "only_b": repos[1] / "only_b",
        namespaced_key("shared", 0): repos[0] / "shared",
        namespaced_key("shared", 1): repos[1] / "shared",
    }
    assert {plain_name(key) for key in found} == {"only_a", "only_b", "shared"}


def test_the_registry_refuses_a_shared_name(tmp_path: Path) -> None:
    registry = ModelRegistry(namespacing=True)
    for key, path in list_models(_repos(tmp_path), namespacing=True).items():
        registry.add(key, path)
    message = (
        "There are 2 identifiers of model 'shared' in global map, model namespace must be "
        "provided to resolve ambiguity."
    )
    for lookup in (registry.get, registry.record, registry.find):
        with pytest.raises(InvalidInput) as caught:
            lookup("shared")
        assert caught.value.message == message
    assert registry.find("only_a") is not None
    assert registry.copies("shared") == [namespaced_key("shared", i) for i in (0, 1)]
    with pytest.raises(UnknownModel, match="'nothing' is not found"):
        registry.get("nothing")

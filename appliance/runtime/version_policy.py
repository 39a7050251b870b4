"""Which versions of a model to serve: Triton's version_policy, as a pure function."""

from __future__ import annotations

from collections.abc import Iterable

from appliance.common.protocol import model_config_pb2 as mc


def select_versions(policy: mc.ModelVersionPolicy, available: Iterable[int]) -> list[int]:
    """The versions the policy asks for among those present, newest first."""
    present = sorted(set(available), reverse=True)
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return present
    if which == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in present if v in wanted]
    count = policy.latest.num_versions if which == "latest" else 1
    return present[: max(1, count)]

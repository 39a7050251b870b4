"""tritonserver's host policies (`--host-policy=<name>,<setting>=<value>`): which CPU cores an
instance's threads run on and which NUMA node its memory comes from.

An instance group names its policy with `host_policy`; without one, the policy is named after
the group's kind as in Triton: `cpu` for KIND_CPU, `gpu_<device>` for each GPU of a KIND_GPU
group, `model` for KIND_MODEL. A name no flag gives binds nothing. The settings are Triton's:
`cpu-cores` (ranges `<first>-<last>`, comma-separated; a single core is accepted too) and
`numa-node`. Applying them is appliance/ops/affinity.py's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

SETTINGS = ("cpu-cores", "numa-node")


class HostPolicyError(ValueError):
    """A --host-policy value tritonserver's format or settings do not allow."""


@dataclass(frozen=True)
class HostPolicy:
    name: str
    cpu_cores: frozenset[int] = field(default_factory=frozenset)  # empty: not bound
    numa_node: int | None = None

    def describe(self) -> str:
        parts = []
        if self.cpu_cores:
            parts.append(f"cpu-cores={format_cores(self.cpu_cores)}")
        if self.numa_node is not None:
            parts.append(f"numa-node={self.numa_node}")
        return f"host policy '{self.name}' ({', '.join(parts) or 'nothing bound'})"


def policy_name(group_policy: str, kind: str, device_id: int) -> str:
    """The policy an instance of a group of `kind` on `device_id` runs under (Triton's names)."""
    if group_policy:
        return group_policy
    if kind == "KIND_GPU":
        return f"gpu_{device_id}"
    if kind == "KIND_MODEL":
        return "model"
    return "cpu"


def parse_cores(text: str) -> frozenset[int]:
    """'0-3,6-6' (Triton's ranges) or '0-3,6' as a set of core numbers."""
    cores: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise HostPolicyError(
                f"host policy setting 'cpu-cores' format is '<lower_cpu_core_id>-"
                f"<upper_cpu_core_id>'. Got {part}"
            ) from None
        if low < 0 or high < low:
            raise HostPolicyError(
                f"host policy setting 'cpu-cores': '{part}' is not a range of core numbers"
            )
        cores.update(range(low, high + 1))
    return frozenset(cores)


def format_cores(cores: Iterable[int]) -> str:
    """The ranges of a set of cores, as Linux's cpulist writes them ('0-3,6')."""
    ranges: list[str] = []
    run: list[int] = []
    for core in sorted(cores):
        if run and core == run[-1] + 1:
            run.append(core)
            continue
        if run:
            ranges.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [core]
    if run:
        ranges.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(ranges)


def parse_host_policies(values: Iterable[str]) -> tuple[HostPolicy, ...]:
    """Every --host-policy value (repeatable; one setting each, as tritonserver takes them)
    merged into one policy per name, in the order the names first appear."""
    settings: dict[str, dict[str, str]] = {}
    for value in values:
        name, sep, rest = value.partition(",")
        setting, eq, setting_value = rest.partition("=")
        if not (sep and eq and name and setting and setting_value):
            raise HostPolicyError(
                f"--host-policy option format is '<policy name>,<setting>=<value>'. Got {value}"
            )
        if setting not in SETTINGS:
            raise HostPolicyError(
                f"--host-policy {value}: unknown setting '{setting}' (tritonserver's are "
                f"{' and '.join(SETTINGS)})"
            )
        settings.setdefault(name, {})[setting] = setting_value
    policies = []
    for name, given in settings.items():
        node = None
        if "numa-node" in given:
            try:
                node = int(given["numa-node"])
            except ValueError:
                raise HostPolicyError(
                    f"Parsing 'numa-node' value: Can't parse '{given['numa-node']}' to integer"
                ) from None
            if node < 0:
                raise HostPolicyError(f"host policy '{name}': numa-node {node} is negative")
        cores = parse_cores(given["cpu-cores"]) if "cpu-cores" in given else frozenset()
        policies.append(HostPolicy(name, cores, node))
    return tuple(policies)

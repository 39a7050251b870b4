"""Every manifest under deploy/, offline: Kubernetes' own kinds against the Kubernetes JSON
schemas (kubernetes-validate, strict: an unknown or misspelt field fails); KServe's kinds
against a structural schema of their spec (the field names and types of KServe's CRDs, whose
pod parts are checked as a Pod against the Kubernetes schemas); and what the manifests promise
about this server: its flags parse, the probes hit its health endpoints, it runs as the image's
user with a read-only root file system and writable state and /tmp, and the grace period
outlasts its shutdown deadline."""

from __future__ import annotations

import argparse
import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.flags.serve import add_serve_flags, settings_from_args
from tests.serverproc import ROOT

kv = pytest.importorskip(
    "kubernetes_validate",
    reason="kubernetes-validate is not installed (the dev extra: scripts/bootstrap dev)",
)
yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (kubernetes-validate's)")
jsonschema = pytest.importorskip("jsonschema", reason="not installed (kubernetes-validate's)")

DEPLOY = ROOT / "deploy"
CONTAINERFILE = ROOT / "build" / "oci" / "Containerfile"
# The oldest Kubernetes these manifests are for (k3s releases of the last years) and the newest
# whose schemas the validator ships.
K8S_VERSIONS = ("1.28", kv.latest_version())
SHUTDOWN_DEADLINE_S = 30.0  # the server's default --exit-timeout-secs
FORCED_EXIT_AFTER_S = 1.5  # past the deadline (appliance/server/shutdown.py)

# A ServingRuntime's spec (serving.kserve.io/v1alpha1), structurally: the fields of KServe's
# CRD with their types; the pod parts (containers, volumes, ...) are checked as a Pod below.
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
SERVING_RUNTIME_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["containers"],
    "additionalProperties": False,
    "properties": {
        "annotations": _STRING_MAP,
        "labels": _STRING_MAP,
        "supportedModelFormats": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "version": {"type": "string"},
                    "autoSelect": {"type": "boolean"},
                    "priority": {"type": "integer", "minimum": 1},
                },
            },
        },
        # KServe's InferenceServiceProtocol values.
        "protocolVersions": {
            "type": "array",
            "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]},
        },
        "multiModel": {"type": "boolean"},
        "disabled": {"type": "boolean"},
        "grpcEndpoint": {"type": "string"},
        "grpcDataEndpoint": {"type": "string"},
        "httpDataEndpoint": {"type": "string"},
        "replicas": {"type": "integer", "minimum": 0},
        "builtInAdapter": {"type": "object"},
        "storageHelper": {"type": "object"},
        "workerSpec": {"type": "object"},
        "containers": {"type": "array", "minItems": 1},
        # PodSpec fields, checked as a Pod.
        "volumes": {"type": "array"},
        "nodeSelector": _STRING_MAP,
        "affinity": {"type": "object"},
        "tolerations": {"type": "array"},
        "imagePullSecrets": {"type": "array"},
        "schedulerName": {"type": "string"},
        "hostIPC": {"type": "boolean"},
        "resourceClaims": {"type": "array"},
    },
}
POD_FIELDS = (
    "containers",
    "volumes",
    "nodeSelector",
    "affinity",
    "tolerations",
    "imagePullSecrets",
    "schedulerName",
    "hostIPC",
    "resourceClaims",
)
# An InferenceService's predictor model (serving.kserve.io/v1beta1), the fields used here.
INFERENCE_SERVICE_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["predictor"],
    "properties": {
        "predictor": {
            "type": "object",
            "required": ["model"],
            "properties": {
                "model": {
                    "type": "object",
                    "required": ["modelFormat"],
                    "properties": {
                        "runtime": {"type": "string"},
                        "modelFormat": {
                            "type": "object",
                            "required": ["name"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "version": {"type": "string"},
                            },
                        },
                        "protocolVersion": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]},
                        "storageUri": {"type": "string"},
                    },
                }
            },
        }
    },
}


def manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]):
        with path.open() as f:
            for n, doc in enumerate(yaml.safe_load_all(f)):
                if doc is not None:
                    yield f"{path.relative_to(ROOT)}#{n}:{doc.get('kind')}", doc


ALL = list(manifests())
KUBERNETES = [(name, doc) for name, doc in ALL if not doc["apiVersion"].startswith("serving.")]
KSERVE = [(name, doc) for name, doc in ALL if doc["apiVersion"].startswith("serving.kserve.io/")]


def _ids(items: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [name for name, _ in items]


def test_deploy_holds_the_expected_manifests() -> None:
    kinds = {(Path(name.split("#")[0]).name, doc["kind"]) for name, doc in ALL}
    assert {
        ("deployment.yaml", "Deployment"),
        ("daemonset.yaml", "DaemonSet"),
        ("servingruntime.yaml", "ServingRuntime"),
    } <= kinds
    assert len(ALL) == len(KUBERNETES) + len(KSERVE), "a manifest of an unknown API group"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), KUBERNETES, ids=_ids(KUBERNETES))
def test_kubernetes_schema(name: str, doc: dict[str, Any], version: str) -> None:
    try:
        kv.validate(doc, version, strict=True)
    except kv.ValidationError as exc:
        pytest.fail(f"{name} against Kubernetes {version}: {exc.message} at {list(exc.path)}")


def test_the_validator_refuses_a_misspelt_field() -> None:
    """The check above can fail: strict schemas refuse an unknown field."""
    _, deployment = next((n, d) for n, d in KUBERNETES if d["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSIONS[0], strict=True)


def _validate_structure(doc: Any, schema: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(doc)]


def _as_pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {k: spec[k] for k in POD_FIELDS if k in spec},
    }


def serving_runtime_errors(doc: dict[str, Any]) -> list[str]:
    errors = _validate_structure(doc["spec"], SERVING_RUNTIME_SPEC)
    if doc["apiVersion"] != "serving.kserve.io/v1alpha1":
        errors.append(f"apiVersion {doc['apiVersion']}: ServingRuntime is v1alpha1")
    if not errors:
        for version in K8S_VERSIONS:
            try:
                kv.validate(_as_pod(doc["metadata"]["name"], doc["spec"]), version, strict=True)
            except kv.ValidationError as exc:
                errors.append(f"pod fields, Kubernetes {version}: {exc.message} {list(exc.path)}")
    return errors


@pytest.mark.parametrize(("name", "doc"), KSERVE, ids=_ids(KSERVE))
def test_kserve_structure(name: str, doc: dict[str, Any]) -> None:
    if doc["kind"] == "ServingRuntime":
        errors = serving_runtime_errors(doc)
        # KServe's conventions: the model server is kserve-container; the v2 protocol here.
        assert [c["name"] for c in doc["spec"]["containers"]] == ["kserve-container"]
        assert set(doc["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
        assert {"triton", "onnx"} <= {f["name"] for f in doc["spec"]["supportedModelFormats"]}
    elif doc["kind"] == "InferenceService":
        errors = _validate_structure(doc["spec"], INFERENCE_SERVICE_SPEC)
        model = doc["spec"]["predictor"]["model"]
        runtimes = {d["metadata"]["name"]: d for _, d in KSERVE if d["kind"] == "ServingRuntime"}
        runtime = runtimes.get(model.get("runtime", ""))
        assert runtime is not None, f"{name}: runtime {model.get('runtime')!r} not in deploy/"
        formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
        assert model["modelFormat"]["name"] in formats
        assert model.get("protocolVersion", "v1") in runtime["spec"]["protocolVersions"]
    else:
        pytest.fail(f"{name}: no check for KServe's {doc['kind']}")
    assert not errors, f"{name}: {errors}"


def test_the_structural_check_refuses_a_wrong_serving_runtime() -> None:
    _, runtime = next((n, d) for n, d in KSERVE if d["kind"] == "ServingRuntime")
    assert serving_runtime_errors(runtime) == []
    changes: tuple[Callable[[dict[str, Any]], object], ...] = (
        lambda spec: spec.update(protocolVersions=["v3"]),
        lambda spec: spec["supportedModelFormats"][0].pop("name"),
        lambda spec: spec.update(supportedModelFormat=[]),
        lambda spec: spec["containers"][0].update(readinesProbe={}),
        lambda spec: spec.pop("containers"),
    )
    for change in changes:
        bad = copy.deepcopy(runtime)
        change(bad["spec"])
        assert serving_runtime_errors(bad), bad["spec"]


# --- what the manifests promise about this server --------------------------------------------


def _entrypoint() -> list[str]:
    match = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", CONTAINERFILE.read_text(), re.MULTILINE)
    assert match, "no ENTRYPOINT in the Containerfile"
    entry: list[str] = json.loads(match.group(1))
    return entry


def _image_user() -> str:
    match = re.search(r"^USER\s+(\d+)", CONTAINERFILE.read_text(), re.MULTILINE)
    assert match, "no numeric USER in the Containerfile"
    return match.group(1)


def server_containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(manifest, pod spec, pod security context, server container) for each server container."""
    for name, doc in ALL:
        if doc["kind"] in ("Deployment", "DaemonSet"):
            pod = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "ServingRuntime":
            pod = doc["spec"]
        else:
            continue
        for container in pod["containers"]:
            yield name, pod, pod.get("securityContext", {}), container


SERVERS = list(server_containers())


@pytest.mark.parametrize(
    ("name", "pod", "pod_security", "container"), SERVERS, ids=[s[0] for s in SERVERS]
)
def test_server_container(
    name: str, pod: dict[str, Any], pod_security: dict[str, Any], container: dict[str, Any]
) -> None:
    assert container.get("command") is None, "the image's ENTRYPOINT starts the server"
    entry = _entrypoint()
    assert entry[1] == "serve"
    parser = argparse.ArgumentParser(prog=name)
    add_serve_flags(parser)
    try:
        settings = settings_from_args(parser.parse_args(entry[2:] + container["args"]))
    except SystemExit as exc:
        pytest.fail(f"{name}: the server refuses its arguments: {exc}")
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    http_port = ports.get("http", settings.http_port)
    assert settings.http_port == http_port
    if "grpc" in ports:
        assert settings.grpc_port == ports["grpc"]
    if "metrics" in ports:
        assert settings.metrics_port == ports["metrics"]
    assert settings.http_address == "0.0.0.0"  # reachable from outside the pod's loopback

    # Probes on the health endpoints of the HTTP port.
    for probe, path in (
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert ports.get(get["port"], get["port"]) == http_port, probe
    if "startupProbe" in container:
        startup = container["startupProbe"]
        assert startup["httpGet"]["path"].startswith("/v2/health/")
        # As TimeoutStartSec=10min in the systemd unit: big models load slowly on a device.
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300

    # Confined: non-root (the image's user), no privilege, no capability, read-only root.
    security = {**pod_security, **container["securityContext"]}
    assert security["runAsNonRoot"] is True
    assert str(security["runAsUser"]) == _image_user()
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "add" not in security["capabilities"]
    assert "memory" in container["resources"]["limits"]
    assert "memory" in container["resources"]["requests"]
    # ... with the places it writes on volumes.
    mounts = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert {"/tmp", "/var/lib/edge-appliance"} <= mounts

    # SIGKILL never comes before the server's own deadline ends its shutdown.
    deadline = settings.exit_timeout_secs
    grace = pod.get("terminationGracePeriodSeconds", 30)
    assert grace > deadline + FORCED_EXIT_AFTER_S, (grace, deadline)
    assert deadline <= SHUTDOWN_DEADLINE_S


def test_every_manifest_uses_the_image_of_build_oci() -> None:
    for name, _pod, _, container in SERVERS:
        assert container["image"].startswith("localhost/edge-appliance:"), name
    for name, doc in ALL:
        if doc["kind"] == "DaemonSet":
            for init in doc["spec"]["template"]["spec"].get("initContainers", []):
                # Root with CHOWN alone, to hand the node's state folder to the image's user.
                assert init["securityContext"]["capabilities"] == {
                    "drop": ["ALL"],
                    "add": ["CHOWN"],
                }
                assert _image_user() in " ".join(init["command"]), name

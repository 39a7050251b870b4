"""What this server is and what it can run: `edge-appliance version [--json]`, `/v2` "build".

The commit comes from `appliance/ops/_build.py` (written by build/build.sh into a binary), else from
`git rev-parse --short HEAD` in a checkout, else "unknown". Every probe is guarded: a report
never fails because a library or a GPU driver is missing or broken.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from appliance import __version__
from appliance.common import extras

_ROOT = Path(__file__).resolve().parents[2]  # the checkout: appliance/ops/buildinfo.py
# Libraries a GPU deployment uses, reported whether or not a backend serves with them yet.
GPU_LIBRARIES = ("tensorrt", "pycuda", "pynvml")
# JetPack's release file: the sign of a Jetson (NVML does not see its integrated GPU).
JETSON_RELEASE = Path("/etc/nv_tegra_release")
# Backend -> (module, distribution) of the library that runs its models. Availability is the
# module being installed (find_spec), the version its distribution's: importing torch or
# openvino only to list them would cost seconds. "python" needs nothing beyond this package;
# "fil" runs its converted trees with ONNX Runtime (converters are checked per model at load).
BACKEND_LIBRARIES: dict[str, tuple[str, str] | None] = {
    "onnxruntime": ("onnxruntime", "onnxruntime"),
    "python": None,
    "fil": ("onnxruntime", "onnxruntime"),
    "openvino": ("openvino", "openvino"),
    "pytorch": ("torch", "torch"),
    "tensorrt": ("tensorrt", "tensorrt"),
}


def _build_module() -> dict[str, str]:
    try:
        from appliance.ops import _build  # type: ignore[attr-defined,unused-ignore]  # build.sh writes it
    except ImportError:
        return {}
    return {k.lower(): str(v) for k, v in vars(_build).items() if k.isupper()}


def commit() -> str:
    built = _build_module().get("commit")
    if built:
        return built
    if (_ROOT / ".git").exists():
        try:
            done = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=_ROOT,
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return "unknown"


def summary() -> dict[str, Any]:
    """The cheap part (no imports, no devices): for the server metadata."""
    built = _build_module()
    info: dict[str, Any] = {
        "version": __version__,
        "commit": commit(),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }
    for key, name in (("built", "built"), ("glibc", "glibc_floor")):
        if built.get(key):
            info[name] = built[key]  # a binary: when, and the oldest glibc it runs on
    info["backends"] = available_backends()
    return info


def _probe(name: str) -> dict[str, Any]:
    """Whether backend `name` can serve here, from installed files only (nothing imported)."""
    from edge_backends.registry import backend_module

    library = BACKEND_LIBRARIES.get(name, (backend_module(name), ""))
    if library is None:
        return {"available": True}
    module, dist = library
    if not extras.installed(module):
        if extras.frozen():
            return {"available": False, "error": f"this binary does not include {module}"}
        extra_name = extras.EXTRA_OF.get(module)
        extra = f" (pip install 'edge-appliance[{extra_name}]')" if extra_name else ""
        return {"available": False, "error": f"{module} is not installed{extra}"}
    entry: dict[str, Any] = {"available": True, "library": dist}
    if dist:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            entry["version"] = importlib.metadata.version(dist)
    return entry


def available_backends() -> dict[str, str]:
    """Backend -> the library (and version) that runs it, for the backends this build can
    serve with: the server metadata's "build" and the start-up log. Cheap: no imports."""
    from edge_backends.registry import known_backends

    found = {}
    for name in known_backends():
        entry = _probe(name)
        if entry["available"]:
            found[name] = " ".join(filter(None, (entry.get("library"), entry.get("version"))))
    return found


def backends_line() -> str:
    """One line naming the available backends, e.g. for the log."""
    return ", ".join(f"{n} ({lib})" if lib else n for n, lib in available_backends().items())


def backends() -> dict[str, dict[str, Any]]:
    """Each backend the registry knows: whether it can serve here, and with what."""
    from edge_backends.registry import known_backends

    found: dict[str, dict[str, Any]] = {}
    for name in known_backends():
        entry = _probe(name)
        if name == "onnxruntime" and entry["available"]:
            entry.update(_onnxruntime())  # the providers need the import; ORT is a core dep
        found[name] = entry
    return found


def _onnxruntime() -> dict[str, Any]:
    try:
        import onnxruntime
    except Exception as exc:  # pragma: no cover - the backend imported it already
        return {"error": str(exc)}
    return {
        "version": str(onnxruntime.__version__),
        "providers": list(onnxruntime.get_available_providers()),
    }


def libraries() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name in GPU_LIBRARIES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            found[name] = {"available": False, "error": str(exc)}
            continue
        version = getattr(module, "__version__", None) or getattr(module, "VERSION", None)
        found[name] = {"available": True, **({"version": str(version)} if version else {})}
    return found


def gpu() -> dict[str, Any]:
    """Whether an NVIDIA GPU is here: NVML when importable, else the driver's files, else the
    Jetson release file (NVML does not see a Jetson's integrated GPU)."""
    notes = []
    pynvml: Any = None
    with contextlib.suppress(Exception):
        pynvml = importlib.import_module("pynvml")
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            try:
                count = int(pynvml.nvmlDeviceGetCount())
                names = [
                    _text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(count)
                ]
                driver = _text(pynvml.nvmlSystemGetDriverVersion())
            finally:
                pynvml.nvmlShutdown()
            return {"found": count > 0, "via": "nvml", "devices": names, "driver": driver}
        except Exception as exc:
            notes.append(f"nvml: {exc}")
    for path in ("/dev/nvidia0", "/proc/driver/nvidia/version"):
        if Path(path).exists():
            return {"found": True, "via": path, **({"notes": notes} if notes else {})}
    tegra = JETSON_RELEASE
    try:
        if tegra.exists():
            first = tegra.read_text(errors="replace").splitlines()[:1]
            release = first[0].strip("# ").strip() if first else ""
            return {"found": True, "via": str(tegra), "devices": [f"Jetson ({release})"]}
    except OSError as exc:
        notes.append(f"{tegra}: {exc.strerror}")
    return {"found": False, **({"notes": notes} if notes else {})}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def build_info() -> dict[str, Any]:
    """Everything `edge-appliance version --json` prints."""
    info = summary()
    info["python_executable"] = sys.executable
    info["frozen"] = bool(getattr(sys, "frozen", False))
    info.update(backends=backends(), libraries=libraries(), gpu=gpu())
    return info


def render(info: dict[str, Any]) -> str:
    """The human-readable form of build_info()."""
    lines = [f"edge-appliance {info['version']} (commit {info['commit']})"]
    if info.get("built"):
        glibc = f" (needs glibc {info['glibc_floor']}+)" if info.get("glibc_floor") else ""
        lines.append(f"built:     {info['built']}{glibc}")
    lines.append(f"python:    {info['python']} on {info['platform']}")
    parts = []
    for name, entry in info["backends"].items():
        if not entry.get("available"):
            parts.append(f"{name} (unavailable: {entry.get('error', '?')})")
        else:
            library = entry.get("library", "")
            runs = f" via {library}" if library and library != name else ""
            version = f" {entry['version']}" if "version" in entry else ""
            providers = ", ".join(entry.get("providers", []))
            parts.append(f"{name}{runs}{version}" + (f" [{providers}]" if providers else ""))
    lines.append(f"backends:  {'; '.join(parts)}")
    libs = [
        f"{name} {entry.get('version', '')}".strip() if entry["available"] else f"no {name}"
        for name, entry in info["libraries"].items()
    ]
    lines.append(f"libraries: {', '.join(libs)}")
    found = info["gpu"]
    if found.get("found"):
        devices = ", ".join(found.get("devices", [])) or "NVIDIA GPU"
        driver = f", driver {found['driver']}" if found.get("driver") else ""
        lines.append(f"gpu:       {devices} (found via {found['via']}{driver})")
    else:
        lines.append("gpu:       none found")
    return "\n".join(lines)


# -- the build's signed record (`edge-appliance version --verify`) ----------------------------


def build_folder() -> Path | None:
    """The one-folder build this process runs from (None: not a frozen one-folder build)."""
    if not getattr(sys, "frozen", False):
        return None
    folder = Path(sys.executable).resolve().parent
    return folder if (folder / "_internal").is_dir() else None


def embedded_public_key() -> str:
    """The build key's public half (base64), as build/build.sh embedded it ('' in a checkout)."""
    return _build_module().get("public_key", "")

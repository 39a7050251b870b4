#!/usr/bin/env bash
# Run HERE (with the package registry), before a device session: fetch what the GPU machine
# lacks into .device-wheels/ (git-ignored; carried to the device, under 64 MiB). The device
# image has numpy, cuda-python, nvidia-ml-py, CuPy and nvcc, but not this server's own
# dependencies, and it cannot download anything.
#   tests/gpu/prepare_wheelhouse.sh [PYTHON_VERSION]     default 3.12 (the device's python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:-3.12}
out=.device-wheels
rm -rf "$out" && mkdir -p "$out"
pip=(.venv/bin/python -m pip download --quiet --dest "$out" --python-version "$version"
     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
     --only-binary=:all:)
# The server's runtime and the test tools, pinned as CI pins them.
"${pip[@]}" -c constraints.txt onnxruntime aiohttp grpcio protobuf orjson prometheus-client \
    'tritonclient[http,grpc]' onnx pytest pytest-timeout pytest-asyncio requests
# pycuda has no wheels: its source (taken as the file itself: pip would try to build it here),
# built on the device against the image's CUDA with nvcc; its build and run dependencies.
.venv/bin/python - "$out" <<'PY'
import json, sys, urllib.request
release = json.load(urllib.request.urlopen("https://pypi.org/pypi/pycuda/json", timeout=60))
url = next(u["url"] for u in release["urls"] if u["packagetype"] == "sdist")
urllib.request.urlretrieve(url, f"{sys.argv[1]}/{url.rsplit('/', 1)[1]}")
PY
"${pip[@]}" pytools platformdirs mako markupsafe typing-extensions siphash24 setuptools wheel
# The image's own numpy serves (the device venv sees system packages); 16 MB saved.
rm -f "$out"/numpy-*.whl
echo "$version" > "$out/PYTHON_VERSION"
du -sh "$out"

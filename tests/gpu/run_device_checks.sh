#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, with .device-wheels/ carried along
# (tests/gpu/prepare_wheelhouse.sh makes it). Checks everything about GPUs that this
# workplace's GPU machine can check, in under 8 minutes, and prints a table last:
#   1. pycuda builds from source against the image's CUDA (else cuda-python serves alone);
#   2. the device-memory layer (edge_backends/cuda_device.py) on the real GPU, through each
#      library: buffers, streams, pinned memory, copies, IPC handles across processes;
#   3. CUDA shared memory through the real server, with IPC handles from another process;
#   4. NVML GPU metrics with real values through the real server;
#   5. KIND_GPU placement and the fallback rules (CPU onnxruntime, no tensorrt here).
# TensorRT engines and onnxruntime-gpu cannot be brought to that machine (over 1 GB and
# 256 MB): their code stays "unverified on hardware" (README's support table).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/device-checks}
mkdir -p "$out"
declare -a rows
row() { rows+=("$(printf '| %-44s | %-6s | %s |' "$1" "$2" "$3")"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 --version | tee "$out/python.txt"
wanted=$(cat .device-wheels/PYTHON_VERSION 2>/dev/null || echo "?")
have=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [[ $wanted != "$have" ]]; then
  echo "the wheelhouse is for Python $wanted, this machine has $have:" \
       "run tests/gpu/prepare_wheelhouse.sh $have here first" >&2
  exit 2
fi

# A venv that sees the image's numpy, cuda-python, nvidia-ml-py and CuPy.
python3 -m venv --system-site-packages /tmp/gpu-venv
py=/tmp/gpu-venv/bin/python
$py -m pip install --quiet --no-index --find-links .device-wheels onnxruntime aiohttp grpcio \
    protobuf orjson prometheus-client 'tritonclient[http,grpc]' onnx pytest pytest-timeout \
    pytest-asyncio requests > "$out/install.log" 2>&1 \
  && row "server dependencies from the wheelhouse" PASS "" \
  || { row "server dependencies from the wheelhouse" FAIL "see install.log"; }

export CUDA_ROOT=${CUDA_ROOT:-$(dirname "$(dirname "$(command -v nvcc)")")}
if timeout 240 $py -m pip install --no-index --find-links .device-wheels --no-build-isolation \
     pycuda > "$out/pycuda-build.log" 2>&1 && $py -c 'import pycuda.driver' 2>>"$out/pycuda-build.log"; then
  row "pycuda built from source (nvcc $(nvcc --version | grep -o 'release [0-9.]*'))" PASS ""
else
  row "pycuda built from source" FAIL "cuda-python serves alone; see pycuda-build.log"
fi
$py -c 'import cuda.bindings.driver' 2>/dev/null \
  && row "cuda-python (cuda.bindings) present" PASS "" \
  || row "cuda-python (cuda.bindings) present" FAIL "not in the image"

# Each group of checks: a pytest run, its outcome in the table.
check() {
  local title=$1; shift
  local log="$out/$(echo "$title" | tr -c 'a-zA-Z0-9' '_').log"
  timeout 180 $py -m pytest -p no:cacheprovider -q -rs "$@" > "$log" 2>&1
  local rc=$? summary
  summary=$(tail -1 "$log" | sed 's/=//g; s/^ *//; s/ *$//')
  case $rc in
    0) if grep -q "skipped" <<<"$summary" && ! grep -q "passed" <<<"$summary"; then
         row "$title" SKIP "$summary"; else row "$title" PASS "$summary"; fi ;;
    5) row "$title" SKIP "no tests ran" ;;
    *) row "$title" FAIL "$summary" ;;
  esac
}
check "device memory layer (pycuda, cuda-python)" tests/gpu/test_device_memory.py -v
check "CUDA shared memory through the server" tests/gpu/test_cuda_shared_memory.py
check "NVML metrics through the server" tests/gpu/test_nvml_metrics.py tests/unit/test_gpu_metrics.py
check "KIND_GPU placement and fallback rules" tests/unit/test_gpu_placement.py \
  tests/unit/test_trt_engine.py tests/integration/test_gpu_fallback.py \
  tests/integration/test_instance_groups.py

{
  echo
  echo "| check | result | detail |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/table.md"
! grep -q "| FAIL" "$out/table.md"

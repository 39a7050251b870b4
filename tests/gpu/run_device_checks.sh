#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, with .device-wheels/ carried along
# (tests/gpu/prepare_wheelhouse.sh makes it). Checks everything about GPUs that this
# workplace's GPU machine can check, in under 8 minutes, and prints a table last:
#   1. pycuda builds from source against the image's CUDA (else cuda-python serves alone);
#   2. the device-memory layer (edge_backends/cuda_device.py) on the real GPU, through each
#      library: buffers, streams, pinned memory, copies, IPC handles across processes;
#   3. CUDA shared memory through the real server, with IPC handles from another process;
#   4. NVML GPU metrics with real values through the real server;
#   5. TorchScript models on KIND_GPU instances with the image's CUDA torch;
#   6. KIND_GPU placement and the fallback rules (CPU onnxruntime, no tensorrt here).
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

# The toolkit's root: the first of $CUDA_ROOT, /usr/local/cuda and nvcc's parent that has
# cuda.h (nvcc may be a wrapper script elsewhere); its bin/ first on PATH, since pycuda's build
# finds the root from where nvcc is.
for root in "${CUDA_ROOT:-}" /usr/local/cuda "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"; do
  if [[ -n $root && -f $root/include/cuda.h ]]; then CUDA_ROOT=$root; break; fi
done
CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
export CUDA_ROOT PATH="$CUDA_ROOT/bin:$PATH"
# pycuda's build reads its options from ~/.aksetup-defaults.py: the toolkit root, and CURAND
# only where its headers are (some images ship the runtime without them).
aksetup_home=$(mktemp -d)
curand=False; [[ -f $CUDA_ROOT/include/curand.h ]] && curand=True
# pycuda links the driver (-lcuda): containers often mount only libcuda.so.1, so link to that.
mkdir -p "$aksetup_home/lib"
driver=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so(\.1)? /{print $NF; exit}')
[[ -n $driver ]] && ln -sf "$driver" "$aksetup_home/lib/libcuda.so"
printf 'CUDA_ROOT = "%s"\nCUDA_ENABLE_CURAND = %s\nCUDADRV_LIB_DIR = ["%s", "%s/lib64", "%s/lib64/stubs"]\n' \
  "$CUDA_ROOT" "$curand" "$aksetup_home/lib" "$CUDA_ROOT" "$CUDA_ROOT" \
  > "$aksetup_home/.aksetup-defaults.py"
# Without build isolation (nothing can be downloaded there), pycuda's build needs these first.
$py -m pip install --quiet --no-index --find-links .device-wheels setuptools wheel pytools \
    platformdirs mako markupsafe typing-extensions siphash24 > "$out/pycuda-build.log" 2>&1
if HOME=$aksetup_home timeout 300 $py -m pip install --no-index --find-links .device-wheels \
     --no-build-isolation pycuda >> "$out/pycuda-build.log" 2>&1; then
  if $py -c 'import pycuda.driver' 2>>"$out/pycuda-build.log"; then
    row "pycuda built from source (nvcc $(nvcc --version | grep -o 'release [0-9.]*'))" PASS ""
  else
    row "pycuda built from source" FAIL "built, but import failed: see pycuda-build.log"
  fi
else
  why=$(grep -m1 -o "cannot find -lcuda\|fatal error: [^ ]*" "$out/pycuda-build.log")
  row "pycuda built from source" FAIL "${why:-see pycuda-build.log}; cuda-python serves alone"
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
check "PyTorch KIND_GPU on CUDA (the image's torch)" tests/integration/test_torch_models.py
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

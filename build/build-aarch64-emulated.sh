#!/usr/bin/env bash
# Build the aarch64 (arm64) binary on an x86_64 host under emulation, and smoke-test it.
#
#   sudo build/build-aarch64-emulated.sh        -> dist-aarch64/edge-appliance/ (one folder)
#
# How: qemu-user-static through binfmt_misc runs a Debian 12 (bookworm) arm64 root made by
# debootstrap; build/build.sh runs unchanged inside it, on a clone of this repository's HEAD
# (commit it first). pip in the root reaches no index: the aarch64 wheels (constraints.txt
# versions) are downloaded on the host with pip download --platform and installed from a
# folder. The smoke test serves the example repository (generated on the host: the models are
# architecture-independent) from the aarch64 binary in the root on free loopback ports,
# checks from the host that every model is READY, runs gRPC and HTTP inferences against
# `simple` and one against the Python model `densenet_preprocess` (its own process, BLS to
# DenseNet-121), and stops the server with SIGTERM (exit status 0 expected). The PASS lines
# and the logs (build, serve) are left in dist-aarch64/. Results: docs/benchmarks/history.md.
#
# Idempotent: the root, the wheels and the root's .venv are reused. Needs root (debootstrap,
# chroot, mounts) and the host's .venv with onnx and tritonclient[grpc] (scripts/bootstrap dev).
# Prints PASS/FAIL lines; exits non-zero on the first failure; unmounts on exit.
#
# Settings (environment):
#   EDGE_ARM64_ROOT=/var/tmp/edge-arm64-root      the arm64 root (1.2 GB once built)
#   EDGE_ARM64_WHEELS=/var/tmp/edge-arm64-wheels  the downloaded aarch64 wheels
#   EDGE_ARM64_REF=HEAD                           what to build
#   EDGE_ARM64_MIRROR=<the host's Debian mirror>  for debootstrap
#   EDGE_ARM64_READY_TIMEOUT=900                  seconds to wait for /v2/health/ready
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
ROOT=${EDGE_ARM64_ROOT:-/var/tmp/edge-arm64-root}
WHEELS=${EDGE_ARM64_WHEELS:-/var/tmp/edge-arm64-wheels}
REF=${EDGE_ARM64_REF:-HEAD}
READY_TIMEOUT=${EDGE_ARM64_READY_TIMEOUT:-900}
SUITE=bookworm
OUT=$REPO/dist-aarch64
SRC=/opt/edge/src            # inside the root
MODELS=/opt/edge/models      # inside the root
HOST_PY=$REPO/.venv/bin/python
# Debian packages the build needs in the root. binutils: PyInstaller runs objdump and ldd;
# python3-dev brings the shared libpython it bundles; git: build.sh reads the commit.
ROOT_PACKAGES=(python3 python3-venv python3-dev gcc libc6-dev binutils zlib1g-dev git
  ca-certificates file)

pass() { echo "PASS $*"; echo "PASS $*" >> "$REPORT"; }
fail() { echo "FAIL $*" >&2; echo "FAIL $*" >> "$REPORT"; exit 1; }
note() { echo "== $*"; }
fact() { echo "     $*"; echo "     $*" >> "$REPORT"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
ROOT_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
  DEBIAN_FRONTEND=noninteractive)
in_root() { chroot "$ROOT" /usr/bin/env -i "${ROOT_ENV[@]}" "$@"; }

[[ $(id -u) == 0 ]] || { echo "FAIL needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
[[ $(uname -m) == x86_64 ]] || echo "note: host is $(uname -m), not x86_64"
mkdir -p "$OUT"
REPORT=$OUT/smoke-test.txt
: > "$REPORT"
exec 9> "$ROOT.lock"
flock -n 9 || fail "another build-aarch64-emulated.sh holds $ROOT.lock"

server_pid=
cleanup() {
  local rc=$?
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  for m in "$ROOT/dev/shm" "$ROOT/dev/pts" "$ROOT/dev" "$ROOT/proc"; do
    if mountpoint -q "$m" 2>/dev/null; then umount "$m" 2>/dev/null || umount -l "$m" || true; fi
  done
  rm -f "$ROOT/$SRC/appliance/ops/_build.py" 2>/dev/null || true
  if [[ $rc != 0 ]] && ! grep -q '^FAIL' "$REPORT" 2>/dev/null; then
    echo "FAIL aarch64 emulated build (exit $rc; see the output above)" | tee -a "$REPORT" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. host: qemu-user, binfmt_misc, debootstrap ---------------------------------------------
note "host packages and binfmt"
missing=()
for pkg in qemu-user-static binfmt-support debootstrap; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ $status == *"ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" > /dev/null
fi
if [[ ! -e /proc/sys/fs/binfmt_misc/status ]]; then
  mount binfmt_misc -t binfmt_misc /proc/sys/fs/binfmt_misc
fi
if ! grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null; then
  update-binfmts --enable qemu-aarch64 || true
fi
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null \
  || fail "binfmt: qemu-aarch64 not registered (update-binfmts --enable qemu-aarch64)"
interpreter=$(awk '/^interpreter/ {print $2}' /proc/sys/fs/binfmt_misc/qemu-aarch64)
# Without the F flag the kernel looks the interpreter up inside the chroot.
fix_binary=$(awk '/^flags:/ {print ($2 ~ /F/) ? 1 : 0}' /proc/sys/fs/binfmt_misc/qemu-aarch64)
pass "host: qemu-aarch64 binfmt enabled ($interpreter, flags $(awk '/^flags:/ {print $2}' \
  /proc/sys/fs/binfmt_misc/qemu-aarch64)); $(qemu-aarch64-static --version | sed -n 1p)"

# ---- 2. the Debian 12 arm64 root --------------------------------------------------------------
mirror=${EDGE_ARM64_MIRROR:-}
if [[ -z $mirror ]]; then
  # The host's own Debian mirror (deb822 .sources first, then one-line sources.list).
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}' \
    | grep -v -- '-security' | sed -n 1p || true)
  [[ -n $mirror ]] || mirror=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    | awk '{print $2}' | grep -v -- '-security' | grep /debian | sed -n 1p || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
if [[ ! -f $ROOT/.edge-root-complete ]]; then
  note "debootstrap $SUITE arm64 from $mirror into $ROOT (a few minutes)"
  t=$(now)
  rm -rf "$ROOT.tmp"
  include=$(IFS=,; echo "${ROOT_PACKAGES[*]}")
  debootstrap --arch=arm64 --variant=minbase --include="$include" "$SUITE" "$ROOT.tmp" "$mirror" \
    > "$OUT/debootstrap.log" 2>&1 || { tail -20 "$OUT/debootstrap.log" >&2; fail "debootstrap (log: $OUT/debootstrap.log)"; }
  rm -rf "$ROOT"
  mv "$ROOT.tmp" "$ROOT"
  touch "$ROOT/.edge-root-complete"
  pass "root: debootstrap $SUITE arm64 in $(since "$t") s"
else
  pass "root: reusing $ROOT"
fi
if [[ $fix_binary == 0 ]]; then
  mkdir -p "$ROOT$(dirname "$interpreter")"
  cp -f "$(readlink -f "$interpreter")" "$ROOT$interpreter"
fi
mkdir -p "$ROOT/proc" "$ROOT/dev"
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
# /dev bound from the host, with a shm of its own (multiprocessing's semaphores, the Python
# models' tensors). The host's /sys is NOT bound: onnxruntime's CPU probe crashes on it
# under qemu; without /sys it falls back and warns.
mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
mountpoint -q "$ROOT/dev/pts" || mount --bind /dev/pts "$ROOT/dev/pts"
mountpoint -q "$ROOT/dev/shm" || mount -t tmpfs -o mode=1777,size=1g shm "$ROOT/dev/shm"
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
[[ $(in_root uname -m) == aarch64 ]] || fail "the root does not run as aarch64"
missing=()
for pkg in "${ROOT_PACKAGES[@]}"; do
  status=$(in_root dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ $status == *"ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
  note "apt-get install in the root: ${missing[*]}"
  t=$(now)
  in_root apt-get update -qq
  in_root apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
  pass "root: installed ${missing[*]} in $(since "$t") s"
fi
root_python=$(in_root python3 -c 'import platform; print(platform.python_version())')
root_glibc=$(in_root ldd --version | sed -n 1p | awk '{print $NF}')
pass "root: Debian $(cat "$ROOT/etc/debian_version") arm64, python $root_python, glibc $root_glibc"
py_tag=$(echo "$root_python" | awk -F. '{print $1"."$2}')

# ---- 3. the source: a clone of REF in the root ------------------------------------------------
commit=$(git rev-parse "$REF^{commit}")
note "source: $commit ($REF) into $ROOT$SRC"
if [[ ! -d $ROOT$SRC/.git ]]; then
  rm -rf "${ROOT:?}$SRC"
  git clone --quiet --no-hardlinks --no-checkout "$REPO" "$ROOT$SRC"
fi
git -C "$ROOT$SRC" fetch --quiet "$REPO" "$commit"
git -C "$ROOT$SRC" checkout --quiet --force --detach "$commit"
# Keep the root's .venv (scripts/bootstrap reinstalls only when pyproject/constraints change).
git -C "$ROOT$SRC" clean --quiet -ffdx -e /.venv
[[ -z $(git status --porcelain --untracked-files=no) ]] \
  || echo "note: uncommitted changes here are not in the build (it builds $REF = ${commit:0:7})"

# ---- 4. aarch64 wheels, downloaded on the host ------------------------------------------------
note "aarch64 wheels for python $py_tag into $WHEELS"
[[ -x $HOST_PY ]] || fail "no host venv at $HOST_PY (run scripts/bootstrap dev)"
stamp=$(cat "$ROOT$SRC/pyproject.toml" "$ROOT$SRC/constraints.txt" | sha256sum | cut -c1-16)-$py_tag
if [[ $(cat "$WHEELS/.stamp" 2>/dev/null) != "$stamp" ]]; then
  t=$(now)
  mkdir -p "$WHEELS"
  # The whole closure of the project's runtime, s3, signing and build requirements, at the
  # constraints.txt versions, as aarch64 (or pure-Python) wheels for the root's CPython.
  "$HOST_PY" -m pip download --quiet --disable-pip-version-check --no-cache-dir \
    --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
    --platform manylinux_2_28_aarch64 --platform linux_aarch64 \
    --only-binary=:all: --python-version "$py_tag" --implementation cp \
    -c "$ROOT$SRC/constraints.txt" -d "$WHEELS" "${ROOT}${SRC}[s3,signing,build]" 2> "$OUT/pip-download.log" \
    || { grep -v '^WARNING: Location' "$OUT/pip-download.log" | tail -20 >&2; fail "pip download (log: $OUT/pip-download.log)"; }
  echo "$stamp" > "$WHEELS/.stamp"
  pass "wheels: $(ls "$WHEELS"/*.whl | wc -l) downloaded in $(since "$t") s ($(du -sh "$WHEELS" | cut -f1))"
else
  pass "wheels: reusing $(ls "$WHEELS"/*.whl | wc -l) in $WHEELS"
fi
mkdir -p "$ROOT/opt/edge/wheels"
cp -u "$WHEELS"/*.whl "$ROOT/opt/edge/wheels/"

# ---- 5. the build: build/build.sh in the root --------------------------------------------------
note "build/build.sh in the root (pip from $WHEELS only)"
t=$(now)
in_root /bin/sh -c "cd $SRC && PIP_NO_INDEX=1 PIP_FIND_LINKS=/opt/edge/wheels build/build.sh" \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log" >&2; fail "build/build.sh in the root (log: $OUT/build.log)"; }
build_s=$(since "$t")
binary=$ROOT$SRC/dist/edge-appliance/edge-appliance
[[ -x $binary ]] || fail "no binary at $binary"
rm -rf "$OUT/edge-appliance"
cp -a "$ROOT$SRC/dist/edge-appliance" "$OUT/edge-appliance"
pass "build: build/build.sh in the root in $build_s s (includes the venv when it is new)"
file_out=$(file -b "$OUT/edge-appliance/edge-appliance")
[[ $file_out == *"ARM aarch64"* ]] || fail "binary is not aarch64: $file_out"
pass "binary: $file_out"
size_mib=$(du -sm "$OUT/edge-appliance" | cut -f1)
fact "size on disk: ${size_mib} MiB ($(du -sh --apparent-size "$OUT/edge-appliance" | cut -f1) apparent)," \
  "$(find "$OUT/edge-appliance" -type f | wc -l) files"
# The glibc floor: the build root's glibc (build.sh's rule), and the newest GLIBC_ symbol
# version that any bundled ELF file actually asks for.
floor=$(in_root /bin/sh -c "find $SRC/dist/edge-appliance -type f \( -name '*.so*' -o -name edge-appliance \) \
  -exec objdump -T {} + 2>/dev/null || true" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -u -t_ -k2,2V | tail -1 || true)
pass "glibc floor: $root_glibc (built on Debian 12); newest symbol version referenced: ${floor:-?}"
{ grep -E '^edge-appliance|^python:|^backends:' "$OUT/build.log" || true; } | sed 's/^/     /' | tee -a "$REPORT"

# ---- 6. smoke test: serve the example repository, infer from the host -------------------------
note "smoke test"
"$HOST_PY" -c 'import onnx, tritonclient.grpc' 2>/dev/null \
  || fail "the host venv lacks onnx or tritonclient[grpc] (scripts/bootstrap dev)"
rm -rf "${ROOT:?}$MODELS"
(cd "$ROOT$SRC" && "$HOST_PY" -m configs.generate "$ROOT$MODELS" > /dev/null) \
  || fail "generating the example repository on the host"
read -r http_port grpc_port metrics_port < <("$HOST_PY" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
log=$OUT/serve.log
t=$(now)
# Not through in_root (a function: its subshell would get the SIGTERM): chroot and env exec,
# so $! is the server itself.
chroot "$ROOT" /usr/bin/env -i "${ROOT_ENV[@]}" "$SRC/dist/edge-appliance/edge-appliance" serve --model-repository "$MODELS" \
  --http-port "$http_port" --grpc-port "$grpc_port" --metrics-port "$metrics_port" \
  > "$log" 2>&1 &
server_pid=$!
ready=
deadline=$(($(date +%s) + READY_TIMEOUT))
while (($(date +%s) < deadline)); do
  kill -0 "$server_pid" 2>/dev/null || { tail -30 "$log" >&2; fail "server exited before ready (log: $log)"; }
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/v2/health/ready" || true)
  if [[ $code == 200 ]]; then ready=$(since "$t"); break; fi
  sleep 1
done
[[ -n $ready ]] || { tail -30 "$log" >&2; fail "not ready after $READY_TIMEOUT s (log: $log)"; }
pass "serve: /v2/health/ready 200 after $ready s (example repository, emulated)"
"$HOST_PY" - "$http_port" "$grpc_port" >> "$REPORT.tmp" <<'PY' || { cat "$REPORT.tmp" >&2; cat "$REPORT.tmp" >> "$REPORT"; rm -f "$REPORT.tmp"; fail "inference checks"; }
import json
import sys
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

http_port, grpc_port = sys.argv[1:3]
base = f"http://127.0.0.1:{http_port}"
ok = True


def check(cond, what):
    global ok
    print(("PASS " if cond else "FAIL ") + what)
    ok = ok and bool(cond)


meta = json.load(urllib.request.urlopen(f"{base}/v2", timeout=30))
build = meta.get("build", {})
check(build.get("platform") == "Linux aarch64",
      f"server metadata: {build.get('platform')}, python {build.get('python')}, "
      f"commit {build.get('commit')}")
req = urllib.request.Request(f"{base}/v2/repository/index", data=b"{}", method="POST")
index = json.load(urllib.request.urlopen(req, timeout=30))
not_ready = [f"{m['name']}: {m.get('state')} {m.get('reason', '')}" for m in index
             if m.get("state") != "READY"]
check(not not_ready, f"repository index: {len(index) - len(not_ready)}/{len(index)} models READY"
      + (f" (not: {not_ready})" if not_ready else ""))

a = np.arange(16, dtype=np.int32).reshape(1, 16)
b = np.full((1, 16), 3, dtype=np.int32)
client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
          grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
inputs[0].set_data_from_numpy(a)
inputs[1].set_data_from_numpy(b)
times = []
for _ in range(5):
    start = time.perf_counter()
    result = client.infer("simple", inputs, client_timeout=120)
    times.append(time.perf_counter() - start)
out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
check(np.array_equal(out0, a + b) and np.array_equal(out1, a - b),
      f"gRPC infer simple: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 "
      f"(5 requests, median {sorted(times)[2] * 1000:.1f} ms emulated)")

body = json.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.ravel().tolist()},
    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.ravel().tolist()},
]}).encode()
req = urllib.request.Request(f"{base}/v2/models/simple/infer", data=body,
                             headers={"Content-Type": "application/json"})
outputs = {o["name"]: o["data"] for o in json.load(urllib.request.urlopen(req, timeout=120))["outputs"]}
check(outputs.get("OUTPUT0") == (a + b).ravel().tolist()
      and outputs.get("OUTPUT1") == (a - b).ravel().tolist(), "HTTP infer simple: sum and difference")

image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
pre = grpcclient.InferInput("IMAGE", [224, 224, 3], "UINT8")
pre.set_data_from_numpy(image)
try:
    start = time.perf_counter()
    scores = client.infer("densenet_preprocess", [pre], client_timeout=300)
    took = time.perf_counter() - start
    out = scores.as_numpy("SCORES")
    check(out is not None and out.shape == (1000,) and bool(np.isfinite(out).all()),
          f"gRPC infer densenet_preprocess (Python model process + BLS to DenseNet-121): "
          f"SCORES {None if out is None else out.shape}, {took:.1f} s emulated")
except Exception as exc:
    check(False, f"gRPC infer densenet_preprocess: {exc}")
sys.exit(0 if ok else 1)
PY
cat "$REPORT.tmp"; cat "$REPORT.tmp" >> "$REPORT"; rm -f "$REPORT.tmp"
kill -TERM "$server_pid"
t=$(now)
rc=
for _ in $(seq 1 180); do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    set +e; wait "$server_pid"; rc=$?; set -e
    break
  fi
  sleep 1
done
[[ -n $rc ]] || { tail -20 "$log" >&2; fail "server still running 180 s after SIGTERM (log: $log)"; }
server_pid=
[[ $rc == 0 ]] || { tail -20 "$log" >&2; fail "server exit status $rc after SIGTERM (log: $log)"; }
pass "stop: SIGTERM -> exit status 0 in $(since "$t") s"
echo "PASS aarch64 emulated build and smoke test ($OUT/edge-appliance, ${commit:0:7})" | tee -a "$REPORT"

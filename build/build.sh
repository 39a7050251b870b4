#!/usr/bin/env bash
# Build the edge-appliance binary for this machine's architecture.
#   build/build.sh [onedir|onefile]      -> dist/edge-appliance/edge-appliance (onedir, default)
#                                           or dist/edge-appliance (onefile)
# Uses .venv (made by scripts/bootstrap); installs PyInstaller and the s3/signing extras there.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-onedir}
case $mode in onedir|onefile) ;; *) echo "usage: $0 [onedir|onefile]" >&2; exit 2 ;; esac
scripts/bootstrap "s3,signing,build"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)
[[ -n $dirty ]] && commit="$commit-dirty"
cat > appliance/_build.py <<PY
"""Written by build/build.sh: what this binary was built from."""

COMMIT = "$commit"
BUILT = "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
GLIBC = "$(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
MACHINE = "$(uname -m)"
PY
trap 'rm -f appliance/_build.py' EXIT
rm -rf build/work "dist/edge-appliance"
EDGE_BUILD_MODE=$mode .venv/bin/pyinstaller --noconfirm --log-level WARN \
  --workpath build/work --distpath dist build/edge-appliance.spec
rm -rf build/work
if [[ $mode == onedir ]]; then
  # PyInstaller's --strip would also strip numpy's OpenBLAS, which breaks it; strip only the
  # big libraries known to survive it (debug symbols are most of libpython and the Cython
  # modules).
  find dist/edge-appliance/_internal \( -name 'libpython3*.so*' -o -path '*/lib-dynload/*.so' \
    -o -path '*/uvloop/*.so' -o -path '*/grpc/_cython/*.so' -o -path '*/onnxruntime/capi/*.so' \
    -o -path '*/cryptography/hazmat/bindings/*.so' -o -path '*/google/_upb/*.so' \
    -o -path '*/aiohttp/*.so' -o -path '*/orjson/*.so' -o -path '*/yarl/*.so' \
    -o -path '*/multidict/*.so' -o -path '*/propcache/*.so' -o -path '*/frozenlist/*.so' \) \
    -type f -exec strip --strip-unneeded {} +
fi
if [[ $mode == onedir ]]; then binary=dist/edge-appliance/edge-appliance; else binary=dist/edge-appliance; fi
echo "built $binary ($(du -sh "${binary%/edge-appliance}" 2>/dev/null | cut -f1) on disk; glibc $(ldd --version | head -1 | awk '{print $NF}') or newer needed)"
"$binary" version

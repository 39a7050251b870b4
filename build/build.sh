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
# The build key signs the build's record (SHA256SUMS of every file, the SBOM's included):
# EDGE_BUILD_KEY names an Ed25519 private key (PEM: openssl genpkey -algorithm ed25519); without
# it an ephemeral key is made for this build alone (CI). Its public key goes into the build,
# for `edge-appliance version --verify`.
keys=$(mktemp -d)
key=${EDGE_BUILD_KEY:-}
if [[ -z $key ]]; then
  key=$keys/build-key.pem
  .venv/bin/python - "$key" <<'PY'
import sys
from pathlib import Path
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
pem = Ed25519PrivateKey.generate().private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)
Path(sys.argv[1]).write_bytes(pem)
PY
  echo "signing with an ephemeral build key (set EDGE_BUILD_KEY to sign with yours)"
fi
public_key=$(.venv/bin/python - "$key" <<'PY'
import base64, sys
from pathlib import Path
from cryptography.hazmat.primitives import serialization
key = serialization.load_pem_private_key(Path(sys.argv[1]).read_bytes(), password=None)
raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
print(base64.b64encode(raw).decode())
PY
)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)
[[ -n $dirty ]] && commit="$commit-dirty"
cat > appliance/ops/_build.py <<PY
"""Written by build/build.sh: what this binary was built from."""

COMMIT = "$commit"
BUILT = "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
GLIBC = "$(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
MACHINE = "$(uname -m)"
PUBLIC_KEY = "$public_key"  # the build key's (Ed25519, base64): version --verify checks with it
PY
trap 'rm -f appliance/ops/_build.py; rm -rf "$keys"' EXIT
rm -rf build/work "dist/edge-appliance"
EDGE_BUNDLED_LIST=$keys/bundled.txt EDGE_BUILD_MODE=$mode .venv/bin/pyinstaller --noconfirm --log-level WARN \
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
if [[ $mode == onedir ]]; then
  # The SBOM of what is bundled, then the signed record of every file (SHA256SUMS and its
  # Ed25519 signature, as model versions are signed: repository/manifest.py).
  .venv/bin/python build/sbom.py "$keys/bundled.txt" dist/edge-appliance/sbom.cdx.json
  .venv/bin/python -m appliance manifest --sign-key "$key" dist/edge-appliance
  "$binary" version --verify
fi
echo "built $binary ($(du -sh "${binary%/edge-appliance}" 2>/dev/null | cut -f1) on disk; glibc $(ldd --version | head -1 | awk '{print $NF}') or newer needed)"
"$binary" version

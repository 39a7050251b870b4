#!/usr/bin/env bash
# Build the edge-appliance OCI image from the one-folder binary, with podman (or buildah), on an
# empty base: nothing is pulled from a registry. See docs/containers.md.
#
#   build/oci/build.sh [--tag NAME] [--save FILE] [--ci]
#     --tag NAME    the image's name (default localhost/edge-appliance:<version>-<commit>, also
#                   tagged localhost/edge-appliance:latest)
#     --save FILE   also write the image as a docker-archive tarball (k3s: `k3s ctr images
#                   import FILE`; another machine: `podman load -i FILE`)
#     --ci          (.ci/run) install podman and runc with apt-get when missing; where this
#                   machine cannot build, say why on one SKIP line and exit 0; the tag is
#                   localhost/edge-appliance:ci unless --tag says otherwise
#
# The binary: $EDGE_OCI_DIST (default dist/edge-appliance; built with build/build.sh when
# missing). The image holds it in /opt/edge-appliance/, plus what it takes from the build
# machine: the shared libraries outside the bundle that its ELF files need (ldd: glibc, and
# libgcc_s, which glibc loads at run time for thread cancellation), /etc/passwd and /etc/group
# with the service user (uid and gid 10001), the CA bundle, and a static busybox for the
# HEALTHCHECK (from Debian's busybox-static package, downloaded with apt-get when this machine
# has no static busybox). The image is for the build machine's architecture and needs nothing
# newer than its glibc, which is inside.
set -Eeuo pipefail
cd "$(dirname "$0")/../.."
tag=""
save=""
ci=0
while (($#)); do
  case $1 in
    --tag) tag=$2; shift 2 ;;
    --save) save=$2; shift 2 ;;
    --ci) ci=1; shift ;;
    *) echo "usage: $0 [--tag NAME] [--save FILE] [--ci]" >&2; exit 2 ;;
  esac
done
dist=${EDGE_OCI_DIST:-dist/edge-appliance}
uid=10001

skip() {  # where the machine cannot build the image: fatal by hand, a SKIP line in CI
  if ((ci)); then echo "SKIP  OCI image not built: $*"; exit 0; fi
  echo "$*" >&2; exit 2
}

# --- the tools ---------------------------------------------------------------------------------
tool=""
command -v podman >/dev/null && tool=podman
[[ -z $tool ]] && command -v buildah >/dev/null && tool=buildah
if [[ -z $tool || ($ci == 1 && $tool == podman && -z $(command -v runc)) ]]; then
  if ((ci)) && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "installing podman and runc"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc \
      >/dev/null; } || skip "cannot install podman and runc with apt-get"
    tool=podman
  else
    skip "no podman or buildah here (Debian: apt-get install podman runc)"
  fi
fi
if [[ ! -x $dist/edge-appliance ]]; then
  [[ $dist == dist/edge-appliance ]] || skip "no binary at $dist"
  echo "no build at $dist: running build/build.sh"
  build/build.sh onedir
fi

SECONDS=0
ctx=$(mktemp -d "${TMPDIR:-/tmp}/edge-oci.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
# /var/lib comes with rootfs/, owned by root; state/edge-appliance (0700) is copied into it
# owned by the service user (COPY --chown would hand it the parents it creates, too).
mkdir -p "$root"/{opt,etc/ssl/certs,usr/bin,tmp,models,var/lib} "$ctx/state/edge-appliance"
chmod 1777 "$root/tmp"
chmod 0700 "$ctx/state/edge-appliance"

# --- the binary and the libraries it takes from this machine -------------------------------
cp -a "$dist" "$root/opt/edge-appliance"
internal=$(cd "$dist" && pwd)
is_elf() { [[ $(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ') == 177ELF ]]; }
libs=$(
  find "$internal" -type f | while read -r f; do
    is_elf "$f" || continue
    # The bootloader (the executable itself) starts with the system's libraries alone, then
    # puts _internal on the library path for the rest; so does this ldd.
    if [[ $f == "$internal/edge-appliance" ]]; then ldd "$f" 2>/dev/null || true
    else LD_LIBRARY_PATH=$internal/_internal ldd "$f" 2>/dev/null || true; fi
  done | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(0x/ {print $1}' |
    grep -v "^$internal/" | sort -u
)
# dlopen()ed by glibc, so no ldd shows them: libgcc_s (pthread_cancel, unwinding).
gcc_s=$(ldconfig -p 2>/dev/null | awk -v m="$(uname -m)" '
  $1 == "libgcc_s.so.1" && (m != "x86_64" || /x86-64/) {print $NF; exit}' || true)
[[ -n $gcc_s ]] && libs=$(printf '%s\n%s\n' "$libs" "$gcc_s" | sort -u)
[[ -n $libs ]] || skip "ldd found no system library for $dist (not a dynamic build?)"
for lib in $libs; do
  # Merged /usr, as on Debian 12: /lib* are links to /usr/lib*.
  dest=$lib
  [[ $dest == /lib* ]] && dest=/usr$dest
  mkdir -p "$root$(dirname "$dest")"
  cp -L "$lib" "$root$dest"
done
for d in "$root"/usr/lib*; do ln -s "usr/$(basename "$d")" "$root/$(basename "$d")"; done

# --- the system files ----------------------------------------------------------------------
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nedge:x:%s:%s:edge-appliance:/var/lib/edge-appliance:/usr/sbin/nologin\n' \
  "$uid" "$uid" >"$root/etc/passwd"
printf 'root:x:0:\nedge:x:%s:\n' "$uid" >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
: >"$root/etc/hosts"
: >"$root/etc/resolv.conf"
bundle=/etc/ssl/certs/ca-certificates.crt
if [[ -f $bundle ]]; then cp -L "$bundle" "$root$bundle"; else echo "note: no $bundle here: S3 over TLS needs one mounted"; fi

# A static busybox for the HEALTHCHECK (its wget): this machine's, or Debian's package.
busybox=$(command -v busybox || true)
if [[ -z $busybox ]] || ldd "$busybox" >/dev/null 2>&1; then
  busybox=""
  if command -v apt-get >/dev/null && (cd "$ctx" && apt-get download -qq busybox-static >/dev/null 2>&1); then
    dpkg-deb -x "$ctx"/busybox-static_*.deb "$ctx/busybox-static"
    busybox=$ctx/busybox-static/bin/busybox
    rm -f "$ctx"/busybox-static_*.deb
  fi
fi
[[ -n $busybox && -x $busybox ]] ||
  skip "no static busybox for the health check (Debian: apt-get download busybox-static)"
install -m 0755 "$busybox" "$root/usr/bin/busybox"

# --- build ---------------------------------------------------------------------------------
cp build/oci/Containerfile "$ctx/Containerfile"
version=$(sed -n 's/^version = "\(.*\)"/\1/p;T;q' pyproject.toml)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit="$commit-dirty"
# awk reads all of it: with `head -1`, ldd could die of SIGPIPE and pipefail end the script.
glibc=$(ldd --version 2>/dev/null | awk 'NR == 1 {print $NF}')
# CI builds under one tag, so that its runs on a kept machine replace one image, not pile up.
((ci)) && tag=${tag:-localhost/edge-appliance:ci}
tag=${tag:-localhost/edge-appliance:$version-$commit}
args=(--format docker --layers=false -f "$ctx/Containerfile" -t "$tag"
  --build-arg "VERSION=$version" --build-arg "REVISION=$commit" --build-arg "GLIBC=$glibc"
  --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)")
[[ $tag == localhost/edge-appliance:$version-* ]] && args+=(-t localhost/edge-appliance:latest)
if [[ $tool == podman ]]; then build=(podman build); else build=(buildah bud); fi
log=$ctx/build.log
if ! "${build[@]}" "${args[@]}" "$ctx" >"$log" 2>&1; then
  cat "$log" >&2
  ((ci)) && { echo "FAIL  OCI image build (output above)"; exit 1; }
  exit 1
fi
# The image this tag named before, now untagged: gone (the label keeps other images safe).
"$tool" image prune -f --filter label=org.opencontainers.image.title=edge-appliance >/dev/null 2>&1 || true
if [[ -n $save ]]; then
  rm -f "$save"
  if [[ $tool == podman ]]; then podman save -q --format docker-archive -o "$save" "$tag"
  else buildah push -q "$tag" "docker-archive:$save:$tag"; fi
fi
size=$("$tool" image inspect --format '{{.Size}}' "$tag" 2>/dev/null || echo 0)
printf 'built %s with %s in %s s: %s MiB, %s system libraries from this machine (glibc %s)\n' \
  "$tag" "$tool" "$SECONDS" "$((size / 1048576))" \
  "$(wc -w <<<"$libs")" "$glibc"
[[ -n $save ]] && echo "saved $save ($(du -h "$save" | cut -f1))"
exit 0

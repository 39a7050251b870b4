#!/usr/bin/env bash
# Install the built server as a systemd service (idempotent: run it again to upgrade).
#
#   systemd/install.sh [--root DIR] [--dist DIR] [--models DIR] [--jetson] [--enable]
#
#   --root DIR    install under DIR instead of / (a chroot or image; also $DESTDIR)
#   --dist DIR    the onedir build to install (default: dist/edge-appliance, from build/build.sh)
#   --models DIR  also copy a model repository to /var/lib/edge-appliance-models (replacing it)
#   --jetson      also install the Jetson drop-in (GPU devices, group video)
#   --enable      enable the unit (start at boot); `systemctl start edge-appliance` starts it now
#
# Installs:
#   /opt/edge-appliance/                          the onedir build (replaced as a whole)
#   /usr/local/bin/edge-appliance                 -> /opt/edge-appliance/edge-appliance
#   /etc/systemd/system/edge-appliance.service    the unit (replaced)
#   /etc/systemd/system/edge-appliance.service.d/jetson.conf   with --jetson
#   /etc/edge-appliance/edge-appliance.env        settings, from the example, only if absent (0600),
#                                                 with a random key for the repository API
# then, installing into the running system: `systemctl daemon-reload`, and a restart of the
# service if it runs (it would otherwise start Python model processes from the new build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
root=${DESTDIR:-/}
dist=$repo/dist/edge-appliance
models=""
jetson=0
enable=0
usage() { sed -n '2,11s/^# \{0,1\}//p' "$0" >&2; exit 2; }
while (($#)); do
  case $1 in
    --root) root=${2:?--root needs a folder}; shift 2 ;;
    --root=*) root=${1#*=}; shift ;;
    --dist) dist=${2:?--dist needs a folder}; shift 2 ;;
    --dist=*) dist=${1#*=}; shift ;;
    --models) models=${2:?--models needs a folder}; shift 2 ;;
    --models=*) models=${1#*=}; shift ;;
    --jetson) jetson=1; shift ;;
    --enable) enable=1; shift ;;
    -h|--help) usage ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
root=${root%/}
[[ -x $dist/edge-appliance && -d $dist/_internal ]] || {
  echo "install.sh: no onedir build at $dist (run build/build.sh first)" >&2; exit 1; }
[[ -z $models || -d $models ]] || { echo "install.sh: no folder $models" >&2; exit 1; }

# Replace a folder as a whole: copy beside it, then swap, so that a failed copy leaves the old
# one in place. Readable by everyone (the service runs as a dynamic user), writable by none.
replace_dir() {  # SOURCE TARGET
  local source=$1 target=$2
  rm -rf "$target.new" "$target.old"
  mkdir -p "$(dirname "$target")"
  cp -R "$source" "$target.new"
  chmod -R u+rwX,go+rX,go-w "$target.new"
  [[ $(id -u) != 0 ]] || chown -R 0:0 "$target.new"
  [[ ! -e $target ]] || mv "$target" "$target.old"
  mv "$target.new" "$target"
  rm -rf "$target.old"
}

umask 022
replace_dir "$dist" "$root/opt/edge-appliance"
install -m 0644 "$repo/README.md" "$root/opt/edge-appliance/README.md"
mkdir -p "$root/usr/local/bin"
ln -sfn /opt/edge-appliance/edge-appliance "$root/usr/local/bin/edge-appliance"

install -D -m 0644 "$here/edge-appliance.service" "$root/etc/systemd/system/edge-appliance.service"
if ((jetson)); then
  install -D -m 0644 "$here/jetson.conf" "$root/etc/systemd/system/edge-appliance.service.d/jetson.conf"
fi
mkdir -p "$root/etc/edge-appliance"
if [[ ! -e $root/etc/edge-appliance/edge-appliance.env ]]; then
  install -m 0600 "$here/edge-appliance.env.example" "$root/etc/edge-appliance/edge-appliance.env"
  # The repository API's key (admin-key): random, one per device; root reads it from the file.
  key=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
  sed -i "s/^\(EDGE_APPLIANCE_[A-Z_]*_RESTRICTED_[A-Z]*=model-repository:admin-key=\)\$/\1$key/" \
    "$root/etc/edge-appliance/edge-appliance.env"
  echo "installed $root/etc/edge-appliance/edge-appliance.env: edit it (model repository, flags, credentials);"
  echo "the repository API needs its admin-key header, whose value is in that file"
fi
[[ -z $models ]] || replace_dir "$models" "$root/var/lib/edge-appliance-models"

if [[ -z $root ]]; then  # the running system
  if [[ -d /run/systemd/system ]]; then
    systemctl daemon-reload
    ((enable)) && systemctl enable edge-appliance.service
    # A running server would spawn Python model processes from the new build: restart it.
    if systemctl is-active --quiet edge-appliance.service; then
      echo "restarting edge-appliance.service on the new build"
      systemctl try-restart edge-appliance.service
    fi
  elif ((enable)); then
    systemctl enable edge-appliance.service
  fi
  echo "installed; start with: systemctl start edge-appliance"
else
  ((enable)) && systemctl --root="$root" enable edge-appliance.service
  echo "installed under $root"
fi
exit 0

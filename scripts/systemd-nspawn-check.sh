#!/usr/bin/env bash
# Run edge-appliance.service for real: boot a Debian 12 container with systemd, install the built
# binary, the unit and the example repository with systemd/install.sh, and check that the unit
# starts through sd_notify, serves, runs sandboxed as a dynamic user, is restarted by the watchdog
# when hung, and stops cleanly. Prints PASS / FAIL lines; exits 1 if any check failed.
#
#   scripts/systemd-nspawn-check.sh          (as root; results: docs/systemd.md)
#   scripts/systemd-nspawn-check.sh --ci     (.ci/run: where this machine cannot run it, say
#                                             why on a SKIP line and exit 0)
#
# Needs: root, debootstrap and systemd-container (installed with apt-get when missing), the
# onedir build (dist/edge-appliance; built with build/build.sh when missing), network access to
# Debian's archive the first time (the container root is cached in $EDGE_NSPAWN_ROOT, default
# /var/tmp/edge-nspawn-root; delete it to rebuild). The container shares the host's network:
# the server listens on 127.0.0.1 ports $EDGE_NSPAWN_PORT (18500) to +2.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
root=${EDGE_NSPAWN_ROOT:-/var/tmp/edge-nspawn-root}
dist=${EDGE_NSPAWN_DIST:-$repo/dist/edge-appliance}
port=${EDGE_NSPAWN_PORT:-18500}
url=http://127.0.0.1:$port
unit=edge-appliance.service
watchdog_s=5  # the test drop-in's WatchdogSec
# System calls the unit refuses (in @resources) that the server is known to make and to carry on
# without: the check's kill-mode drop-in (part 3) keeps EPERM for these alone.
#   mbind              OpenBLAS (numpy): a NUMA hint on its buffers
#   sched_setaffinity  ONNX Runtime 1.32: pins threads to cores on some machines (its CPU probe
#                      and default thread pools); refused, its threads run unpinned
harmless=(mbind sched_setaffinity)
ci=0
[[ ${1:-} == --ci ]] && ci=1

skip() {  # where the machine cannot run the check: fatal by hand, a SKIP line in CI
  if ((ci)); then echo "SKIP  systemd-nspawn check not run: $*"; exit 0; fi
  echo "$*" >&2; exit 2
}
[[ $(id -u) == 0 ]] || skip "needs root (debootstrap, systemd-nspawn, nsenter)"

failures=0
trap 'echo "FAIL  unexpected error, line $LINENO: $BASH_COMMAND"' ERR
pass() { printf 'PASS  %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*"; failures=$((failures + 1)); }
check() {  # check DESCRIPTION COMMAND...: PASS when the command succeeds
  local what=$1; shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}
note() { printf '      %s\n' "$*"; }
now() { date +%s.%N; }
since() { printf '%.1f' "$(echo "$(now) - $1" | bc)"; }

# --- prerequisites -------------------------------------------------------------------------
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v bc >/dev/null || missing+=(bc)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || skip "missing ${missing[*]} and no apt-get to install them"
  echo "installing ${missing[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
    skip "cannot install ${missing[*]} with apt-get"
fi
if [[ ! -x $dist/edge-appliance ]]; then
  echo "no build at $dist: running build/build.sh"
  build/build.sh
fi
if [[ ! -d configs/models ]]; then
  .venv/bin/python -c "import onnx" 2>/dev/null || .venv/bin/python -m pip install -q "onnx>=1.15"
  .venv/bin/python -m configs.generate configs/models
fi
if [[ ! -x $root/usr/lib/systemd/systemd ]]; then
  echo "building the Debian 12 container root in $root (once, about 2 minutes)"
  rm -rf "$root.tmp"
  if ! debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,procps \
    bookworm "$root.tmp" http://deb.debian.org/debian >/tmp/edge-debootstrap.log 2>&1; then
    rm -rf "$root.tmp"
    skip "debootstrap could not build the container root: $(tail -1 /tmp/edge-debootstrap.log)"
  fi
  rm -rf "$root" && mv "$root.tmp" "$root"
fi

# --- install into the container root ------------------------------------------------------
# What earlier runs left: the state directory (its creation is checked) and test drop-ins.
rm -rf "$root/var/lib/private/edge-appliance" "$root/var/lib/edge-appliance" \
  "$root/etc/systemd/system/$unit.d" "$root/etc/edge-appliance/edge-appliance.env"
systemd/install.sh --root "$root" --dist "$dist" --models configs/models >/dev/null
# The installed example settings, on test ports.
sed -i "s|^EDGE_APPLIANCE_ARGS=.*|EDGE_APPLIANCE_ARGS=--http-port $port --grpc-port $((port + 1)) --metrics-port $((port + 2))|" \
  "$root/etc/edge-appliance/edge-appliance.env"
# The repository API's key, which install.sh wrote into the settings.
admin_key=$(sed -n 's/^EDGE_APPLIANCE_HTTP_RESTRICTED_API=model-repository:admin-key=//p' \
  "$root/etc/edge-appliance/edge-appliance.env")

# --- boot ------------------------------------------------------------------------------------
log=$(mktemp /tmp/edge-nspawn.XXXXXX.log)
# --register=no and --keep-unit: this host's PID 1 may not be systemd (no machined, no scopes).
systemd-nspawn -D "$root" --register=no --keep-unit --boot --console=passive >"$log" 2>&1 &
nspawn=$!
init=""
journal_file=/tmp/edge-nspawn-journal.txt
poweroff() {
  if [[ -n $init ]] && kill -0 "$nspawn" 2>/dev/null; then
    nsenter -t "$init" -a journalctl -b --no-pager -o short-monotonic >"$journal_file" 2>&1 || true
    echo "the container's journal: $journal_file"
    nsenter -t "$init" -a systemctl poweroff >/dev/null 2>&1 || true
    for _ in $(seq 100); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.1; done
  fi
  if kill -0 "$nspawn" 2>/dev/null; then kill "$nspawn"; sleep 1; fi
  kill -0 "$nspawn" 2>/dev/null && kill -9 "$nspawn"
  wait "$nspawn" 2>/dev/null || true
}
trap poweroff EXIT
t0=$(now)
for _ in $(seq 300); do  # the container's init: nspawn's child that is PID 1 inside
  for child in $(pgrep -P "$nspawn" || true); do
    if grep -qE '^NSpid:.*\s1$' "/proc/$child/status" 2>/dev/null; then init=$child; fi
  done
  [[ -n $init ]] && break
  sleep 0.1
done
[[ -n $init ]] || { cat "$log"; skip "systemd-nspawn cannot boot a container here (its output above)"; }
ct() { nsenter -t "$init" -a "$@"; }  # run a command in the container
for _ in $(seq 600); do  # systemd answers once it runs as PID 1 and its socket is up
  case $(ct systemctl is-system-running 2>/dev/null || true) in
    initializing|starting|running|degraded) break ;;
  esac
  sleep 0.1
done
booted=$(ct timeout 120 systemctl is-system-running --wait || true)
note "container booted in $(since "$t0") s: $booted (systemd $(ct systemctl --version | awk 'NR==1{print $2}'))"
prop() { ct systemctl show -P "$1" "$unit"; }  # prop NAME: one property of the unit
version=$(ct /usr/local/bin/edge-appliance version 2>&1 | head -1 || true)
check "/usr/local/bin/edge-appliance runs the installed build: $version" grep -q '^edge-appliance ' <<<"$version"

# --- 1. start through sd_notify -------------------------------------------------------------
t0=$(now)
if ct timeout 300 systemctl start "$unit"; then start_rc=0; else start_rc=$?; fi
start_s=$(since "$t0")
# Asked at once, without polling: `systemctl start` of a Type=notify unit returns on READY=1.
ready_code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready" || true)
state="$(prop ActiveState)/$(prop SubState)"
status=$(prop StatusText)
check "systemctl start returned 0 after ${start_s} s (Type=notify: on READY=1)" test "$start_rc" = 0
check "unit active/running after start (got $state)" test "$state" = active/running
check "STATUS= from the server: '$status'" grep -q '^serving ' <<<"$status"
check "HTTP ready answered 200 right after start returned (got $ready_code)" test "$ready_code" = 200
loaded_us=$(($(prop ActiveEnterTimestampMonotonic) - $(prop ExecMainStartTimestampMonotonic)))
note "from exec to READY: $((loaded_us / 1000)) ms"
order=$(ct journalctl -b -u "$unit" --no-pager -o cat |
  grep -E "is READY$|server is ready|^Started $unit" | sed -E 's/.*(model .*) is READY/\1/; s/(server is ready).*/\1/; s/ - .*//' | tr '\n' ',')
check "journal order: every model READY, then 'server is ready', then systemd's 'Started'" \
  grep -qE "^(model '[^']+' version [0-9]+,)+appliance.server.app: server is ready,Started $unit,\$" <<<"$order"
body='{"inputs": [
  {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},
  {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'
answer=$(curl -s -X POST "$url/v2/models/simple/infer" -d "$body" || true)
sums=$(python3 -c 'import json,sys; o={x["name"]: x["data"] for x in json.load(sys.stdin)["outputs"]}; print(o["OUTPUT0"])' <<<"$answer" 2>/dev/null || echo "$answer")
check "inference on 'simple': OUTPUT0 = INPUT0 + INPUT1 (got $sums)" \
  test "$sums" = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]"
image=$(mktemp /tmp/edge-nspawn-image.XXXXXX.json)
python3 -c 'import json; print(json.dumps({"inputs": [{"name": "IMAGE", "datatype": "UINT8",
  "shape": [224, 224, 3], "data": [i % 256 for i in range(224 * 224 * 3)]}]}))' >"$image"
scores=$(curl -s -X POST "$url/v2/models/densenet_preprocess/infer" --data-binary "@$image" |
  python3 -c 'import json,sys; print(len(json.load(sys.stdin)["outputs"][0]["data"]))' 2>&1 || true)
rm -f "$image"
check "Python model (own process, shared memory, BLS to densenet_onnx): $scores scores" \
  test "$scores" = 1000
index_code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url/v2/repository/index" || true)
check "the repository API is restricted by the installed settings: 403 without its key (got $index_code)" \
  test "$index_code" = 403
index=$(curl -s -X POST -H "admin-key: $admin_key" "$url/v2/repository/index" || true)
not_ready=$(python3 -c 'import json,sys; print(" ".join(m["name"] for m in json.load(sys.stdin) if m.get("state") != "READY"))' <<<"$index" 2>/dev/null || echo "?")
check "every example model READY under the sandbox (not ready: '${not_ready:-none}')" test -z "$not_ready"

# --- 2. who and where it runs ---------------------------------------------------------------
pid=$(prop MainPID)
pstatus=$(ct cat "/proc/$pid/status")
uid=$(awk '/^Uid:/{print $2}' <<<"$pstatus")
check "DynamicUser: main process uid $uid is in systemd's dynamic range 61184-65519" \
  test "$uid" -ge 61184 -a "$uid" -le 65519
check "DynamicUser: the unit's UID property matches ($(prop UID))" test "$(prop UID)" = "$uid"
user=$(ct ps -o user= -p "$pid" | tr -d ' ')
note "ps shows the process user as '$user'"
state_dir=$(ct stat -L -c '%u %a' /var/lib/edge-appliance 2>/dev/null || echo missing)
check "StateDirectory: /var/lib/edge-appliance owned by uid $uid, mode 700 (got '$state_dir')" \
  test "$state_dir" = "$uid 700"
check "StateDirectory: /var/lib/edge-appliance -> private/edge-appliance ($(ct readlink /var/lib/edge-appliance))" \
  test "$(ct readlink /var/lib/edge-appliance)" = private/edge-appliance
environ=$(ct cat "/proc/$pid/environ" | tr '\0' '\n')
check "STATE_DIRECTORY=/var/lib/edge-appliance in the server's environment" \
  grep -qx 'STATE_DIRECTORY=/var/lib/edge-appliance' <<<"$environ"
check "NOTIFY_SOCKET and WATCHDOG_USEC=30000000 (WatchdogSec=30s) in the environment" \
  grep -qx 'WATCHDOG_USEC=30000000' <<<"$environ"
# The service's own mount namespace, entered as root: read-only mounts refuse even root.
svc() { ct nsenter -t "$pid" -m "$@"; }
host_pid() {  # the host's pid of the container's process $1
  local ns p
  ns=$(readlink "/proc/$init/ns/pid")
  for p in /proc/[0-9]*; do
    if [[ $(readlink "$p/ns/pid" 2>/dev/null) == "$ns" ]] &&
      grep -qE "^NSpid:\s+[0-9]+\s+$1\$" "$p/status" 2>/dev/null; then
      echo "${p#/proc/}"; return
    fi
  done
}
hostpid=$(host_pid "$pid")
ro_usr=$(svc sh -c 'touch /usr/edge-probe 2>&1' || true)
ro_etc=$(svc sh -c 'touch /etc/edge-probe 2>&1' || true)
check "ProtectSystem=strict: /usr not writable ($ro_usr)" grep -q 'Read-only file system' <<<"$ro_usr"
check "ProtectSystem=strict: /etc not writable ($ro_etc)" grep -q 'Read-only file system' <<<"$ro_etc"
check "the state directory stays writable in the service's namespace" \
  svc sh -c 'touch /var/lib/edge-appliance/.probe && rm /var/lib/edge-appliance/.probe'
home_ct=$(ct ls -A /root | tr '\n' ' ')
home_svc=$(svc ls -A /root 2>&1 | tr '\n' ' ')
check "ProtectHome=yes: /root holds '$home_ct' in the container, '$home_svc' in the service" \
  test -n "$home_ct" -a -z "$home_svc"
check "PrivateTmp=yes: the service's /tmp is not the container's" \
  test "$(svc stat -c %i /tmp)" != "$(ct stat -c %i /tmp)"
note "service's /dev: $(svc ls /dev | tr '\n' ' ')"
check "NoNewPrivileges, seccomp filter, no capabilities ($(grep -E '^(NoNewPrivs|Seccomp|CapEff):' <<<"$pstatus" | tr -s '\t\n' '  '))" \
  bash -c "grep -qE '^NoNewPrivs:\s+1' <<<\"$pstatus\" && grep -qE '^Seccomp:\s+2' <<<\"$pstatus\" && grep -qE '^CapEff:\s+0+$' <<<\"$pstatus\""
note "main process: container pid $pid, host pid $hostpid, user $user"

# --- 3. the watchdog restarts a hung server -------------------------------------------------
mkdir -p "$root/etc/systemd/system/$unit.d"
# Also from here on: a system call outside the filter kills the server instead of failing
# with EPERM, so that a call the filter lacks cannot pass unnoticed in the checks below. The
# calls known to be harmless when refused ($harmless, above) keep EPERM.
printf '[Service]\nWatchdogSec=%ss\nSystemCallErrorNumber=kill\nSystemCallFilter=~%s\n' \
  "$watchdog_s" "$(printf '%s:EPERM ' "${harmless[@]}")" >"$root/etc/systemd/system/$unit.d/test.conf"
# The same unit and drop-in around a command that calls sched_setaffinity (taskset): refused
# with EPERM (taskset exits 1), not killed with SIGSYS (status 31), whether or not ONNX Runtime
# makes the call on this machine.
probe=edge-seccomp-probe.service
sed -e 's|^ExecStart=.*|ExecStart=/usr/bin/taskset -c 0 /bin/true|' -e 's|^Type=notify|Type=oneshot|' \
  -e '/^WatchdogSec=/d' -e '/^NotifyAccess=/d' -e '/^Restart=/d' \
  "$root/etc/systemd/system/$unit" >"$root/etc/systemd/system/$probe"
mkdir -p "$root/etc/systemd/system/$probe.d"
grep -v '^WatchdogSec=' "$root/etc/systemd/system/$unit.d/test.conf" >"$root/etc/systemd/system/$probe.d/test.conf"
ct systemctl daemon-reload
ct systemctl start "$probe" >/dev/null 2>&1 || true
probed="$(ct systemctl show -P ExecMainCode "$probe")/$(ct systemctl show -P ExecMainStatus "$probe")"
said=$(ct journalctl -b -u "$probe" --no-pager -o cat | grep -m1 'taskset:' || true)
check "sched_setaffinity under the unit's filter and the kill drop-in: EPERM, not SIGSYS (exit code/status $probed: 1/1 = exited 1; ${said:-no output})" \
  test "$probed" = 1/1
rm -rf "$root/etc/systemd/system/$probe" "$root/etc/systemd/system/$probe.d"
ct systemctl reset-failed "$probe" 2>/dev/null || true
ct systemctl daemon-reload
ct timeout 300 systemctl restart "$unit"
old=$(prop MainPID)
old_children=$(ct pgrep -P "$old" | tr '\n' ' ')
restarts=$(prop NRestarts)
check "restarted with WatchdogSec=${watchdog_s}s and SystemCallErrorNumber=kill: active" \
  test "$(prop ActiveState)" = active
answer=$(curl -s -X POST "$url/v2/models/simple/infer" -d "$body" || true)
check "inference still works with a denied system call killing the server" \
  grep -q '"OUTPUT0"' <<<"$answer"
sleep $((watchdog_s * 2))  # pings keep a healthy server alive past two intervals
check "a healthy server survives $((watchdog_s * 2)) s with WatchdogSec=${watchdog_s}s (pid $old)" \
  test "$(prop MainPID)" = "$old"
ct kill -STOP "$old"
t0=$(now)
new=$old
for _ in $(seq 600); do  # up to 60 s: watchdog, SIGABRT, RestartSec=5s, start
  new=$(prop MainPID)
  [[ $new != "$old" && $new != 0 && $(prop ActiveState) == active ]] && break
  sleep 0.1
done
restart_s=$(since "$t0")
check "SIGSTOPped server replaced by a new one in ${restart_s} s (pid $old -> $new)" \
  test "$new" != "$old" -a "$new" != 0 -a "$(prop ActiveState)" = active
check "NRestarts went from $restarts to $(prop NRestarts)" test "$(prop NRestarts)" -gt "$restarts"
journal=$(ct journalctl -b -u "$unit" --no-pager -o cat)
check "journal: '$(grep -m1 'Watchdog timeout' <<<"$journal")'" grep -q 'Watchdog timeout' <<<"$journal"
note "journal: $(grep -A25 'Watchdog timeout' <<<"$journal" | grep -E 'Main process exited|Failed with result|Scheduled restart' | tr '\n' ' ' || true)"
left=""
for child in $old_children; do ct kill -0 "$child" 2>/dev/null && left+="$child "; done
check "no process of the hung server survived (its children: ${old_children:-none})" test -z "$left"
check "HTTP ready again after the restart" \
  test "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready")" = 200

# --- 4. the Jetson drop-in on a machine without its devices ---------------------------------
install -m 0644 systemd/jetson.conf "$root/etc/systemd/system/$unit.d/jetson.conf"
before=$(ct journalctl -b -u "$unit" --no-pager -o cat | wc -l)
ct systemctl daemon-reload
ct timeout 300 systemctl restart "$unit" && jetson_rc=0 || jetson_rc=$?
jetson_code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready" || true)
check "with systemd/jetson.conf (no GPU devices here): starts (rc $jetson_rc), ready $jetson_code" \
  test "$jetson_rc" = 0 -a "$jetson_code" = 200
jetson_log=$(ct journalctl -b -u "$unit" --no-pager -o cat | tail -n +$((before + 1)))
note "its start in the journal, lines from systemd about devices: $(grep -i 'device\|/dev/' <<<"$jetson_log" | head -3 | tr '\n' ' ' || true)"
rm "$root/etc/systemd/system/$unit.d/jetson.conf"
ct systemctl daemon-reload

# --- 5. stop on SIGTERM ---------------------------------------------------------------------
# An inactive unit is unloaded at once (its Result and ExecMain* read as defaults then), so the
# exit status comes from systemd's debug log.
pid=$(prop MainPID)
children=$(ct ps -o pid=,args= --ppid "$pid" | sed -E 's/^ *([0-9]+) .*(resource_tracker|multiprocessing-fork).*/\1 \2/' | tr '\n' ';')
before=$(ct journalctl -b -u "$unit" --no-pager -o cat | wc -l)
ct systemctl log-level debug
t0=$(now)
ct timeout 120 systemctl stop "$unit" && stop_rc=0 || stop_rc=$?
stop_s=$(since "$t0")
ct systemctl log-level info
stop_log=$(ct journalctl -b -u "$unit" --no-pager -o cat | tail -n +$((before + 1)))
exited=$(grep -m1 'Main process exited' <<<"$stop_log" || echo "no exit line")
check "systemctl stop returned 0 in ${stop_s} s: $exited" \
  bash -c "test $stop_rc = 0 && grep -q 'code=exited, status=0/SUCCESS' <<<\"$exited\""
check "stopped cleanly: '$(grep -m1 -E 'Deactivated successfully|Failed with result' <<<"$stop_log" || true)'" \
  grep -q 'Deactivated successfully' <<<"$stop_log"
check "inactive after stop ($(prop ActiveState))" test "$(prop ActiveState)" = inactive
note "server's children before the stop (pid kind): ${children:-none}"
note "then: $(grep -E 'with signal SIGKILL' <<<"$stop_log" | tr '\n' ' ' || true)"

echo
if ((failures)); then
  # A server killed by the filter (SystemCallErrorNumber=kill) dies with SIGSYS; the kernel logs
  # which call (audit type=1326, syscall=N: see ausyscall N or the kernel's unistd_64.h).
  denied=$(dmesg 2>/dev/null | grep 'type=1326' | tail -5 || true)
  [[ -n $denied ]] && printf 'system calls the filter killed (kernel log):\n%s\n' "$denied"
  echo "$failures check(s) FAILED"
  exit 1
fi
echo "all checks passed"

#!/usr/bin/env bash
# A test bed of several hosts on this one machine, for ddl's multi-host tests and benchmarks.
#
#   bash scripts/testbed.sh start [N]        # N hosts (default 2): ddlhost1..ddlhostN; idempotent
#   bash scripts/testbed.sh stop             # kills everything inside, removes every trace
#   bash scripts/testbed.sh exec HOST CMD... # runs CMD on HOST (its network, host name and mounts)
#   bash scripts/testbed.sh status           # exit 0 when the bed is up
#   bash scripts/testbed.sh hosts            # the host names, one per line
#   bash scripts/testbed.sh dir              # the state directory (shared by all hosts, like a cluster's shared file system)
#
# Each host is a set of namespaces held open by one `sleep`: its own network (a veth on a private
# bridge, address 198.18.0.1x/24 from the range set aside for benchmark networks), its own host
# name (UTS), and its own mounts: fresh tmpfs on /dev/shm, /tmp and /run (this checkout and
# $DDL_TESTBED_KEEP stay visible when they live there), /etc/hosts naming every
# host of the bed, /etc/ssh/ssh_config pointing ssh at the bed's key and known hosts. Each runs its
# own sshd (Debian's openssh-server) that takes the bed's key for root. The bridge lives in a
# namespace of its own, so the machine's own network, /etc, /root and /run are never touched;
# nothing of the bed is reachable from outside it. Needs root.
set -euo pipefail

DIR=$(realpath -m "${DDL_TESTBED_DIR:-/var/tmp/ddl-testbed}")
REPO=$(realpath "$(dirname "$0")/..")
NET=198.18.0
PREFIX=ddlhost
MARKER=.made-by-testbed.sh

say() { echo "testbed: $*" >&2; }
die() {
  echo "testbed: error: $*" >&2
  exit 1
}

host_names() { cat "$DIR/hosts.list" 2>/dev/null; }
anchor_pid() { cat "$DIR/$1/pid" 2>/dev/null; }

running() {
  local pid
  pid=$(anchor_pid "$1") && [ -n "$pid" ] && [ -e "/proc/$pid/ns/net" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ]
}

# Runs a command inside a host's namespaces, in the caller's working directory when it exists there.
in_host() {
  local host=$1
  shift
  running "$host" || die "host $host is not running (start the bed: bash scripts/testbed.sh start)"
  nsenter -t "$(anchor_pid "$host")" -n -u -m --wd="$PWD" -- "$@"
}

# Starts a process that holds a fresh set of namespaces open; `setup` runs inside first.
start_anchor() {
  local name=$1 setup=$2 flags=$3
  mkdir -p "$DIR/$name"
  rm -f "$DIR/$name/pid"
  # shellcheck disable=SC2086
  setsid unshare $flags --fork -- bash -c "$setup"$'\n''echo $$ >'"'$DIR/$name/pid'"$'\n''exec sleep infinity' \
    </dev/null >"$DIR/$name/anchor.log" 2>&1 &
  for _ in $(seq 600); do # 30 s: unshare and the setup are slow on a loaded machine
    [ -s "$DIR/$name/pid" ] && return 0
    sleep 0.05
  done
  die "namespace holder for $name did not start: $(cat "$DIR/$name/anchor.log")"
}

write_configs() {
  local n=$1 i
  mkdir -p "$DIR/ssh"
  touch "$DIR/$MARKER"
  [ -f "$DIR/ssh/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C ddl-testbed -f "$DIR/ssh/id_ed25519"
  [ -f "$DIR/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C ddl-testbed-host -f "$DIR/ssh/host_ed25519"
  cp "$DIR/ssh/id_ed25519.pub" "$DIR/ssh/authorized_keys"
  : >"$DIR/hosts.list"
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
  } >"$DIR/etc_hosts"
  : >"$DIR/ssh/known_hosts"
  for i in $(seq "$n"); do
    echo "$PREFIX$i" >>"$DIR/hosts.list"
    echo "$NET.1$i $PREFIX$i" >>"$DIR/etc_hosts"
    echo "$PREFIX$i,$NET.1$i $(cut -d' ' -f1-2 "$DIR/ssh/host_ed25519.pub")" >>"$DIR/ssh/known_hosts"
  done
  cat >"$DIR/ssh/ssh_config" <<EOF
# Written by scripts/testbed.sh: ssh inside the test bed reaches its hosts with the bed's own key.
Host *
  IdentityFile $DIR/ssh/id_ed25519
  UserKnownHostsFile $DIR/ssh/known_hosts
  GlobalKnownHostsFile $DIR/ssh/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
EOF
  cat >"$DIR/ssh/sshd_config" <<EOF
# Written by scripts/testbed.sh: one sshd per host of the bed, root by key only.
HostKey $DIR/ssh/host_ed25519
AuthorizedKeysFile $DIR/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
MaxStartups 200
MaxSessions 200
LogLevel ERROR
EOF
  chmod 600 "$DIR/ssh/id_ed25519" "$DIR/ssh/host_ed25519"
}

# Paths the hosts must still see although they live under a directory each host gets fresh (a
# checkout in /tmp, as a CI clone may be): this repository and $DDL_TESTBED_KEEP (colon-separated).
kept_paths() {
  local p
  for p in "$REPO" ${DDL_TESTBED_KEEP:+${DDL_TESTBED_KEEP//:/ }}; do
    p=$(realpath -m "$p")
    case $p in /tmp/* | /run/* | /dev/shm/*) echo "$p" ;; esac
  done
}

# Shell lines that set a host's private /dev/shm, /tmp and /run, with the kept paths bound back in.
private_dirs_setup() {
  local host=$1 n=0 p
  echo "mkdir -p '$DIR/$host/keep'"
  for p in $(kept_paths); do
    echo "mkdir -p '$DIR/$host/keep/$n' && mount --bind '$p' '$DIR/$host/keep/$n'"
    n=$((n + 1))
  done
  echo 'for d in /dev/shm /tmp /run; do mount -t tmpfs -o mode=1777 tmpfs $d; done'
  n=0
  for p in $(kept_paths); do
    echo "mkdir -p '$p' && mount --bind '$DIR/$host/keep/$n' '$p' && umount '$DIR/$host/keep/$n'"
    n=$((n + 1))
  done
}

start_host() {
  local i=$1 host=$PREFIX$1 pid
  local setup="set -e
mount --make-rprivate /
hostname $host
$(private_dirs_setup "$host")
mkdir -p /run/sshd
mount --bind '$DIR/etc_hosts' /etc/hosts
mount --bind '$DIR/ssh/ssh_config' /etc/ssh/ssh_config"
  start_anchor "$host" "$setup" "--net --uts --mount"
  pid=$(anchor_pid "$host")
  ip link add "ddltb$i" type veth peer name "ddltb${i}p"
  ip link set "ddltb$i" netns "$pid"
  ip link set "ddltb${i}p" netns "$(anchor_pid switch)"
  nsenter -t "$(anchor_pid switch)" -n -- ip link set "ddltb${i}p" master br0 up
  nsenter -t "$pid" -n -- bash -c "ip link set lo up && ip link set ddltb$i name eth0 && ip addr add $NET.1$i/24 dev eth0 && ip link set eth0 up"
  in_host "$host" /usr/sbin/sshd -f "$DIR/ssh/sshd_config" -o "ListenAddress=$NET.1$i" -o "PidFile=/run/sshd.pid"
}

wait_for_ssh() {
  local first last host
  first=$(host_names | head -1)
  for host in $(host_names); do
    for _ in $(seq 100); do
      in_host "$first" ssh "$host" true 2>/dev/null && continue 2
      sleep 0.1
    done
    die "ssh from $first to $host does not work: $(in_host "$first" ssh "$host" true 2>&1 | tail -1)"
  done
}

start() {
  local n=${1:-2} i
  [ "$(id -u)" -eq 0 ] || die "needs root (namespaces, veths, sshd)"
  [[ "$n" =~ ^[1-9]$ ]] || die "the host count must be 1 to 9, not '$n'"
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || die "sshd is missing: apt-get install openssh-server"
  if [ -f "$DIR/hosts.list" ] && [ "$(host_names | wc -l)" -eq "$n" ]; then
    local all=1
    for host in $(host_names); do running "$host" || all=0; done
    if ((all)) && running switch; then
      say "$n hosts already running"
      return 0
    fi
  fi
  stop >/dev/null 2>&1 || true
  write_configs "$n"
  start_anchor switch "true" "--net"
  nsenter -t "$(anchor_pid switch)" -n -- bash -c "ip link set lo up && ip link add br0 type bridge && ip link set br0 up"
  for i in $(seq "$n"); do start_host "$i"; done
  wait_for_ssh
  say "$n hosts up: $(host_names | tr '\n' ' ')(state in $DIR)"
}

# Kills every process in a holder's network namespace, the holder last.
kill_namespace() {
  local name=$1 pid ns p
  pid=$(anchor_pid "$name") || return 0
  [ -n "$pid" ] && [ -e "/proc/$pid/ns/net" ] || return 0
  ns=$(readlink "/proc/$pid/ns/net")
  [ "$ns" != "$(readlink /proc/self/ns/net)" ] || return 0
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$ns" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
  done
}

stop() {
  local name
  if [ -d "$DIR" ] && [ ! -f "$DIR/$MARKER" ] && [ -n "$(ls -A "$DIR")" ]; then
    die "$DIR was not made by this script; not touching it"
  fi
  for name in $(host_names) switch; do kill_namespace "$name"; done
  # veths that a failed start left behind in this namespace
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^ddltb' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  rm -rf "$DIR"
  say "stopped"
}

case "${1:-}" in
  start) start "${2:-2}" ;;
  stop) stop ;;
  exec)
    [ $# -ge 3 ] || die "usage: testbed.sh exec HOST CMD..."
    host=$2
    shift 2
    host_names | grep -qx "$host" || die "no host $host in the bed (hosts: $(host_names | tr '\n' ' '))"
    in_host "$host" "$@"
    ;;
  hosts) host_names ;;
  status)
    [ -f "$DIR/hosts.list" ] && running switch || exit 1
    for host in $(host_names); do running "$host" || exit 1; done
    ;;
  dir) echo "$DIR" ;;
  *) die "usage: testbed.sh start [N] | stop | status | exec HOST CMD... | hosts | dir" ;;
esac

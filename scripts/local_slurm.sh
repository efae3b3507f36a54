#!/usr/bin/env bash
# Starts and stops a real Slurm cluster for ddl's integration tests, with Debian's slurm-wlm
# (slurmctld + slurmd) and a private munged. Needs root (mknod, daemons as root). Two modes.
#
# One node on loopback (the default), for client commands run right here:
#
#   bash scripts/local_slurm.sh start   # idempotent; quick when the cluster is already up
#   bash scripts/local_slurm.sh stop    # cancels jobs, stops the daemons it started, removes the state
#   eval "$(bash scripts/local_slurm.sh env)"   # points sinfo/srun/sbatch/... at the cluster
#
# Everything lives in one state directory ($DDL_SLURM_DIR, default /tmp/ddl-slurm): configs, logs,
# pid files, spool dirs, the munge key and socket, and fake GPU devices. /etc is left untouched: the
# daemons get the config with -f, clients with SLURM_CONF, and slurm.conf's AuthInfo points every
# Slurm program at the private munge socket. Systemd is not needed: the daemons are started directly.
#
# One node per host of the test bed (scripts/testbed.sh; start the bed first, e.g. `testbed.sh start 2`):
#
#   bash scripts/local_slurm.sh start --testbed   # nodes ddlhost1, ddlhost2, ... at the hosts' addresses
#   bash scripts/local_slurm.sh stop --testbed    # the same cleanup; the bed and the one-node cluster stay
#   bash scripts/local_slurm.sh env --testbed     # export SLURM_CONF=...: for commands inside the bed, e.g.
#   SLURM_CONF=... bash scripts/testbed.sh exec ddlhost1 salloc -N 2 --gpus-per-node 4 srun hostname
#
# munged and slurmctld run inside the bed's first host, one slurmd inside each host (its network,
# host name and mounts), so client commands work from inside the bed only. The state directory
# ($DDL_SLURM_TESTBED_DIR, default `testbed.sh dir`/slurm, on the file system all hosts share) holds
# the one config, the munge socket (a file, reachable from every host) and, per node (Slurm's %n),
# its spool, pid file, log, TmpFS (where Slurm's PMIx plugin keeps its files) and its own 4 fake
# GPUs. Its lock is on the bed's directory (flock), so a stop leaves nothing behind; a stop of the
# bed ends this cluster too (its daemons live in the bed's namespaces, its state in the bed's directory).
#
# A node imitates a Perlmutter GPU node (1 socket x 64 cores x 2 threads, 4 GPUs, feature "gpu");
# SlurmdParameters=config_overrides lets slurmd claim that on a 2-core machine, and the GPUs are
# character devices (/dev/null's numbers) named in gres.conf, so Slurm sets CUDA_VISIBLE_DEVICES.
set -euo pipefail

say() { echo "local_slurm: $*"; }
die() {
  echo "local_slurm: error: $*" >&2
  exit 1
}

COMMAND="" TESTBED=0
for arg in "$@"; do
  case $arg in
    start | stop | env) if [ -z "$COMMAND" ]; then COMMAND=$arg; else COMMAND=usage; fi ;;
    --testbed) TESTBED=1 ;;
    *) COMMAND=usage ;;
  esac
done

BED_SCRIPT=$(dirname "$(realpath "${BASH_SOURCE[0]}")")/testbed.sh
if ((TESTBED)); then
  BED_DIR=$(bash "$BED_SCRIPT" dir)
  DIR=$(realpath -m "${DDL_SLURM_TESTBED_DIR:-$BED_DIR/slurm}")
  CLUSTER=ddltestbed
  NODES=() ADDRS=() # the bed's hosts and addresses (read_bed); the first runs slurmctld and munged
else
  DIR=$(realpath -m "${DDL_SLURM_DIR:-/tmp/ddl-slurm}") # absolute: the daemons chdir
  CLUSTER=ddl
  NODES=("$(hostname -s)") ADDRS=(127.0.0.1) # slurmd finds its NodeName line by the short host name
fi
NODE=${NODES[0]:-}
CONF=$DIR/slurm.conf
MUNGE_DIR=$DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
NGPUS=4
SOCKETS=1 CORES=64 THREADS=2   # Perlmutter GPU node: AMD EPYC 7763
CPUS=$((SOCKETS * CORES * THREADS))
MEMORY_MB=16000
# Not Slurm's default ports (6817/6818), so that a system-wide Slurm on this machine does not clash.
CTLD_PORT=${DDL_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${DDL_SLURM_SLURMD_PORT:-16818}
TIMEOUT=${DDL_SLURM_TIMEOUT:-30}
MARKER=.made-by-local_slurm.sh

export SLURM_CONF=$CONF   # for the client commands this script runs itself

# --- the test bed ----------------------------------------------------------------------------------

bed_up() { bash "$BED_SCRIPT" status; }

# The bed's hosts and their addresses, from the /etc/hosts it gives every host.
read_bed() {
  local host addr
  NODES=() ADDRS=()
  for host in $(bash "$BED_SCRIPT" hosts); do
    addr=$(awk -v h="$host" '$2 == h { print $1 }' "$BED_DIR/etc_hosts")
    [ -n "$addr" ] || die "no address for $host in $BED_DIR/etc_hosts"
    NODES+=("$host") ADDRS+=("$addr")
  done
  ((${#NODES[@]} > 0)) || die "the test bed has no hosts"
  NODE=${NODES[0]}
}

# Runs a command on node $1: inside that host of the bed, or here in the one-node mode.
on_node() {
  local node=$1
  shift
  if ((TESTBED)); then
    (cd / && bash "$BED_SCRIPT" exec "$node" "$@")
  else
    "$@"
  fi
}

# A client command (sinfo, srun, squeue, scancel): where slurmctld is reachable.
client() { on_node "$NODE" "$@"; }

# --- configuration ---------------------------------------------------------------------------------

slurm_conf() {
  local i
  if ((TESTBED)); then
    echo "# Written by scripts/local_slurm.sh --testbed: one node per host of the test bed, for ddl's integration tests."
  else
    echo "# Written by scripts/local_slurm.sh: a one-node cluster on loopback for ddl's integration tests."
  fi
  cat <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$NODE(${ADDRS[0]})
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge

StateSaveLocation=$DIR/ctld
EOF
  if ((TESTBED)); then
    # Per node (%n: the node's name), on the shared file system: every host sees every node's files.
    cat <<EOF
SlurmdSpoolDir=$DIR/%n/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/%n/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/%n/slurmd.log
TmpFS=$DIR/%n/tmp
EOF
  else
    cat <<EOF
SlurmdSpoolDir=$DIR/slurmd
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
EOF
  fi
  cat <<EOF
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups, no accounting daemon: -A and -q are accepted and ignored.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none

SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# Let the node claim more CPUs than the machine has, and come back by itself after a restart.
SlurmdParameters=config_overrides
ReturnToService=2

# Fast turnaround for tests.
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
KillWait=2
MessageTimeout=5
InactiveLimit=0
Waittime=0
MailProg=/bin/true   # no mail here; the default /bin/mail is absent

EOF
  for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[i]} NodeAddr=${ADDRS[i]} CPUs=$CPUS Boards=1 SocketsPerBoard=$SOCKETS CoresPerSocket=$CORES ThreadsPerCore=$THREADS RealMemory=$MEMORY_MB Features=gpu Gres=gpu:$NGPUS State=UNKNOWN"
  done
  cat <<EOF
# Jobs share the node (one core by default); a GPU job gets the node's share of CPUs per GPU, as on
# Perlmutter, so "salloc --gpus-per-node=4 srun -n 4" has CPUs for its 4 tasks.
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES DefCpuPerGPU=$((CPUS / NGPUS))
EOF
}

# Where node $1's fake GPUs are: each node of the test bed has devices of its own.
gpu_dir() { if ((TESTBED)); then echo "$DIR/$1"; else echo "$DIR"; fi; }

gres_conf() {
  local node
  echo "AutoDetect=off"
  for node in "${NODES[@]}"; do
    echo "NodeName=$node Name=gpu File=$(gpu_dir "$node")/gpu[0-$((NGPUS - 1))]"
  done
}

cgroup_conf() {
  # Unused (proctrack/linuxproc, task/none), but slurmd reads it; keep systemd out of the picture.
  echo "CgroupPlugin=autodetect"
  echo "IgnoreSystemd=yes"
}

write_configs() {
  slurm_conf >"$CONF"
  gres_conf >"$DIR/gres.conf"
  cgroup_conf >"$DIR/cgroup.conf"
  mkdir -p "$DIR/ctld"
  local i node
  if ((TESTBED)); then
    for node in "${NODES[@]}"; do mkdir -p "$DIR/$node/spool" "$DIR/$node/tmp"; done
  else
    mkdir -p "$DIR/slurmd"
  fi
  for node in "${NODES[@]}"; do
    for ((i = 0; i < NGPUS; i++)); do
      mknod -m 0666 "$(gpu_dir "$node")/gpu$i" c 1 3 || die "mknod $(gpu_dir "$node")/gpu$i failed (needs root and CAP_MKNOD)"
    done
  done
}

slurmd_pid_file() { if ((TESTBED)); then echo "$DIR/$1/slurmd.pid"; else echo "$DIR/slurmd.pid"; fi; }
slurmd_log() { if ((TESTBED)); then echo "$DIR/$1/slurmd.log"; else echo "$DIR/slurmd.log"; fi; }

# --- processes -------------------------------------------------------------------------------------

# Whether process $1 is a daemon this script started for this state directory: it is named slurmctld,
# slurmd or munged and its command line names the state directory. Never a system-wide Slurm or munge,
# nor an unrelated process that reuses the pid of a stale pid file. The test bed's hosts share this
# machine's process table, so its daemons are found here too.
is_ours() {
  local comm
  comm=$(cat "/proc/$1/comm" 2>/dev/null) || return 1
  case $comm in slurmctld | slurmd | munged) ;; *) return 1 ;; esac
  tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qF "$DIR/"
}

# All of them, also those whose pid file is gone (a killed run, a removed state directory).
our_daemons() {
  local p
  for p in /proc/[0-9]*; do
    is_ours "${p#/proc/}" && echo "${p#/proc/}"
  done
  return 0
}

# Whether the daemon whose pid file is $1 runs.
running() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && is_ours "$pid"
}

stop_daemons() {
  local pids i
  pids=$(our_daemons)
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086
  kill $pids 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    pids=$(our_daemons)
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
  sleep 0.2
}

# Removes the state directory, but only one this script made: DDL_SLURM_DIR may be mistyped.
wipe_state_dir() {
  [ -e "$DIR" ] || return 0
  if [ -e "$DIR/$MARKER" ] || [ -z "$(ls -A "$DIR" 2>/dev/null)" ]; then
    rm -rf "$DIR"
  else
    die "$DIR was not made by local_slurm.sh (no $MARKER in it); not removing it"
  fi
}

start_munge() {
  # munged wants the socket's directory searchable by all and the key readable by its user only.
  mkdir -p "$MUNGE_DIR"
  chmod 0755 "$MUNGE_DIR"
  [ -s "$MUNGE_DIR/munge.key" ] || mungekey --create --keyfile="$MUNGE_DIR/munge.key"
  chmod 0400 "$MUNGE_DIR/munge.key"
  on_node "$NODE" munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" 9>&- || fail "munged did not start"
  munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null || fail "munge does not work"
}

# --- health ----------------------------------------------------------------------------------------

node_state() { client timeout 5 sinfo -h -n "$1" -o %T 2>/dev/null | head -1; }

node_up() { [[ $(node_state "$1") =~ ^(idle|mixed|allocated|completing)$ ]]; }

all_up() {
  local node
  for node in "${NODES[@]}"; do node_up "$node" || return 1; done
}

# Up, and with the configuration this script would write now (so an edited script restarts it).
healthy() {
  [ -f "$CONF" ] && cmp -s "$CONF" <(slurm_conf) && cmp -s "$DIR/gres.conf" <(gres_conf) || return 1
  running "$MUNGE_DIR/munged.pid" && running "$DIR/slurmctld.pid" || return 1
  local node
  for node in "${NODES[@]}"; do running "$(slurmd_pid_file "$node")" || return 1; done
  all_up
}

fail() {
  echo "local_slurm: error: $*" >&2
  local f node
  for f in "$MUNGE_DIR/munged.log" "$DIR/slurmctld.log" $(for node in "${NODES[@]}"; do slurmd_log "$node"; done); do
    [ -f "$f" ] || continue
    echo "--- tail of $f" >&2
    tail -n 20 "$f" >&2
  done
  stop_daemons # the logs stay in $DIR for a look; the next start wipes them
  exit 1
}

wait_until_up() {
  local deadline=$((SECONDS + TIMEOUT)) node
  for node in "${NODES[@]}"; do
    until node_up "$node"; do
      running "$DIR/slurmctld.pid" || fail "slurmctld exited"
      running "$(slurmd_pid_file "$node")" || fail "slurmd of $node exited"
      ((SECONDS < deadline)) || fail "node $node not up after ${TIMEOUT}s (state: $(node_state "$node" || true))"
      sleep 0.2
    done
  done
  local n=${#NODES[@]}
  client timeout 60 srun -N"$n" -n"$n" true || fail "srun -N$n -n$n true failed" # the first step is slow on a loaded machine
}

# --- commands --------------------------------------------------------------------------------------

cmd_start() {
  [ "$(id -u)" -eq 0 ] || die "needs root (daemons as SlurmUser=root, mknod for fake GPUs)"
  local tool node
  for tool in slurmctld slurmd munged mungekey sinfo srun; do
    command -v "$tool" >/dev/null || die "$tool not found: run scripts/setup.sh (slurm-wlm, munge)"
  done
  if ((TESTBED)); then
    read_bed
  fi
  if ! healthy; then
    stop_daemons # leftovers of a killed or failed run
    wipe_state_dir
    mkdir -p "$DIR"
    chmod 0755 "$DIR"
    touch "$DIR/$MARKER"
    # The daemons are started with 9>&- so that they do not inherit, and hold forever, the lock.
    start_munge
    write_configs
    on_node "$NODE" slurmctld -f "$CONF" 9>&- || fail "slurmctld did not start"
    for node in "${NODES[@]}"; do
      on_node "$node" slurmd -f "$CONF" 9>&- || fail "slurmd of $node did not start"
    done
    wait_until_up
  fi
  if ((TESTBED)); then
    say "cluster $CLUSTER up on the test bed, nodes ${NODES[*]} ($NGPUS fake GPUs, $CPUS CPUs each); SLURM_CONF=$CONF (use it inside the bed)"
  else
    say "cluster $CLUSTER up, node $NODE ($NGPUS fake GPUs, $CPUS CPUs); SLURM_CONF=$CONF"
  fi
}

cmd_stop() {
  # Jobs first: with proctrack/linuxproc their steps would outlive slurmd.
  if running "$DIR/slurmctld.pid" && { ((!TESTBED)) || { bed_up && read_bed; }; }; then
    local jobs
    jobs=$(client timeout 5 squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      client timeout 5 scancel $jobs 2>/dev/null || true
      sleep 0.5
    fi
  fi
  stop_daemons
  wipe_state_dir
  say "cluster $CLUSTER stopped"
}

cmd_env() { echo "export SLURM_CONF=$CONF"; }

# One start or stop at a time (tests may call start in parallel); the lock lives beside the state
# directory, which start and stop remove. On the test bed it is the directory that holds the state
# directory (the bed's own), so that nothing is left there after a stop.
lock() {
  mkdir -p "$(dirname "$DIR")"
  local lock_file=$DIR.lock
  if ((TESTBED)); then
    lock_file=$(dirname "$DIR")
    exec 9<"$lock_file"
  else
    exec 9>"$lock_file"
  fi
  flock -w 60 9 || die "another local_slurm.sh holds $lock_file"
}

case $COMMAND in
  start)
    if ((TESTBED)) && ! bed_up; then die "the test bed is not up: bash scripts/testbed.sh start 2"; fi
    lock && cmd_start
    ;;
  stop)
    # Without the bed's directory there is nothing of ours to stop but strays; making the directory
    # (for the lock) would leave the bed's next start a directory it did not make.
    if ((TESTBED)) && [ ! -d "$(dirname "$DIR")" ]; then
      stop_daemons
      say "cluster $CLUSTER stopped"
    else
      lock && cmd_stop
    fi
    ;;
  env) cmd_env ;;
  *) die "usage: $0 start|stop|env [--testbed]" ;;
esac

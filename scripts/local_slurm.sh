#!/usr/bin/env bash
# Starts and stops a real single-node Slurm cluster on loopback for ddl's integration tests, with
# Debian's slurm-wlm (slurmctld + slurmd) and a private munged. Needs root (mknod, daemons as root).
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
# The node imitates a Perlmutter GPU node (1 socket x 64 cores x 2 threads, 4 GPUs, feature "gpu");
# SlurmdParameters=config_overrides lets slurmd claim that on a 2-core machine, and the GPUs are
# character devices (/dev/null's numbers) named in gres.conf, so Slurm sets CUDA_VISIBLE_DEVICES.
set -euo pipefail

DIR=$(realpath -m "${DDL_SLURM_DIR:-/tmp/ddl-slurm}") # absolute: the daemons chdir
CONF=$DIR/slurm.conf
MUNGE_DIR=$DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
CLUSTER=ddl
NODE=$(hostname -s)            # slurmd finds its NodeName line by the short host name
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

say() { echo "local_slurm: $*"; }
die() {
  echo "local_slurm: error: $*" >&2
  exit 1
}

# --- configuration ---------------------------------------------------------------------------------

slurm_conf() {
  cat <<EOF
# Written by scripts/local_slurm.sh: a one-node cluster on loopback for ddl's integration tests.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge

StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/slurmd
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
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

NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS Boards=1 SocketsPerBoard=$SOCKETS CoresPerSocket=$CORES ThreadsPerCore=$THREADS RealMemory=$MEMORY_MB Features=gpu Gres=gpu:$NGPUS State=UNKNOWN
# Jobs share the node (one core by default); a GPU job gets the node's share of CPUs per GPU, as on
# Perlmutter, so "salloc --gpus-per-node=4 srun -n 4" has CPUs for its 4 tasks.
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES DefCpuPerGPU=$((CPUS / NGPUS))
EOF
}

gres_conf() {
  echo "AutoDetect=off"
  echo "NodeName=$NODE Name=gpu File=$DIR/gpu[0-$((NGPUS - 1))]"
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
  mkdir -p "$DIR/ctld" "$DIR/slurmd"
  local i
  for ((i = 0; i < NGPUS; i++)); do
    mknod -m 0666 "$DIR/gpu$i" c 1 3 || die "mknod $DIR/gpu$i failed (needs root and CAP_MKNOD)"
  done
}

# --- processes -------------------------------------------------------------------------------------

# Whether process $1 is a daemon this script started for this state directory: it is named slurmctld,
# slurmd or munged and its command line names the state directory. Never a system-wide Slurm or munge,
# nor an unrelated process that reuses the pid of a stale pid file.
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
  munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" 9>&- || fail "munged did not start"
  munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null || fail "munge does not work"
}

# --- health ----------------------------------------------------------------------------------------

node_state() { timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1; }

node_up() { [[ $(node_state) =~ ^(idle|mixed|allocated|completing)$ ]]; }

# Up, and with the configuration this script would write now (so an edited script restarts it).
healthy() {
  [ -f "$CONF" ] && cmp -s "$CONF" <(slurm_conf) && cmp -s "$DIR/gres.conf" <(gres_conf) || return 1
  running "$MUNGE_DIR/munged.pid" && running "$DIR/slurmctld.pid" && running "$DIR/slurmd.pid" || return 1
  node_up
}

fail() {
  echo "local_slurm: error: $*" >&2
  local f
  for f in "$MUNGE_DIR/munged.log" "$DIR/slurmctld.log" "$DIR/slurmd.log"; do
    [ -f "$f" ] || continue
    echo "--- tail of $f" >&2
    tail -n 20 "$f" >&2
  done
  stop_daemons # the logs stay in $DIR for a look; the next start wipes them
  exit 1
}

wait_until_up() {
  local deadline=$((SECONDS + TIMEOUT))
  until node_up; do
    running "$DIR/slurmctld.pid" || fail "slurmctld exited"
    running "$DIR/slurmd.pid" || fail "slurmd exited"
    ((SECONDS < deadline)) || fail "node $NODE not up after ${TIMEOUT}s (state: $(node_state || true))"
    sleep 0.2
  done
  timeout 20 srun -N1 -n1 true || fail "srun -N1 -n1 true failed"
}

# --- commands --------------------------------------------------------------------------------------

cmd_start() {
  [ "$(id -u)" -eq 0 ] || die "needs root (daemons as SlurmUser=root, mknod for fake GPUs)"
  local tool
  for tool in slurmctld slurmd munged mungekey sinfo srun; do
    command -v "$tool" >/dev/null || die "$tool not found: run scripts/setup.sh (slurm-wlm, munge)"
  done
  if ! healthy; then
    stop_daemons # leftovers of a killed or failed run
    wipe_state_dir
    mkdir -p "$DIR"
    chmod 0755 "$DIR"
    touch "$DIR/$MARKER"
    # The daemons are started with 9>&- so that they do not inherit, and hold forever, the lock.
    start_munge
    write_configs
    slurmctld -f "$CONF" 9>&- || fail "slurmctld did not start"
    slurmd -f "$CONF" 9>&- || fail "slurmd did not start"
    wait_until_up
  fi
  say "cluster $CLUSTER up, node $NODE ($NGPUS fake GPUs, $CPUS CPUs); SLURM_CONF=$CONF"
}

cmd_stop() {
  # Jobs first: with proctrack/linuxproc their steps would outlive slurmd.
  if running "$DIR/slurmctld.pid"; then
    local jobs
    jobs=$(timeout 5 squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      timeout 5 scancel $jobs 2>/dev/null || true
      sleep 0.5
    fi
  fi
  stop_daemons
  wipe_state_dir
  say "cluster $CLUSTER stopped"
}

cmd_env() { echo "export SLURM_CONF=$CONF"; }

# One start or stop at a time (tests may call start in parallel); the lock lives beside the state
# directory, which start and stop remove.
lock() {
  mkdir -p "$(dirname "$DIR")"
  exec 9>"$DIR.lock"
  flock -w 60 9 || die "another local_slurm.sh holds $DIR.lock"
}

case ${1:-} in
  start) lock && cmd_start ;;
  stop) lock && cmd_stop ;;
  env) cmd_env ;;
  *) die "usage: $0 start|stop|env" ;;
esac

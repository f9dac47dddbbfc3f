#!/usr/bin/env bash
# A real two-node Slurm cluster on loopback (Debian's slurm-wlm and munge): one munged, one
# slurmctld and two slurmd (`slurmd -N n1`, `slurmd -N n2`), each node CPUs=1 on 127.0.0.1 with a
# port of its own. Everything (config, munge key and socket, state, spool, logs, pid files) lives
# in DIR; nothing system-wide is read or written, so several clusters can run side by side.
#
#   scripts/slurm_local.sh start  [DIR]   start (or report the running one); prints `export SLURM_CONF=...`
#   scripts/slurm_local.sh stop   [DIR]   stop every daemon by the pid in DIR/run, wait until gone
#   scripts/slurm_local.sh status [DIR]   each daemon's pid and state, then sinfo; exit 1 if not all up
#
# DIR defaults to $SLURM_LOCAL_DIR, else ${TMPDIR:-/tmp}/attune-slurm-$UID. Clients find the cluster
# through SLURM_CONF (`source DIR/env` sets it): `srun --nodes 2 --ntasks-per-node 1 hostname`.
# Ports are free ones picked at the first start and kept in DIR/etc/slurm.conf.
# Slurm runs as the invoking user (SlurmUser/SlurmdUser); slurmd launches jobs as root only when
# that user is root. Partition `gpu` (the default, matching infra/slurm/process-job-template.json's
# default) holds both nodes; there are no GPUs (no GRES): a CPU is a "GPU" as in recipes/cpu/.
set -euo pipefail

NODES=(n1 n2)
CMD="${1:-}"
DIR="${2:-${SLURM_LOCAL_DIR:-${TMPDIR:-/tmp}/attune-slurm-$(id -u)}}"
START_TIMEOUT_S="${SLURM_LOCAL_START_TIMEOUT:-30}"

die() { echo "slurm_local: error: $*" >&2; exit 2; }
say() { echo "slurm_local: $*" >&2; }

case "$CMD" in start|stop|status) ;; *) echo "usage: $0 start|stop|status [DIR]" >&2; exit 2 ;; esac
mkdir -p "$DIR" && DIR="$(cd "$DIR" && pwd)"
ETC="$DIR/etc" RUN="$DIR/run" LOG="$DIR/log" MUNGE="$DIR/munge"
CONF="$ETC/slurm.conf"
export SLURM_CONF="$CONF"

# --- pids -------------------------------------------------------------------------------------
daemons() { echo munged slurmctld; for n in "${NODES[@]}"; do echo "slurmd-$n"; done; }
# shellcheck disable=SC2015  # tr may print nothing: still success
pid_of() { local f="$RUN/$1.pid"; [[ -s $f ]] && tr -dc 0-9 <"$f" || true; }
running() {  # the pid exists and is not a zombie
  [[ -n $1 ]] && kill -0 "$1" 2>/dev/null && [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}
alive() {  # the pid runs and is the daemon it claims to be (a recycled pid is not)
  local pid; pid="$(pid_of "$1")"
  running "$pid" && grep -q "${1%%-*}" "/proc/$pid/comm" 2>/dev/null
}
all_alive() { local d; for d in $(daemons); do alive "$d" || return 1; done; }
any_alive() { local d; for d in $(daemons); do alive "$d" && return 0; done; return 1; }

tree() {  # a pid and all its descendants, parents first
  local pid="$1" child
  echo "$pid"
  for child in $(pgrep -P "$pid" 2>/dev/null || true); do tree "$child"; done
}

cancel_jobs() {  # end every job of this cluster while its daemons still run (tasks die with them)
  alive slurmctld || return 0
  local jobs deadline=$((SECONDS + 15))
  jobs="$(squeue -h -o %A 2>/dev/null || true)"
  [[ -n $jobs ]] || return 0
  # shellcheck disable=SC2086
  scancel --full $jobs 2>/dev/null || true
  while [[ -n "$(squeue -h -o %A 2>/dev/null || true)" ]] && ((SECONDS < deadline)); do sleep 0.2; done
}

stop_all() {
  local d pid pids=() deadline
  cancel_jobs
  # slurmd first (they end their job steps), then the controller, then munge they all talk to
  for d in $(daemons | tac); do
    if alive "$d"; then pid="$(pid_of "$d")"; kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid:$d"); fi
  done
  deadline=$((SECONDS + 10))
  for entry in "${pids[@]}"; do
    pid="${entry%%:*}"
    while running "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if running "$pid"; then say "${entry#*:} ($pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  done
  # a slurmstepd outlives its slurmd; it belongs to this cluster if it reads this slurm.conf
  local stepd
  for stepd in $(pgrep -x slurmstepd 2>/dev/null || true); do
    if tr '\0' '\n' <"/proc/$stepd/environ" 2>/dev/null | grep -qx "SLURM_CONF=$CONF"; then
      # shellcheck disable=SC2046
      kill -KILL $(tree "$stepd") 2>/dev/null || true
    fi
  done
  for d in $(daemons); do rm -f "$RUN/$d.pid"; done
}

# --- configuration ----------------------------------------------------------------------------
# Ports come from below the kernel's ephemeral range, so no client socket of another process (a
# test's Prefect or S3 connection) can hold one, and a port any socket uses, in any state
# (TIME_WAIT too), is skipped: a connect test alone let slurmctld meet "Address already in use".
used_ports() {  # local TCP ports of every socket on this machine, decimal, one per line
  local f _ local_addr
  for f in /proc/net/tcp /proc/net/tcp6; do
    [[ -r $f ]] || continue
    while read -r _ local_addr _; do
      [[ $local_addr == *:* ]] && echo $((16#${local_addr##*:}))
    done < <(tail -n +2 "$f")
  done | sort -un
}

free_ports() {  # N ports on 127.0.0.1 that no socket uses, from a random base below the ephemeral range
  local n="$1" low; low="$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
  local span=$((low - 10000 - 100)) used found=()
  ((span > 0)) || span=1000
  local port=$((10000 + RANDOM % span))
  used=" $(used_ports | tr '\n' ' ') "
  while ((${#found[@]} < n)); do
    if [[ $used != *" $port "* ]] && ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then found+=("$port"); fi
    port=$((port + 1))
  done
  echo "${found[@]}"
}

write_config() {
  local ports; read -r -a ports <<<"$(free_ports $((1 + ${#NODES[@]})))"
  local host user; host="$(hostname -s)"; user="$(id -un)"
  mkdir -p "$ETC"
  {
    echo "# written by scripts/slurm_local.sh: a two-node cluster on 127.0.0.1 in $DIR"
    echo "ClusterName=attune-local"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=${ports[0]}"
    echo "SlurmUser=$user"
    echo "SlurmdUser=$user"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$MUNGE/munge.socket"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$RUN/slurmctld.pid"
    echo "SlurmdPidFile=$RUN/slurmd-%n.pid"
    echo "SlurmctldLogFile=$LOG/slurmctld.log"
    echo "SlurmdLogFile=$LOG/slurmd-%n.log"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    # no cgroups in a container: processes are tracked by parentage, no task binding
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "MpiDefault=none"
    echo "SwitchType=switch/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    # every finished job's start/end time, for charging the allocation's real time
    echo "JobCompType=jobcomp/filetxt"
    echo "JobCompLoc=$LOG/jobcomp.log"
    echo "ReturnToService=2"
    echo "SlurmdTimeout=30"
    # an allocation whose srun died (its login-node process killed) is released after this long
    echo "InactiveLimit=30"
    echo "KillWait=5"
    echo "MinJobAge=300"
    echo "SchedulerParameters=sched_interval=2"
    local i=1 n
    for n in "${NODES[@]}"; do
      echo "NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=${ports[$i]} CPUs=1 RealMemory=1024 State=UNKNOWN"
      i=$((i + 1))
    done
    echo "PartitionName=gpu Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF"
}

# --- start ------------------------------------------------------------------------------------
need_binaries() {
  local b missing=()
  for b in munged mungekey slurmctld slurmd srun scontrol sinfo; do
    command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || missing+=("$b")
  done
  ((${#missing[@]} == 0)) || die "not installed: ${missing[*]} (apt-get install slurm-wlm munge)"
}

sbin() { command -v "$1" 2>/dev/null || echo "/usr/sbin/$1"; }

wait_for() {  # wait_for WHAT LOGFILE CMD...: until CMD succeeds, or fail with the log's tail
  local what="$1" log="$2"; shift 2
  local deadline=$((SECONDS + START_TIMEOUT_S))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      say "$what did not come up within ${START_TIMEOUT_S}s; last lines of $log:"
      tail -n 15 "$log" >&2 2>/dev/null || true
      stop_all
      exit 1
    fi
    sleep 0.2
  done
}

nodes_idle() {
  local states; states="$(sinfo -h -N -o '%N %t' 2>/dev/null)" || return 1
  local n; for n in "${NODES[@]}"; do grep -qE "^$n idle$" <<<"$states" || return 1; done
}

start() {
  need_binaries
  if all_alive && nodes_idle; then
    say "already running in $DIR"
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  if any_alive; then say "some daemons of $DIR are down: restarting all"; stop_all; fi
  mkdir -p "$RUN" "$LOG" "$MUNGE" "$DIR/state"
  chmod 0700 "$MUNGE"
  [[ -f $CONF ]] || write_config
  echo "export SLURM_CONF=$CONF" >"$DIR/env"
  local n; for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done

  if [[ ! -s $MUNGE/munge.key ]]; then
    "$(sbin mungekey)" --create --keyfile="$MUNGE/munge.key" >/dev/null 2>"$LOG/mungekey.err" \
      || die "mungekey could not create $MUNGE/munge.key: $(cat "$LOG/mungekey.err")"
  fi
  chmod 0600 "$MUNGE/munge.key"
  # --force: munged refuses to run as root, or beside a stale socket, without it
  "$(sbin munged)" --force --socket="$MUNGE/munge.socket" --key-file="$MUNGE/munge.key" \
    --pid-file="$RUN/munged.pid" --log-file="$LOG/munged.log" --seed-file="$MUNGE/munged.seed" \
    2>>"$LOG/munged.log" || { tail -n 5 "$LOG/munged.log" >&2; die "munged did not start"; }
  wait_for munged "$LOG/munged.log" test -S "$MUNGE/munge.socket"

  # -c: a fresh cluster every start (no jobs or node states from a previous one)
  "$(sbin slurmctld)" -c -f "$CONF" 2>>"$LOG/slurmctld.log" || { tail -n 5 "$LOG/slurmctld.log" >&2; stop_all; die "slurmctld did not start"; }
  wait_for slurmctld "$LOG/slurmctld.log" scontrol ping
  for n in "${NODES[@]}"; do
    "$(sbin slurmd)" -N "$n" -f "$CONF" 2>>"$LOG/slurmd-$n.log" || { tail -n 5 "$LOG/slurmd-$n.log" >&2; stop_all; die "slurmd -N $n did not start"; }
  done
  for n in "${NODES[@]}"; do wait_for "slurmd $n" "$LOG/slurmd-$n.log" alive "slurmd-$n"; done
  wait_for "nodes ${NODES[*]} (idle)" "$LOG/slurmctld.log" nodes_idle
  say "two nodes up in $DIR (${SECONDS}s)"
  echo "export SLURM_CONF=$CONF"
}

status() {
  local d rc=0
  for d in $(daemons); do
    if alive "$d"; then echo "$d: running (pid $(pid_of "$d"))"; else echo "$d: stopped"; rc=1; fi
  done
  if alive slurmctld; then sinfo -N -o '%N %P %t %c' || rc=1; fi
  return $rc
}

case "$CMD" in
  start) start ;;
  stop) stop_all; say "stopped ($DIR)" ;;
  status) status ;;
esac

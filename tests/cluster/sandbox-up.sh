#!/usr/bin/env bash
# sandbox-up.sh - bring up a real local multi-node Slurm on this machine (Debian/Ubuntu, root).
#
# One slurmctld + N slurmd. Each slurmd gets its own UTS namespace (`hostname` = node1..),
# its own mount namespace (a sandbox /etc/hosts bind-mounted, so `hostname --ip-address`
# differs per node; and a small tmpfs at $SANDBOX_DIR/local, node-local storage that the other
# nodes cannot see, as /scratch on a real cluster) and, by default, its own network namespace, so the nodes have separate
# port spaces like real hosts:
#   SANDBOX_NET=netns    (default) link-local $SANDBOX_SUBNET.1N on bridge slbr0; no route out
#   SANDBOX_NET=loopback all nodes share the host network as 127.0.0.1N, one port per node
# Per-node CPU budget (SANDBOX_NODE_CPU=0.45: 0.45 of a core each): each slurmd, and so every
# job process it starts, runs in a cgroup of its own with that CPU quota, so N simulated nodes
# behave like N small machines instead of sharing this one's cores (cgroup v1 cpu or v2).
# Fake GPUs: gres/gpu backed by character devices $SANDBOX_DIR/dev/nvidia* (= /dev/null), so
# --gpus-per-node schedules and sets CUDA_VISIBLE_DEVICES.
#
# Idempotent: a healthy cluster with the same settings (and the same version of this script)
# is reused; anything else is stopped (sandbox-down.sh) and started fresh.
# The last line on stdout is `export SLURM_CONF=...`; everything else goes to stderr:
#   eval "$(tests/cluster/sandbox-up.sh)"
set -euo pipefail

LAB=${SANDBOX_DIR:-/tmp/verl-launch-sandbox}
NODES=${SANDBOX_NODES:-4}               # 1..9
CPUS=${SANDBOX_CPUS:-128}               # declared per node; big so realistic recipes schedule
MEM_MB=${SANDBOX_MEM_MB:-1024000}       # declared RealMemory per node; not enforced (CR_Core)
GPUS=${SANDBOX_GPUS:-8}                 # fake GPUs per node (0 = none)
GPU_TYPE=${SANDBOX_GPU_TYPE:-simgpu}     # their gres type: a typed request (cluster.gpu_type) works as on real clusters
NET=${SANDBOX_NET:-netns}               # netns | loopback
SUBNET=${SANDBOX_SUBNET:-169.254.77}    # link-local: never collides with a real network
CTLD_PORT=${SANDBOX_CTLD_PORT:-6817}
SLURMD_PORT=${SANDBOX_SLURMD_PORT:-6818}  # loopback mode: SLURMD_PORT+N-1 for node N
LINK_ETC=${SANDBOX_LINK_ETC:-0}         # 1 = symlink /etc/slurm/*.conf here (no SLURM_CONF needed)
PARTITION=${SANDBOX_PARTITION:-debug}
ACCT=${SANDBOX_ACCOUNTING:-none}        # none (sacct -c via jobcomp/filetxt) | dbd (MariaDB + slurmdbd)
DBD_PORT=${SANDBOX_DBD_PORT:-6830}
WARMUP=${SANDBOX_WARMUP:-1}             # 0 = skip the srun on every node after start (~0.5 s)
NODE_CPU=${SANDBOX_NODE_CPU:-}          # cores per node, e.g. 0.45 (empty = no budget)
RESET_CTLD=${SANDBOX_RESET_CTLD:-0}     # 1 = only restart a running sandbox's slurmctld with its
                                        # state wiped, so job ids start again at 1 (state loss)

ETC=$LAB/etc RUN=$LAB/run LOG=$LAB/log STATE=$LAB/state DEV=$LAB/dev
CONF=$ETC/slurm.conf
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Keep stdout for the final export line only, whatever the tools below print. Daemons
# start with fd 3 closed: one holding it would keep a caller's $(...) waiting forever.
exec 3>&1 1>&2
log() { printf '[sandbox-up %(%T)T] %s\n' -1 "$*"; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"
[[ $NODES =~ ^[1-9]$ ]] || die "SANDBOX_NODES must be 1..9"
[[ $GPUS =~ ^[0-9]+$ ]] || die "SANDBOX_GPUS must be a number"
[[ $NET == netns || $NET == loopback ]] || die "SANDBOX_NET must be netns or loopback"
[[ $ACCT == none || $ACCT == dbd ]] || die "SANDBOX_ACCOUNTING must be none or dbd"
[[ -z $NODE_CPU || $NODE_CPU =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || die "SANDBOX_NODE_CPU must be a number of cores, e.g. 0.45"

# Editing this script changes the fingerprint, so a stale running sandbox is not reused.
FP="nodes=$NODES cpus=$CPUS mem=$MEM_MB gpus=$GPUS net=$NET subnet=$SUBNET ctld=$CTLD_PORT"
FP+=" slurmd=$SLURMD_PORT part=$PARTITION acct=$ACCT nodecpu=$NODE_CPU script=$(sha1sum < "${BASH_SOURCE[0]}" | cut -c1-12) lab=$LAB"

if [ "$RESET_CTLD" != 1 ] && [ "$(cat "$RUN/fingerprint" 2>/dev/null)" = "$FP" ] && SANDBOX_DIR=$LAB "$HERE/sandbox-env.sh" >/dev/null; then
  log "sandbox already up, reusing it"
  echo "export SLURM_CONF=$CONF" >&3
  exit 0
fi

# ---------------------------------------------------------------- packages
pkgs=(slurmctld slurmd slurm-client munge iproute2 util-linux)
if [ "$ACCT" = dbd ]; then pkgs+=(slurmdbd mariadb-server); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Without systemd the packages' own service starts fail harmlessly; we start daemons ourselves.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---------------------------------------------------------------- helpers
alive() {  # alive PID COMM: running, not a zombie, and really that program (PIDs get reused)
  local pid=$1 comm=$2 st
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$st" != Z ] && [ "$st" != X ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}
gone() { ! alive "$@"; }
pid_in() { cat "$1" 2>/dev/null || true; }
node_ip() { if [ "$NET" = netns ]; then echo "$SUBNET.$((10 + $1))"; else echo "127.0.0.$((10 + $1))"; fi; }
ctld_ip() { if [ "$NET" = netns ]; then echo "$SUBNET.1"; else echo 127.0.0.1; fi; }
wait_for() {  # wait_for TENTHS CMD...: poll every 0.1 s
  local n=$1; shift
  for ((k = 0; k < n; k++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
dbd_sent() { ! sdiag 2>/dev/null | grep -Eq 'DBD Agent queue size: *[1-9]'; }
all_idle() { [ "$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)" -ge "$NODES" ]; }
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# start_in_ns NAME NETNS CMD...: run CMD with hostname NAME, the sandbox /etc/hosts and its
# own tmpfs at $LAB/local (node-local storage), inside network namespace NETNS if given.
# nsenter, not `ip netns exec`: the latter remounts /sys, hiding /sys/fs/cgroup, and slurmd
# then dies ("No filesystem mounted on /sys/fs/cgroup").
start_in_ns() {
  local name=$1 netns=$2; shift 2
  local pre=()
  if [ -n "$netns" ]; then pre=(nsenter "--net=/run/netns/$netns" --); fi
  # shellcheck disable=SC2016  # $0/$1/$@ belong to the inner sh
  "${pre[@]}" unshare --uts --mount --propagation private -- sh -c \
    'hostname "$0" && mount --bind "$1" /etc/hosts && mount -t tmpfs -o size=2g,mode=1777 vl-local "$2" &&
     shift 2 && exec "$@"' "$name" "$ETC/hosts" "$LAB/local" "$@"
}

# node_cgroup I: the cgroup directory for node I's CPU budget, created with the quota
# (cgroup v1's cpu controller, else v2's cpu.max); every process moved into it is limited.
CG_NAME=verl-sandbox-$(basename "$LAB")
node_cgroup() {
  local quota dir
  quota=$(awk -v c="$NODE_CPU" 'BEGIN { q = int(c * 100000); print (q < 1000 ? 1000 : q) }')
  if [ -w /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    dir=/sys/fs/cgroup/cpu/$CG_NAME/node$1
    mkdir -p "$dir" && echo 100000 > "$dir/cpu.cfs_period_us" && echo "$quota" > "$dir/cpu.cfs_quota_us" || return 1
  elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    dir=/sys/fs/cgroup/$CG_NAME
    mkdir -p "$dir" && echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    echo +cpu > "$dir/cgroup.subtree_control" || return 1
    dir=$dir/node$1
    mkdir -p "$dir" && echo "$quota 100000" > "$dir/cpu.max" || return 1
  else
    return 1
  fi
  echo "$dir"
}

# ---------------------------------------------------------------- controller reset (tests)
if [ "$RESET_CTLD" = 1 ]; then
  export SLURM_CONF=$CONF
  pid=$(pid_in "$RUN/slurmctld.pid")
  alive "$pid" slurmctld || die "no running sandbox slurmctld to reset"
  # What slurmctld has not yet sent slurmdbd waits in its state directory, wiped below: let it go
  # first, or accounting keeps an ended job RUNNING (no line at all without slurmdbd).
  wait_for 300 dbd_sent || log "slurmctld's queue for slurmdbd did not empty in 30 s"
  kill -TERM "$pid"
  wait_for 100 gone "$pid" slurmctld || die "slurmctld $pid did not stop"
  find "$STATE/ctld" -mindepth 1 -delete
  start_in_ns slurmctl "" slurmctld 3>&-
  wait_for 100 ctld_up || { tail -n 20 "$LOG/slurmctld.log"; die "slurmctld did not come back"; }
  readlink "/proc/$(pid_in "$RUN/slurmctld.pid")/ns/uts" > "$RUN/ns-uts-slurmctl"
  wait_for 300 all_idle || die "nodes not idle after the controller reset"
  log "slurmctld restarted with fresh state: job ids start again at 1"
  echo "export SLURM_CONF=$CONF" >&3
  exit 0
fi

# ---------------------------------------------------------------- clean slate
# Keep munged: it may serve other Slurm users on the machine, and restarting it costs time.
SANDBOX_DIR=$LAB SANDBOX_KEEP_MUNGE=1 "$HERE/sandbox-down.sh" || true
# Fresh state on every start: a half-dead previous run must not leave jobs or nodes behind.
rm -rf "$STATE" "$LOG.prev"
if [ -d "$LOG" ]; then mv "$LOG" "$LOG.prev"; fi
mkdir -p "$ETC" "$RUN" "$LOG" "$STATE/ctld" "$DEV" "$LAB/local"
for ((i = 1; i <= NODES; i++)); do mkdir -p "$STATE/slurmd-node$i"; done

# ---------------------------------------------------------------- config
# gres needs real character devices: regular files or a count-only gres.conf line do not work.
for ((g = 0; g < GPUS; g++)); do
  [ -c "$DEV/nvidia$g" ] || mknod -m 666 "$DEV/nvidia$g" c 1 3
done
{
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
  printf '%s\tslurmctl\n' "$(ctld_ip)"
  for ((i = 1; i <= NODES; i++)); do printf '%s\tnode%s\n' "$(node_ip "$i")" "$i"; done
} > "$ETC/hosts"

{
  cat <<EOF
# generated by tests/cluster/sandbox-up.sh ($FP)
ClusterName=sandbox
SlurmctldHost=slurmctl($(ctld_ip))
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroup setup needed; the price is that daemonizing job processes escape tracking
# (sandbox-down.sh sweeps them).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# The default batch_sched_delay=3 makes every sbatch wait ~3 s.
SchedulerParameters=batch_sched_delay=0
# Nodes declare more CPUs/memory than the machine has.
SlurmdParameters=config_overrides
ReturnToService=2
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
EOF
  if [ "$ACCT" = dbd ]; then
    printf '%s\n' AccountingStorageType=accounting_storage/slurmdbd "AccountingStorageHost=$(ctld_ip)" \
      "AccountingStoragePort=$DBD_PORT" JobAcctGatherType=jobacct_gather/linux
    # Fatal without slurmdbd, so only here.
    if [ "$GPUS" -gt 0 ]; then echo AccountingStorageTRES=gres/gpu; fi
  else
    printf '%s\n' AccountingStorageType=accounting_storage/none JobAcctGatherType=jobacct_gather/none
  fi
  if [ "$GPUS" -gt 0 ]; then echo GresTypes=gpu; fi
  for ((i = 1; i <= NODES; i++)); do
    extra=""
    if [ "$NET" = loopback ]; then extra+=" Port=$((SLURMD_PORT + i - 1))"; fi
    if [ "$GPUS" -gt 0 ]; then extra+=" Gres=gpu:$GPU_TYPE:$GPUS"; fi
    echo "NodeName=node$i NodeAddr=$(node_ip "$i") CPUs=$CPUS RealMemory=$MEM_MB$extra State=UNKNOWN"
  done
  echo "PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} > "$CONF"
{
  echo AutoDetect=off
  if [ "$GPUS" -gt 0 ]; then echo "Name=gpu Type=$GPU_TYPE File=$DEV/nvidia[0-$((GPUS - 1))]"; fi
} > "$ETC/gres.conf"

if [ "$LINK_ETC" = 1 ]; then
  mkdir -p /etc/slurm
  ln -sfn "$CONF" /etc/slurm/slurm.conf
  ln -sfn "$ETC/gres.conf" /etc/slurm/gres.conf
fi
export SLURM_CONF=$CONF

# ---------------------------------------------------------------- munge
if munge_ok; then
  log "munged already running, reusing it"
else
  if [ ! -s /etc/munge/munge.key ]; then
    runuser -u munge -- mungekey -c 2>/dev/null || /usr/sbin/create-munge-key -f
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged 3>&-
  wait_for 50 munge_ok || die "munged did not start"
  cp /run/munge/munged.pid "$RUN/munged.pid"   # marks it as ours: sandbox-down.sh may stop it
fi

# ---------------------------------------------------------------- network
if [ "$NET" = netns ]; then
  ip link show slbr0 >/dev/null 2>&1 || ip link add slbr0 type bridge
  sysctl -qw net.ipv6.conf.slbr0.disable_ipv6=1 2>/dev/null || true   # no IPv6 chatter/DAD delay
  ip addr replace "$SUBNET.1/24" dev slbr0
  ip link set slbr0 up
  for ((i = 1; i <= NODES; i++)); do
    ns=slnode$i
    ip netns add "$ns"
    ip link add "slv$i" type veth peer name eth0 netns "$ns"
    sysctl -qw "net.ipv6.conf.slv$i.disable_ipv6=1" 2>/dev/null || true
    ip link set "slv$i" master slbr0 up
    nsenter "--net=/run/netns/$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null || true
    ip -n "$ns" addr add "$(node_ip "$i")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
  done
fi

# ---------------------------------------------------------------- accounting (optional)
if [ "$ACCT" = dbd ]; then
  # Own datadir, unix socket only, root by socket auth. pid/log files must be writable by
  # user mysql: in a root-owned dir mariadbd exits (or segfaults) at start.
  DB=$LAB/mysql
  install -d -o mysql -g mysql "$DB" /run/mysqld
  # Fresh DB whenever we start mariadbd: job ids restart at 1 with the wiped StateSaveLocation.
  if ! mariadb -e 'select 1' >/dev/null 2>&1; then
    rm -rf "${DB:?}/data"
    mariadb-install-db --user=mysql --datadir="$DB/data" --auth-root-authentication-method=socket \
      --skip-test-db >"$LOG/mariadb-install.log" 2>&1 || { tail "$LOG/mariadb-install.log"; die "mariadb-install-db failed"; }
    setsid mariadbd --user=mysql --datadir="$DB/data" --socket=/run/mysqld/mysqld.sock --skip-networking \
      --pid-file="$DB/mariadbd.pid" --log-error="$DB/mariadbd.log" --innodb-buffer-pool-size=64M \
      </dev/null >/dev/null 2>&1 3>&- &
    wait_for 300 mariadb -e 'select 1' || { tail "$DB/mariadbd.log"; die "mariadbd did not start"; }
    cp "$DB/mariadbd.pid" "$RUN/mariadbd.pid"   # ours: sandbox-down.sh stops it
  fi
  # slurmdbd has no -f: it reads slurmdbd.conf next to $SLURM_CONF, and insists on mode 600.
  (umask 077; printf '%s\n' AuthType=auth/munge DbdHost=localhost "DbdPort=$DBD_PORT" SlurmUser=root \
    "PidFile=$RUN/slurmdbd.pid" "LogFile=$LOG/slurmdbd.log" DebugLevel=info \
    StorageType=accounting_storage/mysql StorageHost=localhost StorageUser=root \
    StorageLoc=slurm_acct_db > "$ETC/slurmdbd.conf")
  chmod 600 "$ETC/slurmdbd.conf"
  if [ "$LINK_ETC" = 1 ]; then ln -sfn "$ETC/slurmdbd.conf" /etc/slurm/slurmdbd.conf; fi
  slurmdbd 3>&-
  wait_for 300 sacctmgr -n list cluster || { tail "$LOG/slurmdbd.log"; die "slurmdbd did not start"; }
  # slurmctld registers ClusterName in the DB by itself.
fi

# ---------------------------------------------------------------- daemons
# Own UTS namespace for the controller too, so the config does not depend on this host's name.
start_in_ns slurmctl "" slurmctld 3>&-
wait_for 100 ctld_up || { tail -n 20 "$LOG/slurmctld.log"; die "slurmctld did not come up"; }
# slurmctld daemonizes and exits 0 even on fatal config errors, hence the ping above.
readlink "/proc/$(pid_in "$RUN/slurmctld.pid")/ns/uts" > "$RUN/ns-uts-slurmctl"

for ((i = 1; i <= NODES; i++)); do
  netns=""
  if [ "$NET" = netns ]; then netns=slnode$i; fi
  if [ -n "$NODE_CPU" ]; then
    cg=$(node_cgroup "$i") || die "SANDBOX_NODE_CPU: cannot create a CPU-limited cgroup (no writable cgroup v1 cpu or v2 cpu controller)"
    echo "$cg" >> "$RUN/cgroups"
    # The subshell joins the cgroup, then becomes slurmd: slurmd and all it starts stay in it.
    (echo "$BASHPID" > "$cg/cgroup.procs" && start_in_ns "node$i" "$netns" slurmd -N "node$i") 3>&-
  else
    start_in_ns "node$i" "$netns" slurmd -N "node$i" 3>&-
  fi
done
for ((i = 1; i <= NODES; i++)); do
  wait_for 100 test -s "$RUN/slurmd-node$i.pid" || true
  pid=$(pid_in "$RUN/slurmd-node$i.pid")
  alive "$pid" slurmd || { tail -n 20 "$LOG/slurmd-node$i.log"; die "slurmd node$i did not start"; }
  # Recorded so sandbox-down.sh can find job leftovers (e.g. a daemonized `ray start`).
  readlink "/proc/$pid/ns/uts" > "$RUN/ns-uts-node$i"
done

wait_for 300 all_idle || { sinfo -N; tail -n 20 "$LOG/slurmctld.log"; die "nodes not idle"; }
# A step on every node proves both directions (host srun <-> slurmstepd in the namespaces).
if [ "$WARMUP" = 1 ]; then
  got=$(timeout 60 srun -N"$NODES" -n"$NODES" --time=1 hostname 2>&1 | sort | tr '\n' ' ') || true
  exp=$(for ((i = 1; i <= NODES; i++)); do echo "node$i"; done | sort | tr '\n' ' ')
  [ "$got" = "$exp" ] || die "warm-up srun failed: got '$got', expected '$exp'"
fi

# Written last: sandbox-env.sh treats its presence as "this sandbox finished starting".
echo "$FP" > "$RUN/fingerprint"
log "sandbox up: $NODES nodes, net=$NET, gpus/node=$GPUS, accounting=$ACCT${NODE_CPU:+, $NODE_CPU core(s)/node}"
echo "export SLURM_CONF=$CONF" >&3

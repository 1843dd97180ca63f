#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this host for the slurm target's tests and experiments:
# slurmctld and munged on the host, one slurmd per Docker container (own hostname and address on
# a bridge network), the host's /usr, /etc and Python bind-mounted read-only into every node.
#
#   scripts/slurm-cluster.sh up [NODES]   # default 3; prints the seconds to all nodes idle
#   scripts/slurm-cluster.sh status       # answers or not, and the nodes' states
#   scripts/slurm-cluster.sh env          # the lines to eval: SLURM_CONF, the shared directory
#   scripts/slurm-cluster.sh down         # jobs cancelled, nodes, network, image, daemons gone
#
# FAULTLAB_SLURM_NFS=1 scripts/slurm-cluster.sh up [NODES]: the shared directory as NFS clients
# see it. Its files live in nfs/server/ (the "server"), and each node, and the submit host at
# shared/, sees them through a client layer of its own (python -m faultlab.storage.nfs: attributes
# cached for acregmin 3 s / acdirmin 30 s growing to 60 s, negative lookups cached until the
# parent's attributes expire, another client's writes visible only after the writer closes or
# fsyncs; faultlab/storage/nfs.py lists what it does not reproduce). The mode is part of the
# cluster's state: `up` in the other mode replaces the nodes. The storage faults' FUSE
# passthrough mounted under shared/ on the host does not reach the nodes in this mode.
#
# Everything lives under $FAULTLAB_SLURM_LAB (default /var/lib/faultlab-slurm): a munge key,
# slurm.conf and node image made per cluster, the daemons' state and logs, and shared/ -- the
# "shared filesystem", mounted at the same path on every node. Debian's slurmctld, slurmd,
# slurm-client and munge are installed when missing (root and apt). `up` is idempotent and judges
# each part by whether it answers (`scontrol ping`, `sinfo`), not by pid files: what a dead
# daemon or container left is removed and started again. How to use it, and what it costs:
# docs/guides/slurm.md, "The local test cluster".
set -uo pipefail

LAB=${FAULTLAB_SLURM_LAB:-/var/lib/faultlab-slurm}
HERE=$(cd "$(dirname "$0")/.." && pwd)
SUBNET_PREFIX=${FAULTLAB_SLURM_SUBNET_PREFIX:-10.213.7}  # outside Docker's default pools
NETWORK=faultlab-slurm
LABEL=faultlab.slurm-cluster
IMAGE=faultlab/slurm-node:22.05
CONF=$LAB/etc/slurm/slurm.conf
MUNGE_SOCKET=$LAB/run/munge/munge.socket
export SLURM_CONF=$CONF

die() { echo "slurm cluster: $*" >&2; exit 1; }
log() { echo "slurm cluster: $*"; }
# the checkout a node mounts (its venv runs the jobs): a node of another checkout is replaced
node_checkout() { docker inspect -f '{{index .Config.Labels "faultlab.checkout"}}' "$1" 2>/dev/null; }
# the shared directory's mode a node was started in (no label: coherent)
node_mode() {
  local m
  m=$(docker inspect -f '{{index .Config.Labels "faultlab.shared-mode"}}' "$1" 2>/dev/null)
  echo "${m:-coherent}"
}
# How a node container sees the shared directory: rslave, so that a mount made under it on the
# host later (the storage faults' FUSE passthrough over a job's checkpoints) reaches the node.
shared_propagation() {
  docker inspect -f "{{range .Mounts}}{{if eq .Destination \"$LAB/shared\"}}{{.Propagation}}{{end}}{{end}}" \
    "$1" 2>/dev/null
}
# The shared directory is a mount point of its own with shared propagation (the host's / is
# private here): what is mounted under it on the host then propagates into rslave binds.
ensure_shared_mount() {
  mountpoint -q "$LAB/shared" || mount --bind "$LAB/shared" "$LAB/shared" ||
    die "cannot bind-mount $LAB/shared onto itself"
  mount --make-shared "$LAB/shared" || die "cannot make $LAB/shared a shared mount"
}
# The shared directory's mode: "nfs" (FAULTLAB_SLURM_NFS=1 at up) or "coherent" (one bind).
wanted_mode() { [ "${FAULTLAB_SLURM_NFS:-0}" = 1 ] && echo nfs || echo coherent; }
current_mode() { cat "$LAB/run/shared-mode" 2>/dev/null || echo coherent; }
NFS_ARGS=(--acregmin "${FAULTLAB_NFS_ACREGMIN:-3}" --acdirmin "${FAULTLAB_NFS_ACDIRMIN:-30}")
nfs_pidfile() { echo "$LAB/run/nfs-$1.pid"; }
# one client layer over nfs/server at MOUNTPOINT, by NAME (host, node1 ...), in the background
start_nfs_client() {  # NAME MOUNTPOINT
  local pidfile mountpoint=$2
  pidfile=$(nfs_pidfile "$1")
  if pid_alive "$pidfile" && mountpoint -q "$mountpoint"; then
    mount --make-shared "$mountpoint" || die "cannot make $mountpoint a shared mount"
    return 0
  fi
  mountpoint -q "$mountpoint" && umount -l "$mountpoint"
  mkdir -p "$mountpoint"
  nohup "$HERE/.venv/bin/python" -m faultlab.storage.nfs "$LAB/nfs/server" "$mountpoint" \
    "${NFS_ARGS[@]}" >"$LAB/log/nfs-$1.log" 2>&1 &
  echo $! >"$pidfile"
  local deadline=$((SECONDS + 20))
  until mountpoint -q "$mountpoint"; do
    pid_alive "$pidfile" || die "the NFS client layer $1 exited ($LAB/log/nfs-$1.log)"
    ((SECONDS < deadline)) || die "the NFS client layer $1 did not mount ($LAB/log/nfs-$1.log)"
    sleep 0.1
  done
  # a node binds it rslave, which Docker allows only from a shared or slave mount
  mount --make-shared "$mountpoint" || die "cannot make $mountpoint a shared mount"
}
stop_nfs_clients() {
  local f
  for f in "$LAB"/run/nfs-*.pid; do
    [ -f "$f" ] && pid_alive "$f" && kill "$(cat "$f")" 2>/dev/null
    rm -f "$f"
  done
  for f in "$LAB"/nfs/node* "$LAB/shared"; do
    [ -d "$f" ] && mountpoint -q "$f" && { fusermount3 -u "$f" 2>/dev/null || umount -l "$f"; }
  done
  return 0
}
controller_answers() { timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; }
idle_nodes() { timeout 5 sinfo -h -t idle -o %D 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

need_root_and_docker() {
  [ "$(id -u)" = 0 ] || die "needs root (daemons, munge key, containers)"
  bash "$HERE/scripts/docker-engine.sh" >&2
  timeout 10 docker info >/dev/null 2>&1 || die "no Docker engine answers"
}

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged \
    >/dev/null && command -v sinfo >/dev/null && return 0
  command -v apt-get >/dev/null || die "Slurm is not installed and there is no apt-get"
  local t0=$SECONDS
  # no systemd here: keep the packages' init scripts from starting anything at install time
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends slurmctld slurmd slurm-client munge tini >/dev/null
  local rc=$?
  rm -f /usr/sbin/policy-rc.d
  [ $rc = 0 ] || die "apt-get install slurmctld slurmd slurm-client munge failed"
  log "installed Debian's Slurm and munge in $((SECONDS - t0)) s"
}

render_config() {  # NODES: the slurm.conf of this cluster, on stdout
  local n=$1 i
  echo "# made by scripts/slurm-cluster.sh for $n nodes"
  echo "ClusterName=faultlab"
  echo "SlurmctldHost=$(hostname)($SUBNET_PREFIX.1)"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  # cred_expire is also how long a requeued job is held before it may start again (default
  # 120 s, so requeue latency on a default cluster includes 121 s); 10 s keeps CI short.
  echo "AuthInfo=socket=$MUNGE_SOCKET,cred_expire=${FAULTLAB_SLURM_CRED_EXPIRE:-10}"
  echo "MailProg=/bin/true"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "StateSaveLocation=$LAB/state"
  echo "SlurmdSpoolDir=/var/spool/slurmd"
  echo "SlurmctldPidFile=$LAB/run/slurmctld.pid"
  echo "SlurmdPidFile=/var/run/slurmd.pid"
  echo "SlurmctldLogFile=$LAB/log/slurmctld.log"
  echo "SlurmdLogFile=/var/log/slurm/slurmd.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "MpiDefault=none"
  # the main scheduler pass every 2 s (default 60 s): a requeued job whose hold has passed
  # starts within seconds, not at the next minute
  echo "SchedulerParameters=sched_interval=2"
  echo "ReturnToService=1"  # 2 would undo a chaos 'state=down' within milliseconds
  echo "SlurmdTimeout=10"   # default 300: a lost machine would take 5 minutes to notice
  echo "SlurmctldTimeout=10"
  echo "KillWait=5"
  echo "MinJobAge=300"
  echo "MessageTimeout=5"
  for i in $(seq 1 "$n"); do
    echo "NodeName=node$i NodeAddr=$SUBNET_PREFIX.$((10 + i)) CPUs=2 RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP"
}

write_config() {  # NODES
  local n=$1 i
  mkdir -p "$LAB"/{etc/slurm,etc/munge,run/munge,state,log,bin,shared}
  chmod 0755 "$LAB" "$LAB/etc" "$LAB/run"
  if [ "$(wanted_mode)" = nfs ]; then
    [ -x "$HERE/.venv/bin/python" ] || die "FAULTLAB_SLURM_NFS=1 needs the project's .venv"
    mountpoint -q "$LAB/shared" && [ "$(current_mode)" != nfs ] && umount -l "$LAB/shared"
    mkdir -p "$LAB/nfs/server" && chmod 1777 "$LAB/nfs/server"
    start_nfs_client host "$LAB/shared"
  else
    [ "$(current_mode)" = nfs ] && stop_nfs_clients
    chmod 1777 "$LAB/shared"
    ensure_shared_mount
  fi
  if [ ! -s "$LAB/etc/munge/munge.key" ]; then  # a key of this cluster's own
    head -c 1024 /dev/urandom >"$LAB/etc/munge/munge.key"
  fi
  chown -R munge:munge "$LAB/etc/munge" "$LAB/run/munge"
  chmod 0700 "$LAB/etc/munge"; chmod 0400 "$LAB/etc/munge/munge.key"; chmod 0755 "$LAB/run/munge"
  render_config "$n" >"$CONF.new"
  if ! cmp -s "$CONF.new" "$CONF"; then mv "$CONF.new" "$CONF"; return 1; fi
  rm -f "$CONF.new"
}

write_node_entry() {
  cat >"$LAB/bin/node-entry.sh" <<EOF
#!/bin/bash
# a node: its own munged (this cluster's key), then slurmd in the foreground
set -e
mkdir -p /var/lib/munge /var/log/munge /var/spool/slurmd /var/log/slurm $LAB/run/munge
chown munge:munge /var/lib/munge /var/log/munge $LAB/run/munge
chmod 0700 /var/lib/munge /var/log/munge; chmod 0755 $LAB/run/munge
setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged \\
  --key-file=$LAB/etc/munge/munge.key --socket=$MUNGE_SOCKET \\
  --pid-file=/var/lib/munge/munged.pid --log-file=/var/log/munge/munged.log \\
  --seed-file=/var/lib/munge/munged.seed
exec /usr/sbin/slurmd -D
EOF
  chmod 0755 "$LAB/bin/node-entry.sh"
}

ensure_image() {
  docker image inspect "$IMAGE" >/dev/null 2>&1 && return 0
  local root
  root=$(mktemp -d)
  (cd "$root" && mkdir -p usr etc tmp var/spool/slurmd var/lib/munge var/log/munge \
      var/log/slurm var/run run proc sys dev root opt home &&
    chmod 1777 tmp && ln -s usr/bin bin && ln -s usr/lib lib && ln -s usr/lib64 lib64 &&
    ln -s usr/sbin sbin && tar -cf - .) |
    docker import --change "LABEL $LABEL=1" - "$IMAGE" >/dev/null ||
    { rm -rf "$root"; die "docker import of the node image failed"; }
  rm -rf "$root"
}

ensure_network() {
  docker network inspect "$NETWORK" >/dev/null 2>&1 && return 0
  docker network create --driver bridge --label "$LABEL=1" --subnet "$SUBNET_PREFIX.0/24" \
    --gateway "$SUBNET_PREFIX.1" "$NETWORK" >/dev/null || die "cannot create network $NETWORK"
}

start_munged() {
  [ -S "$MUNGE_SOCKET" ] && timeout 5 munge -n -S "$MUNGE_SOCKET" </dev/null 2>/dev/null |
    timeout 5 unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 && return 0
  pid_alive "$LAB/run/munged.pid" && kill "$(cat "$LAB/run/munged.pid")" 2>/dev/null
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged \
    --key-file="$LAB/etc/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$LAB/run/munge/munged.pid" --log-file="$LAB/run/munge/munged.log" \
    --seed-file="$LAB/run/munge/munged.seed" || die "munged did not start ($LAB/run/munge/munged.log)"
  cp "$LAB/run/munge/munged.pid" "$LAB/run/munged.pid"
}

start_slurmctld() {  # CONFIG_CHANGED
  if controller_answers && [ "$1" = 0 ]; then return 0; fi
  if pid_alive "$LAB/run/slurmctld.bgpid"; then
    kill "$(cat "$LAB/run/slurmctld.bgpid")"; sleep 0.5
  fi
  # a port another process holds is the machine's problem, not the cluster's: say so first
  # (a controller just killed above may hold it for a moment)
  local holder wait_until=$((SECONDS + 10))
  while holder=$(ss -Hltnp "sport = :6817" 2>/dev/null) && [ -n "$holder" ]; do
    ((SECONDS < wait_until)) || die "resource: port 6817 (slurmctld's) is taken: $holder"
    sleep 0.2
  done
  nohup /usr/sbin/slurmctld -D -c -i >"$LAB/log/slurmctld.stdout" 2>&1 &
  echo $! >"$LAB/run/slurmctld.bgpid"
  local pid=$! deadline=$((SECONDS + 20))
  until controller_answers; do
    { [ -r "/proc/$pid/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status"; } ||
      die "slurmctld exited at start: $(tail -n 3 "$LAB/log/slurmctld.log" | tr '\n' ' ')"
    ((SECONDS < deadline)) || die "slurmctld does not answer ($LAB/log/slurmctld.log)"
    sleep 0.1
  done
}

start_nodes() {  # NODES CONFIG_CHANGED
  local n=$1 i name python_root=
  # the interpreter the project's venv was made from, for torchrun jobs on the nodes
  [ -x "$HERE/.venv/bin/python" ] &&
    python_root=$("$HERE/.venv/bin/python" -c 'import sys; print(sys.base_prefix)')
  for i in $(seq 1 "$n"); do
    name=node$i
    if [ "$2" = 0 ] && [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] &&
        [ "$(node_checkout "$name")" = "$HERE" ] && [ "$(shared_propagation "$name")" = rslave ] &&
        [ "$(node_mode "$name")" = "$(wanted_mode)" ]
    then
      continue
    fi
    docker rm -f "$name" >/dev/null 2>&1
    mkdir -p "$LAB/log/$name"
    local source=$LAB/shared
    if [ "$(wanted_mode)" = nfs ]; then  # the node's own client layer over nfs/server
      source=$LAB/nfs/$name
      start_nfs_client "$name" "$source"
    fi
    local mounts=(-v /usr:/usr:ro -v /etc:/etc:ro -v "$LAB/etc:$LAB/etc:ro"
                  -v "$LAB/etc/slurm:/etc/slurm:ro" -v "$LAB/bin:$LAB/bin:ro"
                  -v "$LAB/log/$name:/var/log/slurm" -v "$source:$LAB/shared:rslave"
                  -v "$HERE:$HERE:ro" --tmpfs "$LAB/run/munge")
    [ -n "$python_root" ] && [ -d "$python_root" ] && [ "${python_root#/usr/}" = "$python_root" ] &&
      mounts+=(-v "$python_root:$python_root:ro")
    docker run -d --name "$name" --hostname "$name" --label "$LABEL=1" \
      --label "faultlab.checkout=$HERE" --label "faultlab.shared-mode=$(wanted_mode)" \
      --network "$NETWORK" \
      --ip "$SUBNET_PREFIX.$((10 + i))" "${mounts[@]}" "$IMAGE" \
      /usr/bin/tini -- "$LAB/bin/node-entry.sh" >/dev/null || die "cannot start $name"
  done
}

cmd_up() {
  local n=${1:-3} t0=$SECONDS changed=0
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "up NODES: 1 to 99 nodes, got '$n'"
  if [ -f "$CONF" ] && [ "$(render_config "$n")" = "$(cat "$CONF")" ] &&
      [ "$(node_checkout node1)" = "$HERE" ] && [ "$(shared_propagation node1)" = rslave ] &&
      [ "$(node_mode node1)" = "$(wanted_mode)" ] && [ "$(current_mode)" = "$(wanted_mode)" ] &&
      mountpoint -q "$LAB/shared" && controller_answers &&
      [ "$(idle_nodes)" = "$n" ]; then
    log "up: $n nodes idle (already; shared directory: $(current_mode))"; return 0
  fi
  local t_start
  t_start=$(date +%s.%N)
  need_root_and_docker
  install_packages
  write_config "$n" || changed=1
  write_node_entry
  ensure_image
  ensure_network
  start_munged
  start_slurmctld "$changed"
  start_nodes "$n" "$changed"
  wanted_mode >"$LAB/run/shared-mode"
  local deadline=$((SECONDS + 60))
  until [ "$(idle_nodes)" = "$n" ]; do
    if ((SECONDS >= deadline)); then
      sinfo -N 2>&1 | tail -n "$((n + 1))" >&2
      die "the $n nodes are not idle after 60 s ($LAB/log/)"
    fi
    sleep 0.1
  done
  log "up: $n nodes idle in $(awk -v a="$t_start" -v b="$(date +%s.%N)" \
    'BEGIN {printf "%.2f", b - a}') s (SLURM_CONF=$CONF; shared directory: $(wanted_mode))"
}

cmd_down() {
  if command -v squeue >/dev/null && controller_answers; then
    scancel --full --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null
  fi
  docker ps -aq --filter "label=$LABEL" 2>/dev/null | xargs -r docker rm -f >/dev/null 2>&1
  docker network rm "$NETWORK" >/dev/null 2>&1
  docker image rm -f "$IMAGE" >/dev/null 2>&1
  local f
  for f in "$LAB/run/slurmctld.bgpid" "$LAB/run/munged.pid"; do
    pid_alive "$f" && kill "$(cat "$f")" 2>/dev/null
  done
  for _ in $(seq 50); do
    pid_alive "$LAB/run/slurmctld.bgpid" || pid_alive "$LAB/run/munged.pid" || break
    sleep 0.1
  done
  stop_nfs_clients
  mountpoint -q "$LAB/shared" && umount -l "$LAB/shared"
  rm -rf "$LAB/state" "$LAB/run" "$LAB/log" "$LAB/shared" "$LAB/nfs"
  log "down"
}

cmd_status() {
  if controller_answers; then
    echo "controller: up"; sinfo -N -h -o '%N %T' 2>/dev/null
  else
    echo "controller: not answering"; return 1
  fi
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$CONF FAULTLAB_SLURM_SHARED=$LAB/shared" ;;
  *) echo "usage: $0 up [NODES] | status | env | down" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Make a Docker engine answer on this machine, for the docker target's tests and experiments:
# install Debian's docker.io when dockerd is missing, then start containerd and dockerd when no
# engine answers. Never fatal by itself: without root or apt it says why and returns 0, and the
# docker tests then skip with that reason -- unless FAULTLAB_REQUIRE_DOCKER=1 (CI), where they
# fail instead.
#
# A machine whose processes were stopped (a restored snapshot, a new session) keeps the sockets
# and pid files of the daemons that ran on it. A socket file is not a daemon: each daemon is
# judged by whether it answers, and what a dead one left behind is removed before starting it.
set -uo pipefail

log=/var/log/faultlab-dockerd.log
containerd_sock=/run/containerd/containerd.sock
answers() { timeout 5 docker info >/dev/null 2>&1; }
containerd_answers() { timeout 5 ctr --address "$containerd_sock" version >/dev/null 2>&1; }
# wait_for CHECK SECONDS PID: until CHECK succeeds, SECONDS pass, or process PID is gone (or a
# zombie)
wait_for() {
  local deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    "$1" && return 0
    ps -p "$3" -o stat= | grep -qv '^Z' || { "$1"; return; }
    sleep 0.2
  done
  "$1"
}
# live_pid NAME: the oldest process called NAME that is not a zombie, or nothing
live_pid() { ps -C "$1" -o pid=,stat= | awk '$2 !~ /^Z/ {print $1; exit}'; }
give_up() {
  echo "docker engine: $1 (log: $log); docker tests will skip"
  tail -5 "$log" 2>/dev/null || true
  exit 0
}

if answers; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "docker engine: not running, and starting one needs root; docker tests will skip"
  exit 0
fi
start_s=$SECONDS
if ! command -v dockerd >/dev/null; then
  if ! command -v apt-get >/dev/null; then
    echo "docker engine: no dockerd and no apt-get to install docker.io; docker tests will skip"
    exit 0
  fi
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends docker.io iptables >/dev/null ||
    { echo "docker engine: apt-get install docker.io failed; docker tests will skip"; exit 0; }
fi

if ! containerd_answers; then
  # one that runs but does not answer yet is starting up: give it time rather than a rival
  pid=$(live_pid containerd)
  [ -n "$pid" ] && wait_for containerd_answers 20 "$pid"
  if ! containerd_answers && [ -z "$(live_pid containerd)" ]; then
    rm -f "$containerd_sock" "$containerd_sock.ttrpc"
    setsid nohup containerd >>"$log" 2>&1 &  # its own session: a Ctrl-C or a kill of the
    # caller's process group (make test, a soak stopped) must not take the engine down
    wait_for containerd_answers 20 $!
  fi
  containerd_answers || give_up "containerd does not answer on $containerd_sock"
fi

pid=$(live_pid dockerd)
[ -n "$pid" ] && wait_for answers 60 "$pid"
if ! answers && [ -z "$(live_pid dockerd)" ]; then
  rm -f /var/run/docker.pid /var/run/docker.sock
  setsid nohup dockerd --containerd="$containerd_sock" >>"$log" 2>&1 &  # its own session (above)
  wait_for answers 60 $!
fi
answers || give_up "dockerd does not answer"
echo "docker engine: started in $((SECONDS - start_s)) s (log: $log)"
exit 0

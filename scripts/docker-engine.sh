#!/usr/bin/env bash
# Make a Docker engine answer on this machine, for the docker target's tests and experiments:
# install Debian's docker.io when dockerd is missing, then start containerd and dockerd when no
# engine answers. Never fatal by itself: without root or apt it says why and returns 0, and the
# docker tests then skip with that reason -- unless FAULTLAB_REQUIRE_DOCKER=1 (CI), where they
# fail instead.
set -uo pipefail

log=/var/log/faultlab-dockerd.log
answers() { docker info >/dev/null 2>&1; }

if answers; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "docker engine: not running, and starting one needs root; docker tests will skip"
  exit 0
fi
start_s=$(date +%s)
if ! command -v dockerd >/dev/null; then
  if ! command -v apt-get >/dev/null; then
    echo "docker engine: no dockerd and no apt-get to install docker.io; docker tests will skip"
    exit 0
  fi
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends docker.io iptables >/dev/null ||
    { echo "docker engine: apt-get install docker.io failed; docker tests will skip"; exit 0; }
fi
if [ ! -S /run/containerd/containerd.sock ]; then
  nohup containerd >>"$log" 2>&1 &
  for _ in $(seq 100); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.1; done
fi
nohup dockerd --containerd=/run/containerd/containerd.sock >>"$log" 2>&1 &
for _ in $(seq 300); do answers && break; sleep 0.1; done
if answers; then
  echo "docker engine: started in $(( $(date +%s) - start_s )) s (log: $log)"
else
  echo "docker engine: dockerd did not answer within 30 s (log: $log); docker tests will skip"
  tail -5 "$log" || true
fi
exit 0

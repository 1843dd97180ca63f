"""The fix of each launch finding, as the change to ``target.launch`` and ``target.services``
that a team pastes, and that ``faultlab run --with-fix`` applies to prove it.

A finding (``faultlab.observe.launch_findings``) names a mechanism of torchrun seen at work in a
run; its fix is a function of the team's own line, so the YAML it prints is that line with the
change made, placeholders kept:

store_lost
    A rendezvous store outside the nodes: a TCPStore the team runs as a service
    (:data:`STORE_SERVICE`, a ``python -c`` line with nothing of faultlab's in it), every agent
    its client (``--rdzv-conf is_host=false``, ``--rdzv-endpoint 127.0.0.1:{store_port}``), and
    the rendezvous settings of faultlab's launcher (without them the survivor re-rendezvouses
    only after 42-48 s, measured: docs/results/launch-stacks.md) with the variable that
    ``slow_rendezvous`` needs beside them. On a cluster the service is
    a process on a host every node reaches (a login node), the endpoint its address. An etcd
    rendezvous (``--rdzv-backend etcd-v2`` against :data:`ETCD_SERVICE`) survives the same loss
    (benchmarks/bench_launchers.py measures both); the store is the fix applied, as it needs
    nothing but torch.
slow_rendezvous
    ``--rdzv-conf`` with ``last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3``
    merged into what the line has, and ``env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with a
    last call of 1 s, a node that starts more than a second after the first joins a second
    round, and torch 2.13's shared worker store leaves it waiting for ``MASTER_ADDR`` until its
    60 s timeout (``dynamic_rendezvous.py``: the node of rank 0 keeps its bootstrap info from
    round 0 and never writes it under the new round's prefix; seen on the first run of this fix
    without the variable, examples/fsdp2_dcp's node_loss_torchrun). Under ft_launcher 0.4.1
    only ``last_call_timeout=1`` (its handler hard-codes the keep-alive: no fix exists for that
    part; its workers never share the store).
restart_hung, stale_worker_store
    ``env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in front of the launcher.
service_lost
    None that faultlab can run: a restarted TCPStore comes back empty, and torchrun's etcd
    backends talk to one etcd endpoint. Supervise and replicate it; the finding says so.
abort_at_exit
    In the trainer's code, not its launch (``os._exit(0)`` after a clean finish): nothing for
    ``--with-fix`` to apply; the finding says what to write.
native_crash
    In native code of the trainer's process: nothing to apply; the finding says how to catch
    it (core dumps).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import yaml

from faultlab.spec.launch import (
    BACKEND_FLAGS,
    CONF_FLAGS,
    ENDPOINT_FLAGS,
    flag_value,
    is_torchrun_like,
    launcher_index,
    service_placeholder,
)

__all__ = ["ETCD_SERVICE", "FIXABLE", "NO_FIX", "OWN_STORE_ENV", "RECOMMENDED_RDZV_CONF",
           "STORE_SERVICE", "Fixed", "apply_fix",
           "fix_yaml", "flow_list", "target_yaml"]

RECOMMENDED = {"last_call_timeout": "1", "keep_alive_interval": "1", "keep_alive_max_attempt": "3"}
"""The rendezvous settings of faultlab's tuned launcher, which the fixes set."""
RECOMMENDED_RDZV_CONF = ",".join(f"{k}={v}" for k, v in RECOMMENDED.items())
"""The same, as a ``--rdzv-conf`` value."""
OWN_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""Set to 1, torchrun's workers get a store of their own per round instead of the agent's."""

STORE_SERVICE: tuple[str, ...] = (
    "python", "-c", "import time, torch.distributed as d; s = d.TCPStore(\"127.0.0.1\", "
    "{store_port}, is_master=True, wait_for_workers=False); time.sleep(10**9)")
"""A rendezvous store as a team runs it beside its nodes: torch's TCPStore in a process of its
own, listening on ``{store_port}`` (the port faultlab gives the service named ``store``)."""

ETCD_SERVICE: tuple[str, ...] = (
    "etcd", "--name", "n0", "--enable-v2=true", "--data-dir", "{run_dir}/etcd-data",
    "--listen-client-urls", "http://127.0.0.1:{etcd_port}",
    "--advertise-client-urls", "http://127.0.0.1:{etcd_port}",
    "--listen-peer-urls", "http://127.0.0.1:0", "--initial-advertise-peer-urls",
    "http://127.0.0.1:0", "--initial-cluster", "n0=http://127.0.0.1:0")
"""One etcd 3.4 member (Debian's ``etcd-server``) serving the v2 API that torch 2.13's
``etcd-v2`` and ``etcd`` rendezvous backends speak, on ``{etcd_port}``; its peer URL on port 0
(a single member never dials it, and a service gets one port)."""

FIXABLE = ("store_lost", "slow_rendezvous", "restart_hung", "stale_worker_store")
"""The causes whose fix is a change of the launch line or the services."""

NO_FIX = {
    "service_lost": "no fix faultlab can run: a restarted TCPStore comes back empty, torch "
                    "2.13's etcd backends talk to one etcd endpoint, and torchft's lighthouse "
                    "keeps its quorum in memory; run it supervised and replicated, and prove "
                    "that with this same service_kill",
    "abort_at_exit": "the fix is in the trainer's code, not its launch line (the change "
                     "above): nothing for --with-fix to apply",
    "native_crash": "no fix faultlab can run: the crash is in native code of the trainer's "
                    "process, not in its launch line",
}
"""Why a cause has no fix for ``--with-fix`` to apply."""



class Fixed:
    """A launch line and services with one or more fixes applied."""

    __slots__ = ("launch", "services")

    def __init__(self, launch: Sequence[str], services: Mapping[str, Sequence[str]]) -> None:
        self.launch = [str(a) for a in launch]
        self.services = {k: [str(a) for a in v] for k, v in services.items()}


def _set_flag(line: list[str], flags: tuple[str, ...], value: str) -> list[str]:
    found = flag_value(line, flags)
    if found is None:
        return [*line, flags[0], value]
    i, _old = found
    out = list(line)
    if "=" in out[i] and out[i].split("=", 1)[0] in flags:
        out[i] = f"{out[i].split('=', 1)[0]}={value}"
    else:
        out[i] = value
    return out


def _merge_conf(line: list[str], values: Mapping[str, str]) -> list[str]:
    """``--rdzv-conf`` with ``values`` set, every other key of the line's kept."""
    found = flag_value(line, CONF_FLAGS)
    pairs: dict[str, str] = {}
    for item in (found[1] if found else "").split(","):
        key, eq, value = item.strip().partition("=")
        if key and eq:
            pairs[key] = value
    pairs.update(values)
    return _set_flag(line, CONF_FLAGS, ",".join(f"{k}={v}" for k, v in pairs.items()))


def _with_env(line: list[str], name: str, value: str) -> list[str]:
    """``env NAME=value`` in front of the launcher (into the line's ``env`` prefix if any)."""
    head = launcher_index(line)
    if head:
        prefix = [a for a in line[1:head] if not a.startswith(f"{name}=")]
        return [line[0], *prefix, f"{name}={value}", *line[head:]]
    return ["env", f"{name}={value}", *line]


def _store_name(services: Mapping[str, object]) -> str:
    return next(n for n in ("store", "rdzv_store", "rdzv_store2") if n not in services)


def apply_fix(cause: str, launch: Sequence[str], services: Mapping[str, Sequence[str]]
              ) -> Fixed | None:
    """``launch`` and ``services`` with the fix of ``cause`` applied (module docstring); None
    when ``cause`` has none to apply, or the line is not torchrun's (ft_launcher gets only the
    last call)."""
    line = [str(a) for a in launch]
    if cause not in FIXABLE or not is_torchrun_like(line):
        return None
    nvrx = line[launcher_index(line)].rsplit("/", 1)[-1] == "ft_launcher"
    if cause == "slow_rendezvous":
        conf = flag_value(line, CONF_FLAGS)
        if nvrx:
            if conf is not None and "last_call_timeout" in conf[1]:
                return None  # the keep-alive is hard-coded: nothing left to change
            return Fixed(_merge_conf(line, {"last_call_timeout": "1"}), services)
        return Fixed(_with_env(_merge_conf(line, RECOMMENDED), OWN_STORE_ENV, "1"), services)
    if cause in ("restart_hung", "stale_worker_store"):
        if nvrx:
            return None
        return Fixed(_with_env(line, OWN_STORE_ENV, "1"), services)
    # store_lost: a store of the team's own outside the nodes
    if nvrx:
        return None  # ft_launcher's own rendezvous handler: not measured with is_host=false
    name = _store_name(services)
    store = [a.replace("{store_port}", "{" + service_placeholder(name) + "}")
             for a in STORE_SERVICE]
    line = _set_flag(line, BACKEND_FLAGS, "c10d")
    line = _set_flag(line, ENDPOINT_FLAGS, "127.0.0.1:{" + service_placeholder(name) + "}")
    line = _merge_conf(line, {"is_host": "false", **RECOMMENDED})
    return Fixed(_with_env(line, OWN_STORE_ENV, "1"), {**services, name: store})


def fix_yaml(before_services: Mapping[str, Sequence[str]], fixed: Fixed) -> str:
    """The fix as the YAML a team pastes (the whole launch line, and the services it adds),
    written the way the shipped experiments write a line."""
    return target_yaml(fixed.launch, {k: v for k, v in fixed.services.items()
                                      if k not in before_services})


def target_yaml(launch: Sequence[str], services: Mapping[str, Sequence[str]]) -> str:
    """``target:`` with ``launch`` and ``services`` (when any) as YAML."""
    lines = ["target:", *flow_list("  launch: ", launch)]
    if services:
        lines.append("  services:")
        for name, line in services.items():
            lines += flow_list(f"    {name}: ", line)
    return "\n".join(lines)


def _scalar(item: str) -> str:
    """``item`` plain where YAML reads it back as the same string, else double-quoted."""
    plain = (item and not set(item) & set(",[]{}#&*!|>'\"%@`") and ": " not in item
             and not item.startswith(("- ", "?", ":")) and item == item.strip())
    if plain:
        try:
            if yaml.safe_load(item) == item:
                return item
        except yaml.YAMLError:
            pass
    return json.dumps(item)


def flow_list(head: str, items: Sequence[str], width: int = 96) -> list[str]:
    """``head[a, b, ...]`` wrapped at ``width``, continuation lines under the first item."""
    out, cur = [], head + "["
    pad = " " * len(cur)
    parts = [_scalar(str(a)) for a in items]
    for i, part in enumerate(parts):
        piece = part + ("]" if i == len(parts) - 1 else ",")
        if len(cur) + len(piece) + 1 > width and cur.strip() not in (head.strip() + "[", ""):
            out.append(cur.rstrip())
            cur = pad
        cur += piece + ("" if i == len(parts) - 1 else " ")
    out.append(cur if parts else head + "[]")
    return out

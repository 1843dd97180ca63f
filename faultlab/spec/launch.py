"""``target.launch``: which launch line starts each node, and the placeholders faultlab fills.

What recovers in an experiment is whatever starts the nodes: its rendezvous, where its store
lives, its timeouts, its monitor interval and its restart budget. So an experiment runs the
team's own launch line on every node, and faultlab fills in only what must differ per node and
per run. Three forms::

    launch: torchrun     # plain torchrun, torchrun's own defaults: the launch line most teams
                         # have; the default for a user's command
    launch: faultlab     # faultlab's tuned launcher (store outside the nodes, 0.1 s
                         # polls, keep-alive 1 s x 3, last call 1 s): the reference trainer's
                         # default, and the bar a team's stack is measured against
    launch: [torchrun, --nnodes, "1:2", --nproc-per-node, "1", --rdzv-backend, c10d,
             --rdzv-endpoint, "{rdzv_endpoint}", --max-restarts, "2"]
                         # the team's own line (a list, or a string split like a shell would)

A line is the launcher and its flags; the trainer's ``target.command`` follows it on each node
(a torchrun-like launcher supplies the interpreter itself, so the command's leading ``python``
is dropped unless the line says ``--no-python``). A bare program name is looked up beside the
interpreter faultlab runs on first (its virtual environment's ``torchrun``, ``ft_launcher``,
``torchft_lighthouse``), then on ``PATH``; a bare ``python`` is that interpreter.
``launch: torchrun`` is this line, every flag filled by faultlab from ``topology``::

    torchrun --nnodes {nnodes} --nproc-per-node {nproc_per_node} --rdzv-backend c10d
             --rdzv-endpoint {rdzv_endpoint} --rdzv-id {rdzv_id} --max-restarts {max_restarts}

Every agent is given the same endpoint; with c10d, the agent that binds it (node 0, started
first) hosts the rendezvous store, as on a real cluster whose endpoint is node 0's address.

A stack whose nodes are each a torchrun world of their own, joined by a service the team runs
beside them (torchft: one torchrun per replica group, and the lighthouse), says so with a
per-node port and ``target.services``::

    services:
      lighthouse: [torchft_lighthouse, --min_replicas, "1", --bind, "[::]:{lighthouse_port}"]
    launch: [env, "REPLICA_GROUP_ID={node_rank}", "NUM_REPLICA_GROUPS={num_nodes}",
             "TORCHFT_LIGHTHOUSE=http://127.0.0.1:{lighthouse_port}",
             torchrun, --nnodes, "1", --nproc-per-node, "{nproc_per_node}",
             --master-port, "{node_master_port}"]

Each service is started before the nodes, in a session of its own, with a free port of its own
in ``{NAME_port}`` (in its line and in the nodes'); it is reaped with the job, and a node's
loss never touches it (``service_kill`` is the fault that does). ``{node_master_port}`` (or
``{node_rdzv_endpoint}``) is a free port (endpoint) of each node's own: every node is then its
own torchrun world, whose ranks all start at ``RANK`` 0, so faultlab numbers a rank across
the job as ``node_rank * nproc_per_node + RANK`` (``FAULTLAB_RANK_OFFSET``), the numbering
torchft's own ``global_rank`` uses.

On docker nodes (``topology.launcher: docker``) the line runs inside each node's container, where
the host's ``/usr``, Python, virtual environment, this project and the working directory are
mounted read-only at the same paths (``docker_node_paths``). There ``{rdzv_endpoint}`` is
``node0:29400`` and ``{master_addr}``/``{master_port}`` are ``node0``/``29500`` (torchrun's
default ports): every run has a network of its own, on which each node's hostname (``nodeN``)
resolves, so the ports never collide and the name is node 0's whatever its address.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BACKEND_FLAGS", "CONF_FLAGS", "ENDPOINT_FLAGS", "ETCD_BACKENDS", "LAUNCHERS",
           "NODE_WORLD_PLACEHOLDERS", "PLACEHOLDERS", "SERVICE_NAME",
           "TORCHRUN_DEFAULT", "addressing_problem", "docker_node_paths", "docker_problems",
           "fill", "fixed_port", "flag_value", "is_host_false", "is_torchrun_like",
           "launcher_index", "rendezvous_client",
           "node_worlds", "placeholders_in", "program", "service_placeholder",
           "service_problem", "trainer_argv",
           "unknown_placeholders"]

LAUNCHERS = ("torchrun", "faultlab")
"""The named launch lines (a list is a team's own)."""

PLACEHOLDERS: dict[str, str] = {
    "run_dir": "this launch's run directory (the golden run's and each run's differ)",
    "node_rank": "the node's index, 0 ... nodes - 1 (torchrun's --node-rank)",
    "nnodes": "torchrun's --nnodes: 'nodes', or 'min_nodes:nodes' for an elastic job",
    "num_nodes": "topology.nodes",
    "min_nodes": "topology.min_nodes (nodes when unset)",
    "nproc_per_node": "topology.procs_per_node",
    "max_restarts": "topology.max_restarts",
    "rdzv_endpoint": "a free HOST:PORT for the rendezvous (the agent that binds it hosts a "
                     "c10d store), new for every launch",
    "rdzv_id": "a rendezvous id of this launch's own",
    "master_addr": "the host of rdzv_endpoint (a static rendezvous: --master-addr)",
    "master_port": "a free port for a static rendezvous (--master-port), new for every launch",
    "node_master_port": "a free port of the node's own (each node a torchrun world of its own, "
                        "e.g. a torchft replica group), new for every launch",
    "node_rdzv_endpoint": "a free HOST:PORT of the node's own (each node a torchrun world of its "
                          "own), new for every launch",
}
"""Every placeholder a launch line may hold, and what faultlab puts there."""

TORCHRUN_DEFAULT: tuple[str, ...] = (
    "torchrun", "--nnodes", "{nnodes}", "--nproc-per-node", "{nproc_per_node}",
    "--rdzv-backend", "c10d", "--rdzv-endpoint", "{rdzv_endpoint}", "--rdzv-id", "{rdzv_id}",
    "--max-restarts", "{max_restarts}")
"""``launch: torchrun``: plain torchrun, torchrun's defaults for everything else."""

NODE_WORLD_PLACEHOLDERS = ("node_master_port", "node_rdzv_endpoint")
"""A line with one of these makes every node a torchrun world of its own."""

SERVICE_NAME = re.compile(r"[a-z][a-z0-9_]*")
"""The name of a service under ``target.services`` (its port is ``{NAME_port}``)."""

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TORCHRUN_NAMES = ("torchrun", "ft_launcher")
_ADDRESSING = {"rdzv_endpoint", "master_addr", "master_port", *NODE_WORLD_PLACEHOLDERS}
_ENDPOINT_FLAGS = ("--rdzv-endpoint", "--rdzv_endpoint")
ENDPOINT_FLAGS = _ENDPOINT_FLAGS
"""torchrun's rendezvous endpoint flag, in both spellings."""
CONF_FLAGS = ("--rdzv-conf", "--rdzv_conf")
"""torchrun's rendezvous settings flag, in both spellings."""
BACKEND_FLAGS = ("--rdzv-backend", "--rdzv_backend")
"""torchrun's rendezvous backend flag, in both spellings."""
ETCD_BACKENDS = ("etcd", "etcd-v2")
"""torch 2.13's rendezvous backends that speak to an etcd server."""
_PORT_FLAGS = ("--master-port", "--master_port")
_ADDR_FLAGS = ("--master-addr", "--master_addr")


def placeholders_in(line: Sequence[str]) -> set[str]:
    return {m for arg in line for m in _PLACEHOLDER.findall(arg)}


def service_placeholder(name: str) -> str:
    """The placeholder of a service's port: ``lighthouse`` → ``lighthouse_port``."""
    return f"{name}_port"


def node_worlds(line: Sequence[str]) -> bool:
    """Is every node of this line a torchrun world of its own (a port of its own)?"""
    return bool(placeholders_in(line) & set(NODE_WORLD_PLACEHOLDERS))


def unknown_placeholders(line: Sequence[str], services: Sequence[str] = ()
                         ) -> list[tuple[int, str]]:
    """``(index, name)`` of every ``{name}`` in ``line`` that faultlab does not fill (a
    service's ``{NAME_port}`` is filled for each of ``services``)."""
    known = set(PLACEHOLDERS) | {service_placeholder(n) for n in services}
    return [(i, m) for i, arg in enumerate(line) for m in _PLACEHOLDER.findall(arg)
            if m not in known]


def launcher_index(line: Sequence[str]) -> int:
    """Where the launcher is in ``line``: after an ``env VAR=value ...`` prefix, if any."""
    i = 0
    if line and line[0].rsplit("/", 1)[-1] == "env":
        i = 1
        while i < len(line) and "=" in line[i] and not line[i].startswith("-"):
            i += 1
    return i


def _launcher(line: Sequence[str]) -> list[str]:
    """The line from its launcher on: an ``env VAR=value ...`` prefix left out."""
    return list(line)[launcher_index(line):]


def is_torchrun_like(line: Sequence[str]) -> bool:
    """torchrun, ``python -m torch.distributed.run`` or NVRx's ft_launcher (torchrun's flags),
    also behind an ``env VAR=value`` prefix."""
    line = _launcher(line)
    if not line:
        return False
    exe = line[0].rsplit("/", 1)[-1]
    if exe in _TORCHRUN_NAMES:
        return True
    return exe.startswith("python") and list(line[1:3]) in (
        ["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"])


def flag_value(line: Sequence[str], flags: tuple[str, ...]) -> tuple[int, str] | None:
    """``(index of the value, value)`` of the first of ``flags`` in ``line`` (``--f v`` or
    ``--f=v``)."""
    for i, arg in enumerate(line):
        name, eq, value = arg.partition("=")
        if name in flags:
            if eq:
                return i, value
            if i + 1 < len(line):
                return i + 1, line[i + 1]
    return None


def fixed_port(line: Sequence[str]) -> tuple[int, str] | None:
    """``(index, value)`` of a literal port: ``--rdzv-endpoint host:29400``, ``--master-port
    29500``. Every launch of the experiment (the golden run, each run, parallel runs) would
    bind the same one."""
    endpoint = flag_value(line, _ENDPOINT_FLAGS)
    if endpoint is not None and not _PLACEHOLDER.search(endpoint[1]):
        return endpoint
    port = flag_value(line, _PORT_FLAGS)
    if port is not None and not _PLACEHOLDER.search(port[1]):
        return port
    return None


def addressing_problem(line: Sequence[str], nodes: int) -> str | None:
    """Why the nodes of this line could not find each other (None: they can)."""
    if nodes < 2:
        return None
    if placeholders_in(line) & _ADDRESSING:
        return None
    if is_torchrun_like(line) and (flag_value(line, _ENDPOINT_FLAGS + _PORT_FLAGS + _ADDR_FLAGS)
                                   is not None):
        return None
    return (f"{nodes} nodes, but nothing in the line tells them where to meet: give the "
            f"rendezvous ({_ENDPOINT_FLAGS[0]} {{rdzv_endpoint}}, with --rdzv-backend c10d) "
            f"or a static master (--master-addr {{master_addr}} --master-port {{master_port}} "
            f"--node-rank {{node_rank}}); faultlab fills each with a free address per launch")


def store_problem(line: Sequence[str]) -> tuple[int, str] | None:
    """``(index, why)`` when the line makes every agent a client of a rendezvous store
    (``--rdzv-conf is_host=false``) at faultlab's own per-launch endpoint, where nothing
    listens: the job could never start. None: no such client, or the store is elsewhere."""
    if not is_torchrun_like(line) or not is_host_false(line):
        return None
    endpoint = flag_value(line, _ENDPOINT_FLAGS)
    if endpoint is None or "{rdzv_endpoint}" not in endpoint[1]:
        return None
    return endpoint[0], ("--rdzv-conf is_host=false makes every agent a client of a store that "
                         "something else runs at the endpoint, but {rdzv_endpoint} is an "
                         "address faultlab picks per launch, where nothing listens: run your "
                         "store as a target.services entry (store: [...]) and point "
                         "--rdzv-endpoint at it, 127.0.0.1:{store_port}")


def is_host_false(line: Sequence[str]) -> bool:
    """``--rdzv-conf is_host=false``: no agent hosts the store, every one is its client."""
    conf = flag_value(line, CONF_FLAGS)
    return conf is not None and "is_host=false" in conf[1].replace(" ", "").lower()


def rendezvous_client(line: Sequence[str]) -> bool:
    """The agents are clients of a rendezvous that something outside them serves (a store with
    ``is_host=false``, or etcd): no node binds the endpoint."""
    backend = flag_value(line, BACKEND_FLAGS)
    return is_host_false(line) or (backend is not None and backend[1] in ETCD_BACKENDS)


def service_problem(line: Sequence[str], services: Mapping[str, Sequence[str]]
                    ) -> tuple[tuple[str | int, ...], str] | None:
    """``(path under target, why)`` when the line's rendezvous points at something that will
    not answer: a service's ``{NAME_port}`` that the service's own line never listens on, an
    etcd backend at faultlab's per-launch ``{rdzv_endpoint}`` (where nothing runs etcd), or an
    etcd service that does not serve the v2 API torch 2.13's etcd backends speak. None: fine,
    or nothing faultlab can tell."""
    if not is_torchrun_like(line):
        return None
    endpoint = flag_value(line, _ENDPOINT_FLAGS)
    backend = flag_value(line, BACKEND_FLAGS)
    etcd = backend[1] if backend is not None and backend[1] in ETCD_BACKENDS else None
    if endpoint is None:
        return None
    named = [n for n in services if "{" + service_placeholder(n) + "}" in endpoint[1]]
    if etcd and not named:
        return ("launch", endpoint[0]), (
            f"--rdzv-backend {etcd} needs an etcd server at the endpoint, and "
            f"{endpoint[1]!r} is not one: run etcd as a target.services entry (etcd: [etcd, "
            f"--enable-v2=true, --listen-client-urls, \"http://127.0.0.1:{{etcd_port}}\", ...]) "
            f"and point --rdzv-endpoint at it, 127.0.0.1:{{etcd_port}}")
    for name in named:
        own = list(services[name])
        port = "{" + service_placeholder(name) + "}"
        program_name = own[0].rsplit("/", 1)[-1] if own else ""
        if etcd and program_name == "etcd":
            urls = flag_value(own, ("--listen-client-urls",))
            if urls is None or port not in urls[1]:
                return ("services", name, urls[0] if urls else 0), (
                    f"the etcd service {name!r} does not listen where the rendezvous looks: "
                    f"its --listen-client-urls must carry {port} (http://127.0.0.1:{port}), the "
                    f"port faultlab gives it and the one --rdzv-endpoint names")
            if "--enable-v2=true" not in own and "--enable-v2" not in own:
                return ("services", name, 0), (
                    f"the etcd service {name!r} does not serve the v2 API that torch's "
                    f"--rdzv-backend {etcd} speaks: etcd 3.4 serves it only with "
                    f"--enable-v2=true (add it to the service's line)")
        elif not any(port in a for a in own):
            return ("services", name, 0), (
                f"--rdzv-endpoint points at the service {name!r}'s port {port}, but its line "
                f"never names {port}: it would not listen there (faultlab picks the port and "
                f"fills it into the service's line)")
    return None


_LOOPBACK = re.compile(r"^(localhost|127(\.\d+){3}|::1|\[::1\])$")
_LOCAL_ADDR_FLAGS = ("--local-addr", "--local_addr")


def docker_node_paths() -> list[str]:
    """The host paths every docker node sees, read-only, at the same path: ``/usr``, the base
    Python, the virtual environment, this project and the working directory."""
    import os

    import faultlab

    return ["/usr", sys.base_prefix, sys.prefix, str(Path(faultlab.__file__).resolve().parents[1]),
            os.getcwd()]


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots if r)


def docker_problems(line: Sequence[str]) -> list[tuple[int, str]]:
    """``(index, why)`` for each part of ``line`` that cannot work inside a docker node: a
    launcher (or the interpreter its ``#!`` names) outside what the containers see, and a
    loopback address, which in a container is that container alone."""
    out: list[tuple[int, str]] = []
    roots = docker_node_paths()
    at = launcher_index(line)
    for i in {0, at} if at < len(line) else {0}:
        found = program(line[i])
        if found is None:
            continue  # the spec reports a program that is not found at all
        real = str(Path(found).resolve())
        shown = f"{found!r}" + (f" (-> {real!r})" if real != found else "")
        if not _inside(real, roots) and not _inside(found, roots):
            out.append((i, f"{shown} is not inside the docker nodes: each container sees only "
                           f"{', '.join(sorted(set(r for r in roots if r)))} (read-only); "
                           f"install the launcher in the virtual environment faultlab runs "
                           f"from, or under /usr"))
            continue
        interp = _shebang(real)
        if interp and not _inside(str(Path(interp).resolve()), roots) and \
                not _inside(interp, roots):
            out.append((i, f"{shown} starts with #!{interp}, which is not inside the docker "
                           f"nodes (they see {', '.join(sorted(set(r for r in roots if r)))}); "
                           f"reinstall it from the interpreter faultlab runs on"))
    for flags in (_ENDPOINT_FLAGS, _ADDR_FLAGS, _LOCAL_ADDR_FLAGS):
        found_flag = flag_value(line, flags)
        if found_flag is None:
            continue
        i, value = found_flag
        host = value.rpartition(":")[0] if flags is _ENDPOINT_FLAGS else value
        if _LOOPBACK.match(host):
            fix = "{rdzv_endpoint}" if flags is _ENDPOINT_FLAGS else \
                "{master_addr}" if flags is _ADDR_FLAGS else "nothing (leave the flag out)"
            out.append((i, f"{host!r} is each container's own loopback on docker nodes: the "
                           f"nodes would never meet; write {fix} (faultlab fills in node 0's "
                           f"name on the run's network)"))
    return out


def _shebang(path: str) -> str | None:
    """The interpreter a script's ``#!`` line names (None: not a script, or ``env``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words or words[0].rsplit("/", 1)[-1] == "env":
        return None
    return words[0]


def fill(line: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """``line`` with every ``{name}`` of ``values`` replaced (unknown names are left: the spec
    refused them)."""
    def one(arg: str) -> str:
        return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values
                                else m.group(0), arg)
    return [one(arg) for arg in line]


def trainer_argv(line: Sequence[str], command: Sequence[str],
                 python_names: Sequence[str]) -> list[str]:
    """What follows the launch line on a node: the trainer's command, without its leading
    interpreter when a torchrun-like launcher supplies one (no ``--no-python`` in the line);
    ``python -m pkg`` becomes torchrun's own ``-m pkg``."""
    command = list(command)
    no_python = any(a in ("--no-python", "--no_python") for a in line)
    if not is_torchrun_like(line) or no_python or not command:
        return command
    exe = command[0].rsplit("/", 1)[-1]
    if command[0] in python_names or exe.startswith("python"):
        rest = command[1:]
        while rest and rest[0] in ("-u", "-O", "-B"):  # torchrun runs python -u itself
            rest = rest[1:]
        return rest
    return command


def split_line(value: Any) -> Any:
    """A launch line given as one string: split like a shell would (a named launcher stays)."""
    if isinstance(value, str) and value not in LAUNCHERS:
        return tuple(shlex.split(value))
    return value


BAR_REFUSED = {
    "ft_launcher": "the trainer under NVRx's ft_launcher talks to the rank monitor ft_launcher "
                   "starts for each rank (RankMonitorClient); faultlab's launcher starts none, so "
                   "under it the trainer fails at its first heartbeat and the bar would measure "
                   "that failure, not a recovery",
}
"""Launchers whose trainers cannot run under faultlab's launcher, the ``--bar``, and why."""


def bar_refusal(line: Sequence[str] | None) -> str | None:
    """Why ``--bar`` cannot run an experiment with this launch line under faultlab's launcher
    (its trainer needs what only its own launcher gives it); None: it can."""
    if not line:
        return None
    name = _launcher(line)[:1]
    return BAR_REFUSED.get(name[0].rsplit("/", 1)[-1]) if name else None


def program(name: str) -> str | None:
    """Where a launch line's program is: ``python`` is faultlab's interpreter; a bare name is
    looked up in that interpreter's own ``bin`` first (a virtual environment's console
    scripts are there even when it is not on ``PATH``), then on ``PATH``; None: not found."""
    if name in ("python", "python3"):
        return sys.executable
    if "/" not in name:
        beside = Path(sys.executable).parent / name
        if beside.is_file():
            return str(beside)
    return shutil.which(name)

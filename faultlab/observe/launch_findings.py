"""What in the team's launch line made a recovery fail or slow: the cause and the setting that
changes it, read from the line itself, the faults and what the nodes logged.

Each finding names a mechanism of torchrun (torch 2.13) that was seen at work in this run, not a
guess from the line alone:

store_lost
    With ``--rdzv-backend c10d`` the agent that binds ``--rdzv-endpoint`` hosts the rendezvous
    store (node 0: faultlab starts it first). A fault took that node down, and a survivor's
    agent logged ``RendezvousConnectionError`` (the store is gone, and every agent with it).
    No torchrun flag moves the store out of the agent: ``--rdzv-conf is_host=false`` on every
    node makes the agents clients of a store that something else runs at the endpoint (what
    faultlab's launcher does), or an etcd rendezvous keeps it outside the job.
slow_rendezvous
    A node left the job (killed, or its agent gone) and the line leaves torchrun's rendezvous
    settings at their defaults: the survivors wait ``last_call_timeout`` (30 s) for more nodes
    once fewer than ``--nnodes``' maximum are back, and a dead node stays a participant until it
    misses ``keep_alive_max_attempt`` heartbeats of ``keep_alive_interval`` (3 x 5 s).
    ``--rdzv-conf last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3`` is what
    faultlab's launcher runs with; on torch 2.13 it needs ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    beside it (``faultlab.observe.launch_fixes``: a node that starts late would hang).
stale_worker_store
    After a restart, a new worker failed to build its process group against an address of the
    group before (``Gloo connectFullMesh failed`` / ``Connection refused``): torchrun lets the
    workers share the agent's rendezvous store (``TORCHELASTIC_USE_AGENT_STORE``), and the
    restart cost one more attempt. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in the launch
    environment (``env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun ...``) gives the workers a
    store of their own per round (measured on examples/fsdp2_dcp's rank kill: 2 restarts
    without it, 1 with it).
NVRx ft_launcher (nvidia-resiliency-ext 0.4.1) runs torchrun's agent with a rendezvous handler
of its own: the store lives in node 0's agent as under torchrun (``store_lost`` alike), but
the handler hard-codes a keep-alive of 3 x 5 s (``keep_alive_*`` in ``--rdzv-conf`` are not
read; only ``last_call_timeout`` is), and with c10d its workers never share the agent's store
(``TORCHELASTIC_USE_AGENT_STORE=False``), so the two findings below are not its. Measured on
examples/nvrx_ft, node 1 SIGKILLed: resumed after 43.4 s on the defaults, 14.4 s with
``--rdzv-conf last_call_timeout=1``, 14.9 s with the keep-alive settings added as well (5.9 s
under faultlab's launcher).

service_lost
    A ``service_kill`` took down a service the team runs beside the nodes (``target.services``:
    torchft's lighthouse), and the nodes' logs show a rank failing to reach it at its port
    afterwards: the job depended on one process that nothing restarts. Runs for any launcher.
abort_at_exit
    Not the launcher's but the trainer's, and seen under any launcher: a rank that finished cleanly
    died of SIGABRT at interpreter exit (``terminate called without an active exception`` in its
    node's log). torch 2.13's gloo race (docs/guides/in-rank-faults.md; pytorch/pytorch#190489,
    #117762): a gloo worker thread drops its last reference to a tensor during interpreter
    finalization, takes the GIL, and CPython 3.11 ends it with ``pthread_exit`` inside a
    ``noexcept`` destructor. The launcher restarts the group for a run that had finished.
    ``os._exit(0)`` after a clean finish (stdio flushed) avoids it, as does Python 3.14.
    faultlab keeps nothing alive that would hide it (``faultlab.runtime.interposer``).
native_crash
    Not the launcher's but the trainer process's, under any launcher: a rank died of a fatal
    signal (SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGSYS) that no fault of the run sent
    it, so the launcher restarted the group for a failure nobody injected. When glibc's heap
    checks stopped it (``malloc(): unaligned tcache chunk detected``, ``double free or
    corruption``, ...) the finding quotes the check: native code in that process (torch, a C
    extension) corrupted the heap, and the restart it cost belongs to no fault of the
    experiment. The torchelastic agent's line (``failed (exitcode: -6) local_rank: 0 (pid:
    18253)``) names the process; the run's own records name its rank and step. A rank an
    uncaught C++ exception took down (``terminate called after throwing``: NCCL's watchdog
    after a timeout or a lost peer) ended on purpose and is not one. There is no fix to run:
    the finding says how to catch the culprit (core dumps, ``gdb``). Seen once in a CI run of
    the reference trainer (rank 1 after its last step, torch 2.13 on gloo).
restart_hung
    The job restarted, then never trained again until faultlab stopped it at the timeout, under
    torchrun with the workers sharing the agent's store: torch 2.13's re-rendezvous can leave a new
    group disagreeing on its master port (docs/guides/torchrun-and-bar.md), and
    ``init_process_group`` waits out its timeout. The same ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    (measured with benchmarks/bench_launchers.py: the elastic rank kill that hung under torchrun's
    defaults resumed with it).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from faultlab.observe.launch_fixes import (
    NO_FIX,
    OWN_STORE_ENV,
    RECOMMENDED_RDZV_CONF,
    apply_fix,
    fix_yaml,
)
from faultlab.observe.records import FaultRecord
from faultlab.spec.launch import (
    BACKEND_FLAGS,
    CONF_FLAGS,
    flag_value,
    is_host_false,
    is_torchrun_like,
    launcher_index,
    service_placeholder,
)

__all__ = ["ABORT_AT_EXIT", "RECOMMENDED_RDZV_CONF", "LaunchFinding", "abort_at_exit",
           "launch_findings", "native_crash", "trainer_findings", "with_fix"]

ABORT_AT_EXIT = "terminate called without an active exception"
"""What a rank's log shows when torch 2.13's gloo race aborts it at interpreter exit."""

ABORT_AT_EXIT_RATE = ("measured on examples/fsdp2_dcp, fault-free, without the fix: 7 of 60 "
                      "plain torchrun runs on a loaded 2-core machine, 4 of 20 with gloo's "
                      "workers slowed further, 2 of 9 under ft_launcher; with the fix 0 of 40 "
                      "(benchmarks/bench_exit_abort.py)")
"""Its measured rate, for the finding's text (the benchmark prints the current figures)."""

_OWN_WORKER_STORE = (f"env {OWN_STORE_ENV}=1 in front of torchrun (a store of "
                     "the workers' own per round)")


@dataclass(frozen=True, slots=True)
class LaunchFinding:
    """One mechanism of the team's launcher seen at work in this run."""

    cause: str
    """``store_lost``, ``slow_rendezvous``, ``restart_hung``, ``stale_worker_store``,
    ``service_lost``, ``abort_at_exit`` or ``native_crash``."""
    text: str
    """What happened and why, in a sentence."""
    change: str
    """The setting that changes it."""
    affects: tuple[str, ...]
    """The SLAs whose verdict it explains."""
    fix: str = ""
    """The change as YAML to paste under ``target:`` (the team's line with it made), the
    change ``faultlab run --with-fix`` applies and proves (``faultlab.observe.launch_fixes``);
    empty when there is none."""
    no_fix: str = ""
    """Why there is no ``fix`` (empty when there is one)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _node_of(fault: FaultRecord) -> str | None:
    kind, _, value = fault.target.partition(" ")
    if kind == "node" and value.isdigit():
        return f"node{value}"
    node = (fault.details or {}).get("node")
    return str(node) if isinstance(node, str) else None


def _launcher_name(line: Sequence[str]) -> str:
    """``torchrun`` or ``ft_launcher`` (``python -m torch.distributed.run`` is torchrun)."""
    exe = line[launcher_index(line)].rsplit("/", 1)[-1]
    return exe if exe in ("torchrun", "ft_launcher") else "torchrun"


def _flag(line: Sequence[str], *names: str) -> str:
    """The value of the first of ``names`` in ``line`` ('' when absent)."""
    found = flag_value(line, names)
    return found[1] if found else ""


def launch_findings(launch: Mapping[str, Any] | None, faults: Sequence[FaultRecord],
                    logs: Mapping[str, str], *, hung_after_restart: bool = False,
                    services: Mapping[str, Sequence[str]] | None = None
                    ) -> list[LaunchFinding]:
    """The findings of one run (module docstring), each with its fix. ``launch`` is the run's
    ``run.launch`` (the line and what faultlab filled), ``logs`` each node's log text by node
    name; ``hung_after_restart``: faultlab stopped the job at its timeout with no step since
    its last restart; ``services``: the experiment's ``target.services``."""
    found = _findings(launch, faults, logs, hung_after_restart)
    line = (launch or {}).get("launch")
    return [with_fix(f, line if isinstance(line, list | tuple) else None, services or {})
            for f in found]


def with_fix(finding: LaunchFinding, line: Sequence[str] | None,
             services: Mapping[str, Sequence[str]]) -> LaunchFinding:
    """``finding`` with its fix (``faultlab.observe.launch_fixes``) or the reason for none."""
    fixed = apply_fix(finding.cause, line, services) if line is not None else None
    if fixed is not None:
        return replace(finding, fix=fix_yaml(services, fixed))
    why = NO_FIX.get(finding.cause) or (
        "no change of the launch line fixes it under ft_launcher 0.4.1 (its rendezvous "
        "handler hard-codes what would)" if line is not None and is_torchrun_like(line)
        and _launcher_name(line) == "ft_launcher" else "no change of the launch line to apply")
    return replace(finding, no_fix=why)


def _findings(launch: Mapping[str, Any] | None, faults: Sequence[FaultRecord],
              logs: Mapping[str, str], hung_after_restart: bool) -> list[LaunchFinding]:
    text = "\n".join(logs.values())
    out: list[LaunchFinding] = _service_lost(launch, faults, text)
    line = (launch or {}).get("launch")
    if not isinstance(line, list | tuple) or not is_torchrun_like(line):
        return out  # faultlab's own launcher, or a launcher whose mechanisms these are not
    line = [str(a) for a in line]
    name = _launcher_name(line)
    nvrx = name == "ft_launcher"
    conf = _flag(line, *CONF_FLAGS)
    c10d = (_flag(line, *BACKEND_FLAGS) or "static") == "c10d"
    env_fixed = any(a.startswith(f"{OWN_STORE_ENV}=1") for a in line)
    lost_nodes = [n for f in faults if f.declares("loses_node") and not f.details.get("error")
                  for n in [_node_of(f)] if n]
    if c10d and not is_host_false(line) and "node0" in lost_nodes \
            and "RendezvousConnectionError" in text:
        out.append(LaunchFinding(
            "store_lost",
            f"the c10d rendezvous store lived in node0's {name} agent (the agent that binds "
            "--rdzv-endpoint hosts it); node0's loss took the store, and the survivors' agents "
            "failed with RendezvousConnectionError: the job was lost with one node",
            "run the store outside the nodes: a TCPStore of your own as a service, "
            "--rdzv-conf is_host=false on every node (faultlab's launcher, launch: faultlab, "
            "does this) with the rendezvous settings of faultlab's launcher and "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, or an etcd "
            f"rendezvous (--rdzv-backend etcd-v2); no {name} flag alone moves it out of the "
            "agent (the fix below; faultlab run --with-fix proves it). That store is then the "
            "job's single point of failure (every agent reads it while the workers train): run "
            "it supervised or replicated",
            ("completes", "resume_time_s", "recovery_time_s", "lost_steps")))
    survivors = [n for n in logs if n not in lost_nodes]
    nnodes = _flag(line, "--nnodes").replace("{nnodes}",
                                                      str((launch or {}).get("filled", {})
                                                          .get("nnodes", "")))
    store_lost = "store_lost" in [f.cause for f in out]
    slow_loss = bool(lost_nodes and survivors and ":" in nnodes and not store_lost)
    if slow_loss and nvrx:
        last_call = "last_call_timeout" in conf
        out.append(LaunchFinding(
            "slow_rendezvous",
            f"after {', '.join(lost_nodes)} left, the survivors' re-rendezvous kept the dead "
            f"node as a participant until it missed 3 heartbeats of 5 s, which ft_launcher "
            f"(nvidia-resiliency-ext 0.4.1) hard-codes in its rendezvous handler"
            + ("" if last_call else ", then waited the last call of 30 s for it"),
            ("--rdzv-conf last_call_timeout=1 removes the last call; " if not last_call else "")
            + "no ft_launcher 0.4.1 flag shortens the keep-alive (keep_alive_* in --rdzv-conf "
            "are not read): measured 43.4 s on the defaults, 14.4 s with the last call at 1 s, "
            "5.9 s under faultlab's launcher (launch: faultlab)",
            ("resume_time_s", "recovery_time_s")))
    elif slow_loss and "last_call_timeout" not in conf:
        out.append(LaunchFinding(
            "slow_rendezvous",
            f"after {', '.join(lost_nodes)} left, the survivors' re-rendezvous ran on "
            f"torchrun's defaults: a last call of 30 s for the missing node, and a dead node "
            f"kept as a participant until 3 missed heartbeats of 5 s",
            f"--rdzv-conf {RECOMMENDED_RDZV_CONF} (faultlab's launcher's settings), with "
            f"{_OWN_WORKER_STORE}: with a last call of 1 s a node that starts more than a "
            f"second after the first joins a second round, and torch 2.13's shared worker "
            f"store leaves it waiting for MASTER_ADDR until its timeout",
            ("resume_time_s", "recovery_time_s")))
    if not env_fixed and not nvrx and hung_after_restart and not [f for f in out
                                                                 if f.cause != "service_lost"]:
        out.append(LaunchFinding(
            "restart_hung",
            "after the restart the new workers never trained again until the timeout: with "
            "the workers sharing torchrun's rendezvous store, torch 2.13's re-rendezvous can "
            "leave the new group disagreeing on its master port, and init_process_group waits "
            "out its timeout",
            _OWN_WORKER_STORE,
            ("completes", "resume_time_s", "recovery_time_s", "lost_steps")))
    if not env_fixed and not nvrx and "connectFullMesh failed" in text:
        out.append(LaunchFinding(
            "stale_worker_store",
            "after a restart a new worker failed to connect its process group to an address "
            "of the group before (Gloo connectFullMesh failed): the workers share torchrun's "
            "rendezvous store across restarts, and the restart cost one more attempt",
            _OWN_WORKER_STORE,
            ("max_restarts", "resume_time_s", "recovery_time_s")))
    return out


def abort_at_exit(logs: Mapping[str, str]) -> list[LaunchFinding]:
    """The ``abort_at_exit`` finding (module docstring) when a node's log shows the abort."""
    nodes = [node for node, text in logs.items() if ABORT_AT_EXIT in text]
    if not nodes:
        return []
    times = sum(text.count(ABORT_AT_EXIT) for text in logs.values())
    return [LaunchFinding(
        "abort_at_exit",
        f"{times} rank exit(s) on {', '.join(nodes)} died of SIGABRT at interpreter exit "
        f"({ABORT_AT_EXIT!r}): torch 2.13's gloo race at exit (pytorch/pytorch#190489, "
        f"#117762), which makes the launcher restart a group that had finished ("
        f"{ABORT_AT_EXIT_RATE})",
        "end the trainer with os._exit(0) after a clean finish, stdout and stderr flushed "
        "(sys.stdout.flush(); sys.stderr.flush(); os._exit(0)), or run it on Python 3.14",
        ("golden_run_fault_free", "max_restarts", "completes", "resume_time_s",
         "recovery_time_s", "survivor_restarts"), no_fix=NO_FIX["abort_at_exit"])]


# torchelastic's line for a worker that died: "failed (exitcode: -6) local_rank: 0 (pid: 18253)"
_WORKER_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) "
                            r"\(pid: (?P<pid>\d+)\)")
# glibc's malloc_printerr and the stack protector: the heap or a stack was found corrupted.
_HEAP_CHECK = re.compile(r"^(?:(?:malloc|free|realloc|calloc|malloc_consolidate|munmap_chunk|"
                         r"_int_malloc|_int_free|tcache_thread_shutdown)\(\): .+|"
                         r"double free or corruption.*|corrupted (?:size|double-linked).*|"
                         r"\*\*\* stack smashing detected \*\*\*.*)$")
# std::terminate on an uncaught C++ exception: NCCL's watchdog ends a rank this way when a
# collective times out or a peer is gone (a fault's consequence, not a crash of its own).
_THROWN = "terminate called after throwing"
_TEE_PREFIX = re.compile(r"^\[[\w.-]+\]:\s*")
_CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                            signal.SIGILL, signal.SIGSYS})


def _struck_pids(faults: Sequence[FaultRecord]) -> set[int]:
    """Every pid a fault of the run names in its details (``pids``, ``pids_by_rank`` ...)."""
    out: set[int] = set()

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k) if "pid" in str(k) else key)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v, key)
        elif "pid" in key and isinstance(value, int) and not isinstance(value, bool):
            out.add(value)

    for f in faults:
        walk(f.details or {}, "")
    return out


def native_crash(logs: Mapping[str, str], faults: Sequence[FaultRecord] = (),
                 events: Sequence[Mapping[str, Any]] = ()) -> list[LaunchFinding]:
    """The ``native_crash`` finding (module docstring): each worker a node's agent reported dead
    of a fatal signal that no fault of the run sent (``faults``: the run's records; their pids
    are excluded), with the heap check glibc printed before it, if any. ``events`` (the run's
    records, with ``pid``, ``rank`` and ``step``) name the rank and its last step. An abort at
    interpreter exit is ``abort_at_exit``'s, and a rank that an uncaught C++ exception took down
    (``terminate called after throwing``: NCCL's watchdog after a timeout or a lost peer) ended
    on purpose: neither is this."""
    struck = _struck_pids(faults)
    by_pid: dict[int, dict[str, Any]] = {}
    for e in events:
        pid = e.get("pid")
        if isinstance(pid, int):
            seen = by_pid.setdefault(pid, {"rank": e.get("rank"), "step": None})
            if isinstance(e.get("step"), int) and e.get("kind") == "step":
                seen["step"] = e["step"]
    crashes: list[str] = []
    heap = False  # glibc's heap check stopped one of them
    for node, text in logs.items():
        check = ""
        for line in text.splitlines():
            line = _TEE_PREFIX.sub("", line.strip())  # torchrun --tee: "[default1]:..."
            if _HEAP_CHECK.match(line):
                check = line
                continue
            if ABORT_AT_EXIT in line:
                check = ABORT_AT_EXIT
                continue
            if line.startswith(_THROWN):  # a C++ exception taking the process down on purpose
                check = _THROWN
                continue
            m = _WORKER_FAILED.search(line)
            if m is None:
                continue
            code, pid, found, check = int(m["code"]), int(m["pid"]), check, ""
            try:
                sig = signal.Signals(-code)
            except ValueError:
                continue
            if sig not in _CRASH_SIGNALS or pid in struck or found in (ABORT_AT_EXIT, _THROWN):
                continue
            who = by_pid.get(pid, {})
            rank = f"rank {who['rank']}" if who.get("rank") is not None \
                else f"local rank {m['local']}"
            step = f" after step {who['step']}" if who.get("step") is not None else ""
            crashes.append(f"{rank} on {node} (pid {pid}) died of {sig.name}{step}"
                           + (f", glibc: {found!r}" if found else ""))
            heap = heap or bool(found)
    if not crashes:
        return []
    return [LaunchFinding(
        "native_crash",
        f"{'; '.join(crashes)}: no fault of this run sent that signal, so the launcher "
        f"restarted the group for a failure nobody injected"
        + (" (glibc found the heap corrupted: native code in that process, torch or a C "
           "extension, wrote where it must not)" if heap else ""),
        "not the launcher's: catch the culprit with core dumps (ulimit -c unlimited before "
        "the launch; gdb -batch -ex 'thread apply all bt' PYTHON CORE) and rerun the "
        "experiment with --repeat to measure its rate",
        ("golden_run_fault_free", "max_restarts", "completes", "resume_time_s",
         "recovery_time_s", "survivor_restarts", "survivor_lost_steps", "lost_steps"),
        no_fix=NO_FIX["native_crash"])]


def trainer_findings(logs: Mapping[str, str], faults: Sequence[FaultRecord] = (),
                     events: Sequence[Mapping[str, Any]] = ()) -> list[LaunchFinding]:
    """The findings of the trainer's own process, seen under any launcher: ``abort_at_exit``
    and ``native_crash`` (their arguments)."""
    return abort_at_exit(logs) + native_crash(logs, faults, events)


def _service_lost(launch: Mapping[str, Any] | None, faults: Sequence[FaultRecord],
                  text: str) -> list[LaunchFinding]:
    filled = (launch or {}).get("filled") or {}
    out = []
    for f in faults:
        name = (f.details or {}).get("service")
        if not f.declares("kills_service") or f.details.get("error") \
                or not isinstance(name, str):
            continue
        port = str(filled.get(service_placeholder(name), ""))
        # host:port (gloo, gRPC), or port=NNNN (urllib3, the etcd client)
        if not port or not any((f":{port}" in line or f"port={port}" in line)
                               and ("connect" in line.lower() or "error" in line.lower())
                               for line in text.splitlines()):
            continue
        out.append(LaunchFinding(
            "service_lost",
            f"the job depended on its service {name!r} (port {port}), which nothing restarts: "
            f"after it was killed the ranks failed to reach it, and no restart of theirs "
            f"could bring it back",
            f"run {name!r} under a supervisor that restarts it at the same address, or "
            f"replicated where the stack allows it (faultlab did not measure whether the "
            f"ranks rejoin a restarted {name!r})",
            ("completes", "survivor_restarts", "survivor_lost_steps", "resume_time_s",
             "recovery_time_s", "lost_steps")))
    return out

"""The engine's control-plane cost as the job grows to thousands of ranks (issue 37).

Three tables, in one run, for 8, 128, 1,024 and 4,096 ranks (``--ranks``; ``--tables``).

**The engine's per-loop cost** (the first table). Simulated ranks, without torch: one events
file per rank in a run directory on this machine's disk, each line a record as
``faultlab.runtime.events`` writes it (a start, then a step per second). The real
``faultlab.observe.EventStream`` reads them, as the engine does every 50 ms:

- **one poll, one new step from every rank**: the directory scan, a ``stat`` per file and the
  new bytes read;
- **an idle poll** (nothing new);
- the engine's per-loop questions, **before and after** in one run, ``steps`` steps into the
  job: a planned runtime fault that has not struck yet (the engine asks every loop whether a
  rank reported it: before, a scan of every record; now ``EventStream.first``), the reaction
  check of a fault lifted at the job's first reaction (before, every record since the fault,
  newest first; now ``EventStream.reacted_since``), and a counting trigger
  (``after_event`` with a match: before, every record of its kind; now a cursor). "Before" is
  the code of commit 03f7da8, kept here as it was, so the two are timed on the same stream.

**The control plane, before and after the node relay** (the second table). Simulated ranks run
faultlab's real runtime code, packed many to a process: worker processes (this file's hidden
``_sim-ranks`` sub-command) hold ``--ranks-per-worker`` (64) ranks each, one thread per rank,
every node's ranks in one worker (with 256 threads a process, the GIL's convoy in the workers,
not faultlab, set the gate release at 1,024 ranks); ``--ranks-per-node`` (8) ranks make a
node. The main process holds only the engine's side. Per rank count, both control planes:

- **before** (per-rank files, ``FAULTLAB_CHANNEL`` unset in the workers): each rank's
  ``EventLog`` appends to its own file under ``RUN_DIR/events``; a rank at a gate polls for
  ``runtime/gates/step{N}`` every 2 ms (``StepGates.wait``); the engine is ``EventStream.poll``
  every 50 ms, and opens gates with ``open_gate``.
- **after** (the node relay, socket channel): each rank's ``EventLog`` sends through an
  ``Uplink`` of its own (one connection per rank, as one process per rank has) to its node's
  relay, which the first rank of the node starts (``python -m faultlab.runtime.relay``, one
  per node); a rank at a gate waits in ``Uplink.wait_gate`` (what ``StepGates.wait`` runs
  when the channel is set); the engine is a ``Hub`` with ``EventStream.attach(hub)``, polled
  every 50 ms, and opens gates with ``Hub.open_gate``.
- **file** (the node relay, file channel: ``run.control_channel: file``, or a cluster whose
  nodes cannot reach the submit host): the same ranks and relays, without a hub; each relay's
  file is the channel, which the engine's ``EventStream`` reads every 50 ms, and the engine
  opens gates with ``open_gate`` (``runtime/gates.txt``, which a relay reads every 0.1 s while
  a rank waits). ``--planes`` picks the planes (before and after for this table by default,
  all three for the metadata table).

Measured, each rank stepping once a second, its steps spread over the second (rank r at
``r x 0.618`` mod 1 s: a node's ranks do not step together):

- **engine CPU**: ``time.process_time()`` of the main process (the poll loop, and the hub's
  thread after) over ``--seconds`` of job, over the wall time: per cent of one core;
- **event latency**: ``time.time()`` when ``EventStream.poll`` returned a step record, minus
  its ``t`` (``time.time()`` at the rank's emit), p50 and p99 over every step of the window;
- **gate release**: ``--gates`` gates; every rank emits a step, waits at its gate, and emits
  ``gate_passed`` right after the wait returns; the engine opens the gate once it has seen
  that step from every rank. Release = the last rank's pass ``t`` minus the open; p50 and p99
  over the gates (of 5 gates, p99 is the worst), and p99 of every rank's own pass delay;
- **one poll, one new step from every rank**: every rank emits one step at once; once the
  files are written (before) or the hub has had every relay's batch (after), one timed
  ``EventStream.poll``; median of 5;

**Metadata operations on the run directory** (the third table, ``--tables meta``; issue 53):
before, after (socket channel) and file (``--planes``), in steady training, counted. A fresh
job of the control plane (engine, workers, relays) is started under ``strace -f
--seccomp-bpf -y`` (only the counted calls stop a process; the ranks' other calls run at full
speed): ``--meta-seconds`` of stepping with the ranks spread over the second, then as many
with the ranks in lockstep (data-parallel training: a node's ranks step within a few
milliseconds of each other). Counted: every ``openat``, ``stat``-family call (``fstat`` on an
open file included), ``access``, ``getdents64``, ``mkdir``... whose path or file descriptor is
under the run directory. On NFS or Lustre each may be a request to the metadata server (an
attribute cache absorbs some, an ``fstat`` right after its ``open`` nearly always: an upper
bound); ``close``, ``write`` and ``fdatasync`` are not counted. Each counted call stops its
process until strace has printed it, which slows whoever makes many: so the ranks' and
relays' calls are counted until the engine has every record of the window's steps (none is
lost to the slowdown), per second of job; the engine's during the window. "Before"'s engine,
one ``stat`` per rank per poll, then polls less often than its 20 times a second: its count
is a lower bound, and the notes say how much slower it polled. (strace 6.1's
``--seccomp-bpf`` also stops a new thread at every call until it makes a traced one: the
traced job's threads each ``stat`` ``/`` first.) Per node per second; by default up to 1,024
ranks (``--meta-max-ranks``): at 4,096 the traced jobs alone take minutes here.

Measured on one machine, so what it does not show: a shared filesystem's own delays (NFS
attribute caching makes a new gate file or new appended bytes invisible for up to a minute;
a relay's ``fdatasync`` of its events file, a second after a batch, is a round trip to the file
server there), the network between the nodes and the submit host, and
ranks and relays on cores of their own. Here thousands of threads and hundreds of relay
processes share 2 cores: from 1,024 ranks on, "before"'s ranks poll the gate files half a
million times a second and more between them, which saturates the machine, and "after"'s
gate release waits for 128 or 512 relay processes to be scheduled, one after the other; both
gate releases then measure this machine's CPU more than a cluster's control plane. At 4,096
ranks with 8 a node the run starts 512 relay processes (about 11 MiB and 60 ms of CPU each:
some 6 GiB, and half a minute on 2 cores; 128 came up in 6 s) and 64 workers; 10,240 ranks
(1,280 relays, 14 GiB of relays alone) does not fit this machine's memory and time, and is
not in the default sizes: ``--ranks 10240 --ranks-per-node 32`` asks for it on a bigger one.

    python benchmarks/bench_scale.py [--ranks 8,128,1024,4096] [--steps 500]
        [--ranks-per-node 8] [--ranks-per-worker 64] [--seconds 6] [--meta-seconds 3]
        [--gates 5] [--meta-max-ranks 1024] [--tables loop,control,meta]
        [--planes before,after,file]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _strace import calls_on
from _table import print_table

from faultlab.observe.stream import EventStream


def _line(t: float, kind: str, rank: int, **fields: Any) -> str:
    return json.dumps({"t": t, "kind": kind, "rank": rank, "world_size": 0, "pid": 1000 + rank,
                       "restart": 0, "node": f"node{rank // 8}", **fields}) + "\n"


def _write(events: Path, ranks: int, steps: int) -> None:
    events.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        lines = [_line(0.0 + r * 1e-6, "start", r)]
        lines += [_line(float(s) + r * 1e-6, "step", r, step=s, loss=1.0 / s)
                  for s in range(1, steps + 1)]
        (events / f"rank{r}.jsonl").write_text("".join(lines))


def _append_step(events: Path, ranks: int, step: int) -> None:
    for r in range(ranks):
        with open(events / f"rank{r}.jsonl", "a") as f:
            f.write(_line(float(step) + r * 1e-6, "step", r, step=step, loss=1.0 / step))


# --- before: the engine's helpers as of 03f7da8, verbatim in what they do ----------------------

def _struck_before(events: list[dict[str, Any]], fault_id: str) -> bool:
    hits = [e for e in events
            if e.get("kind") == "fault_injected" and e.get("fault_id") == fault_id]
    return bool(hits)


def _reacted_before(events: list[dict[str, Any]], since_t: float, known_pids: set[int]) -> bool:
    for e in reversed(events):
        if e["t"] <= since_t:
            return False
        kind = e.get("kind")
        if kind == "anomaly" or kind == "checkpoint_loaded":
            return True
        if kind == "exit" and e.get("reason") not in ("completed", "stopped"):
            return True
        if kind == "start" and e.get("pid") not in known_pids:
            return True
    return False


def _count_before(by_kind: list[dict[str, Any]], **match: Any) -> int:
    return sum(1 for r in by_kind if all(k in r and r[k] == v for k, v in match.items()))


def _ms(fn: Any, repeat: int = 5) -> float:
    """The median wall time of ``fn()`` in ms over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(ranks: int, steps: int, tmp: Path) -> list[str]:
    events = tmp / f"r{ranks}" / "events"
    _write(events, ranks, steps)
    stream = EventStream(events)
    stream.poll()  # the backlog, once
    step = steps + 1

    def new_step() -> None:
        nonlocal step
        _append_step(events, ranks, step)
        step += 1

    polls = []
    for _ in range(5):
        new_step()
        t0 = time.perf_counter()
        got = stream.poll()
        polls.append((time.perf_counter() - t0) * 1000)
        assert len(got) == ranks, (len(got), ranks)
    idle = _ms(stream.poll)
    # the fault lifted at the first reaction was injected at step `steps - 10`: before scans
    # every record since; a planned fault that has not struck: before scans every record
    known = {1000 + r for r in range(ranks)}
    since = float(steps - 10)
    evs = stream.events
    steps_of = list(stream.of_kind("step"))
    assert not _reacted_before(evs, since, known) and not stream.reacted_since(since, known)
    stream.first("fault_injected", fault_id="f")  # its cursor, as after the first loop
    stream.count("step", rank=0)
    return [f"{ranks:,}", f"{len(evs):,}", f"{statistics.median(polls):.1f}", f"{idle:.2f}",
            f"{_ms(lambda: _struck_before(evs, 'f')):.1f}",
            f"{_ms(lambda: stream.first('fault_injected', fault_id='f')):.3f}",
            f"{_ms(lambda: _reacted_before(evs, since, known)):.1f}",
            f"{_ms(lambda: stream.reacted_since(since, known)):.3f}",
            f"{_ms(lambda: _count_before(steps_of, rank=0)):.1f}",
            f"{_ms(lambda: stream.count('step', rank=0)):.3f}"]


# --- the control plane, before and after the node relay: simulated ranks ------------------------

SIM_COMMAND = "_sim-ranks"
META_COMMAND = "_meta-run"
SECRET = "bench-scale-secret"
ENGINE_POLL_S = 0.05
"""The engine's sleep between polls (``faultlab.engine.runner``'s ``poll_s``)."""
GATE_TIMEOUT_S = 120.0
GATE_PERIOD_S = 1.0
GATE_SPREAD_S = 0.2
BURSTS = 5
GOLDEN = 0.6180339887498949
CHANNEL_VARS = ("FAULTLAB_CHANNEL", "FAULTLAB_HUB")
PLANES = {"before": "before", "after": "after, socket channel",
          "file": "after, file channel"}
"""The control planes, as the table names them; "after" and "file" run node relays."""
META_TRACE = "trace=%file,%%stat,getdents64"
# the first step number of each phase: the engine tells the phases' records apart by them
STEADY, META_SPREAD, META_LOCKSTEP, GATE, BURST = 1, 100_001, 200_001, 300_001, 400_001
GOAL_POLL_MS, GOAL_GATE_P99_MS, GOAL_LATENCY_P99_MS, GOAL_META_PER_NODE_S = 10.0, 50.0, 100.0, 1.0
DEFAULT_SIZES = [8, 128, 1024, 4096]
META_MAX_RANKS = 1024
"""By default metadata calls are counted up to 1,024 ranks: at 4,096 the traced jobs alone
take minutes here."""
CONTROL_PLANES = ("before", "after")
META_PLANES = ("before", "after", "file")


def _log(msg: str) -> None:
    print(f"[bench_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _offset(rank: int) -> float:
    """Where in each second rank ``rank`` steps: spread evenly, whatever the rank count."""
    return (rank * GOLDEN) % 1.0


def _sleep_until(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


def _pct(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (nan for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def _is_step(record: dict[str, Any], first: int, count: int, kind: str = "step") -> bool:
    step = record.get("step")
    return record.get("kind") == kind and isinstance(step, int) and first <= step < first + count


# the worker: simulated ranks, one thread each per phase -----------------------------------------

class _Sim:
    __slots__ = ("log", "node", "rank", "uplink")

    def __init__(self, rank: int, node: str, log: Any, uplink: Any) -> None:
        self.rank, self.node, self.log, self.uplink = rank, node, log, uplink


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _threads(sims: list[_Sim], fn: Callable[[_Sim], None]) -> list[str]:
    """Run ``fn`` for every rank at once, one thread each; the errors."""
    errors: list[str] = []

    def body(sim: _Sim) -> None:
        try:
            fn(sim)
        except Exception as e:  # reported to the engine's side, which fails the measurement
            errors.append(f"rank {sim.rank}: {e!r}")

    threads = [threading.Thread(target=body, args=(s,), daemon=True) for s in sims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _orphan_guard() -> None:
    """Leave at once when the benchmark's main process is gone (killed, not just stopped)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _prime_threads() -> None:
    """Under ``strace -f --seccomp-bpf`` (strace 6.1), a new thread stops at every system call
    until it makes one of the traced ones: 8 threads sleeping in a loop ran 20 times slower.
    So every thread started from now on makes one at once (a ``stat`` of ``/``, outside the
    run directory: not counted)."""
    def prime(frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        os.stat("/")

    threading.setprofile(prime)


def _sim_ranks(cfg_json: str) -> int:
    """A worker process: ``count`` simulated ranks from ``first``, running faultlab's runtime
    code; commands from the engine's side on stdin, one JSON line each, each answered on stdout
    when every rank is done with it."""
    from faultlab.runtime.events import EventLog
    from faultlab.runtime.gates import StepGates
    from faultlab.runtime.uplink import Uplink

    cfg = json.loads(cfg_json)
    if cfg["traced"]:
        _prime_threads()
    _orphan_guard()
    run_dir, after = Path(cfg["run_dir"]), cfg["mode"] in ("after", "file")
    # unset here, so that EventLog and StepGates find no per-process uplink (uplink_for):
    # before, they write and poll files; after, each rank gets an Uplink of its own
    assert not any(os.environ.get(k) for k in CHANNEL_VARS)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(256 << 10)
    env = {**os.environ, "FAULTLAB_RUN_DIR": str(run_dir), "FAULTLAB_RUNTIME_SECRET": SECRET,
           "FAULTLAB_CHANNEL": "file" if cfg["mode"] == "file" else "socket",
           "FAULTLAB_HUB": cfg.get("hub") or ""}
    sims: list[_Sim] = []
    for rank in range(cfg["first"], cfg["first"] + cfg["count"]):
        node = f"node{rank // cfg['rpn']}"
        log = EventLog(run_dir / "events", rank=rank, world_size=cfg["world"], node=node,
                       restart=0)
        uplink = None
        if after:  # one connection per rank, as one process per rank has
            uplink = Uplink(run_dir, node, SECRET, rank=rank, env=env)
            log._uplink = uplink  # what EventLog.__init__ sets from uplink_for in a real rank
        sims.append(_Sim(rank, node, log, uplink))
    gates = StepGates(run_dir, range(GATE, GATE + 1000), timeout_s=GATE_TIMEOUT_S)

    def wait(sim: _Sim, step: int) -> tuple[float, bool]:
        if sim.uplink is not None:  # what StepGates.wait calls when the channel is set
            return sim.uplink.wait_gate(step, GATE_TIMEOUT_S, None, 0.5)
        got = gates.wait(step)  # the gate file, polled every 2 ms
        assert got is not None
        return got

    def steps(sim: _Sim, cmd: dict[str, Any]) -> None:
        off = 0.0 if cmd["lockstep"] else _offset(sim.rank)
        for i in range(cmd["count"]):
            _sleep_until(cmd["t0"] + i + off)
            sim.log.emit("step", step=cmd["first"] + i, loss=1.0, step_time_s=1.0)

    def gate_steps(sim: _Sim, cmd: dict[str, Any]) -> None:
        off = _offset(sim.rank) * GATE_SPREAD_S
        for i, step in enumerate(cmd["steps"]):
            _sleep_until(cmd["t0"] + i * GATE_PERIOD_S + off)
            sim.log.emit("step", step=step, loss=1.0, step_time_s=1.0)
            waited, opened = wait(sim, step)
            sim.log.emit("gate_passed", step=step, waited_s=waited, opened=opened)

    def start(node_sims: list[_Sim]) -> None:
        for sim in node_sims:  # after: the node's first rank starts its relay
            sim.log.emit("start", resumed_from_step=0)

    by_node: dict[str, list[_Sim]] = defaultdict(list)
    for sim in sims:
        by_node[sim.node].append(sim)
    try:
        with ThreadPoolExecutor(cfg["starting"]) as pool:  # 16 relays start at a time at most
            list(pool.map(start, by_node.values()))
        relays = sorted({s.uplink.spawned.pid for s in sims
                         if s.uplink is not None and s.uplink.spawned is not None})
        _reply({"op": "ready", "relays": relays,
                "down": sum(1 for s in sims if s.uplink is not None and s.uplink.down)})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "burst":  # one step from every rank, at once
                errors = _threads(sims, lambda s, c=cmd: s.log.emit(
                    "step", step=c["step"], loss=1.0, step_time_s=1.0))
            elif cmd["op"] == "steps":
                errors = _threads(sims, lambda s, c=cmd: steps(s, c))
            else:
                errors = _threads(sims, lambda s, c=cmd: gate_steps(s, c))
            _reply({"op": cmd["op"], "errors": errors[:3], "n_errors": len(errors),
                    "down": sum(1 for s in sims if s.uplink is not None and s.uplink.down)})
    except KeyboardInterrupt:
        return 130
    finally:
        for sim in sims:
            sim.log.close()
            if sim.uplink is not None:
                sim.uplink.close()
    return 0


# the engine's side ----------------------------------------------------------------------------

class _Workers:
    """The worker processes of one control plane: started, commanded, and always stopped."""

    def __init__(self, run_dir: Path, mode: str, ranks: int, rpn: int, per_worker: int,
                 hub: str | None, traced: bool) -> None:
        nodes = math.ceil(ranks / rpn)
        per = max(1, per_worker // rpn)  # nodes a worker
        env = {k: v for k, v in os.environ.items() if k not in CHANNEL_VARS}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._buf: dict[int, bytes] = {}
        starting = max(1, 16 // math.ceil(nodes / per))  # relays a worker starts at once
        for first_node in range(0, nodes, per):
            first = first_node * rpn
            cfg = {"run_dir": str(run_dir), "mode": mode, "first": first,
                   "count": min(ranks, (first_node + per) * rpn) - first, "world": ranks,
                   "rpn": rpn, "hub": hub, "starting": starting, "traced": traced}
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), SIM_COMMAND,
                                  json.dumps(cfg)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, env=env)
            self.procs.append(p)
            self._buf[p.pid] = b""

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, **cmd: Any) -> None:
        data = (json.dumps(cmd) + "\n").encode()
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(data)
            p.stdin.flush()

    def replies(self, timeout_s: float) -> list[dict[str, Any]]:
        """One answer from every worker; RuntimeError if one failed or did not answer."""
        deadline = time.monotonic() + timeout_s
        out: dict[int, dict[str, Any]] = {}
        while len(out) < len(self.procs):
            waiting = []
            for p in self.procs:
                if p.pid in out:
                    continue
                line, nl, rest = self._buf[p.pid].partition(b"\n")
                if nl:
                    self._buf[p.pid] = rest
                    out[p.pid] = json.loads(line)
                else:
                    waiting.append(p)
            if not waiting:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{len(waiting)} simulated-rank workers did not answer in "
                                   f"{timeout_s:.0f} s")
            readable, _, _ = select.select([p.stdout for p in waiting], [], [], left)
            for p in waiting:
                if p.stdout in readable:
                    chunk = os.read(p.stdout.fileno(), 1 << 16)  # type: ignore[union-attr]
                    if not chunk:
                        raise RuntimeError(f"worker {p.pid} exited (code {p.wait()})")
                    self._buf[p.pid] += chunk
        answers = [out[p.pid] for p in self.procs]
        errors = [e for a in answers for e in a.get("errors", [])]
        if errors:
            raise RuntimeError(f"{sum(a['n_errors'] for a in answers)} simulated ranks failed, "
                               f"e.g. {errors[0]}")
        return answers

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError, ValueError):
                assert p.stdin is not None
                p.stdin.write(b'{"op": "quit"}\n')
                p.stdin.close()
        deadline = time.monotonic() + 5.0
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _stop_relays(pids: set[int], bye: bool = True) -> list[int]:
    """Wait for the relays the run started to leave (the hub said ``bye``); the ones that did
    not within 5 s are ended here, by pid. Returns those. Without a hub (``bye`` False: the
    file channel, whose relays stay ``IDLE_S`` after their last rank) they are ended at once,
    and none is returned."""
    deadline = time.monotonic() + (5.0 if bye else 0.0)
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    stuck = [p for p in pids if _alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL) if bye else (signal.SIGKILL,):
        for p in stuck:
            with contextlib.suppress(OSError):
                os.kill(p, sig)
        deadline = time.monotonic() + 3.0
        while any(_alive(p) for p in stuck) and time.monotonic() < deadline:
            time.sleep(0.05)
    return stuck if bye else []


def _count_meta(trace: Path, root: str, windows: list[tuple[float, float, float]],
                engine: set[int]) -> list[tuple[Counter[str], Counter[str]]]:
    """Per window ``(t0, end, done)``: the calls on ``root`` by name, of the ranks and relays
    from ``t0`` until ``done``, and of the engine (the threads ``engine``) until ``end``."""
    out: list[tuple[Counter[str], Counter[str]]] = [(Counter(), Counter()) for _ in windows]
    for tid, t, call, _ in calls_on(trace, root):
        by_engine = tid in engine
        for (t0, end, done), (nodes, eng) in zip(windows, out, strict=True):
            if t0 <= t < (end if by_engine else done):
                (eng if by_engine else nodes)[call] += 1
    return out


class _Engine:
    """The engine's loop: ``EventStream.poll``, look at what came, sleep 50 ms."""

    def __init__(self, stream: EventStream) -> None:
        self.stream, self.polls = stream, 0

    def run(self, on_new: Callable[[list[dict[str, Any]], float], None], until: float,
            done: Callable[[], bool] | None = None) -> None:
        while time.time() < until and not (done is not None and done()):
            new = self.stream.poll()
            got = time.time()
            self.polls += 1
            if new:
                on_new(new, got)
            if done is not None and done():
                return
            time.sleep(ENGINE_POLL_S)


def _lead(ranks: int) -> float:
    """How far ahead a phase starts: time for the workers to start a thread per rank."""
    return 1.0 + ranks / 2000


def _steady(eng: _Engine, workers: _Workers, ranks: int, seconds: int) -> dict[str, Any]:
    """Engine CPU and event latency over ``seconds`` of one step a second per rank."""
    latency: list[float] = []

    def on_new(new: list[dict[str, Any]], got: float) -> None:
        latency.extend(got - r["t"] for r in new if _is_step(r, STEADY, seconds))

    t0 = time.time() + _lead(ranks)
    workers.send(op="steps", t0=t0, first=STEADY, count=seconds, lockstep=False)
    eng.run(on_new, t0)
    cpu0, wall0, polls0 = time.process_time(), time.monotonic(), eng.polls
    eng.run(on_new, t0 + seconds)
    wall = time.monotonic() - wall0
    cpu, polls_per_s = (time.process_time() - cpu0) / wall, (eng.polls - polls0) / wall
    eng.run(on_new, t0 + seconds + 60, done=lambda: len(latency) >= ranks * seconds)
    workers.replies(60)
    if len(latency) < ranks * seconds:
        raise RuntimeError(f"the engine got {len(latency)} of {ranks * seconds} step records")
    return {"cpu": cpu, "polls_per_s": polls_per_s, "lat_p50": _pct(latency, 50) * 1000,
            "lat_p99": _pct(latency, 99) * 1000}


def _stepping(eng: _Engine, workers: _Workers, ranks: int, seconds: int, first: int,
              lockstep: bool, t0: float) -> dict[str, float]:
    """``seconds`` of steps from ``t0``, the engine polling until it has every record: when
    that was (``done``), its polls from ``t0`` to then, and its polls a second until
    ``t0 + seconds``."""
    seen = [0]

    def on_new(new: list[dict[str, Any]], got: float) -> None:
        seen[0] += sum(1 for r in new if _is_step(r, first, seconds))

    workers.send(op="steps", t0=t0, first=first, count=seconds, lockstep=lockstep)
    eng.run(on_new, t0)
    before = eng.polls
    eng.run(on_new, t0 + seconds)
    rate = (eng.polls - before) / seconds
    eng.run(on_new, t0 + seconds + 120, done=lambda: seen[0] >= ranks * seconds)
    done = time.time()
    workers.replies(120)
    return {"t0": t0, "end": t0 + seconds, "done": done, "polls": eng.polls - before,
            "rate": rate}


def _windows(eng: _Engine, workers: _Workers, ranks: int, seconds: int) -> dict[str, Any]:
    """The metadata phase (in the process strace started): ``seconds`` with the ranks spread
    over each second, then ``seconds`` in lockstep; the windows, and the engine's threads."""
    out: dict[str, Any] = {"windows": [], "engine": _tasks(os.getpid())}
    for first, lockstep in ((META_SPREAD, False), (META_LOCKSTEP, True)):
        t0 = time.time() + _lead(ranks) + 1.0
        out["windows"].append(_stepping(eng, workers, ranks, seconds, first, lockstep, t0))
    return out


def _gates(eng: _Engine, workers: _Workers, ranks: int, gates: int,
           open_gate_fn: Callable[[int], None]) -> dict[str, Any]:
    """``gates`` gates: each opened once every rank reported its step; when each rank passed."""
    steps = list(range(GATE, GATE + gates))
    arrived: Counter[int] = Counter()
    passed: dict[int, list[float]] = defaultdict(list)
    opened: dict[int, float] = {}
    timed_out = [0]

    def on_new(new: list[dict[str, Any]], got: float) -> None:
        for r in new:
            if _is_step(r, GATE, gates):
                arrived[r["step"]] += 1
            elif _is_step(r, GATE, gates, kind="gate_passed"):
                passed[r["step"]].append(r["t"])
                timed_out[0] += not r.get("opened")
        for step in steps:
            if step not in opened and arrived[step] >= ranks:
                opened[step] = time.time()
                open_gate_fn(step)

    t0 = time.time() + _lead(ranks)
    workers.send(op="gates", t0=t0, steps=steps)
    eng.run(on_new, t0 + gates * GATE_PERIOD_S + GATE_TIMEOUT_S + 30,
            done=lambda: all(len(passed[s]) >= ranks for s in steps))
    workers.replies(60)
    if timed_out[0] or any(len(passed[s]) < ranks or s not in opened for s in steps):
        raise RuntimeError(f"gates: {timed_out[0]} waits timed out; passes "
                           f"{[len(passed[s]) for s in steps]} of {ranks} each")
    release = [max(passed[s]) - opened[s] for s in steps]
    each = [t - opened[s] for s in steps for t in passed[s]]
    return {"gate_p50": _pct(release, 50) * 1000, "gate_p99": _pct(release, 99) * 1000,
            "pass_p50": _pct(each, 50) * 1000, "pass_p99": _pct(each, 99) * 1000}


def _hub_quiet(hub: Any, quiet_s: float, timeout_s: float) -> None:
    """Until no relay has pushed a byte for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        total = sum(info.bytes for info in list(hub.relays.values()))
        if total != last:
            last, since = total, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.02)


def _files_quiet(events: Path, quiet_s: float, timeout_s: float) -> None:
    """Until no events file under ``events`` has grown for ``quiet_s`` (the relays wrote)."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        total = sum(e.stat().st_size for e in os.scandir(events) if e.name.endswith(".jsonl"))
        if total != last:
            last, since = total, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.02)


def _burst(stream: EventStream, workers: _Workers, ranks: int, hub: Any,
           relays_write: bool) -> dict[str, Any]:
    """One timed poll with one new step from every rank waiting (files written by the ranks
    or, ``relays_write``, by their relays, or every relay's batch queued in the hub); the
    median of ``BURSTS``."""
    samples: list[float] = []
    for i in range(BURSTS * 2):
        if len(samples) >= BURSTS:
            break
        step = BURST + i
        workers.send(op="burst", step=step)
        workers.replies(60)
        if hub is not None:
            _hub_quiet(hub, 0.3, 30)
        elif relays_write:
            _files_quiet(stream.events_dir, 0.3, 30)
        t0 = time.perf_counter()
        new = stream.poll()
        ms = (time.perf_counter() - t0) * 1000
        got = sum(1 for r in new if _is_step(r, step, 1))
        if got == ranks:
            samples.append(ms)
            continue
        deadline = time.monotonic() + 30  # not all there yet: not a sample; take the rest
        while got < ranks and time.monotonic() < deadline:
            time.sleep(0.05)
            got += sum(1 for r in stream.poll() if _is_step(r, step, 1))
    return {"poll_ms": statistics.median(samples) if samples else math.nan,
            "poll_samples": len(samples)}


class _Plane:
    """One control plane at work: the engine's side in this process, the simulated ranks (and,
    after, their relays) in worker processes. Leaving it, even on Ctrl-C, the hub says bye,
    the workers are stopped, and every relay is gone (:attr:`relays_killed`: the ones that had
    to be ended here)."""

    def __init__(self, mode: str, ranks: int, rpn: int, per_worker: int, run_dir: Path,
                 traced: bool = False) -> None:
        self.mode, self.ranks, self.rpn, self.per_worker = mode, ranks, rpn, per_worker
        self.traced = traced
        self.run_dir = run_dir
        self.nodes = math.ceil(ranks / rpn)
        self.stream = EventStream(run_dir)
        self.eng = _Engine(self.stream)
        self.hub: Any = None
        self.workers: _Workers | None = None
        self.relays: set[int] = set()
        self.relays_killed: list[int] = []
        self.setup_s = 0.0

    def __enter__(self) -> _Plane:
        from faultlab.engine.hub import Hub

        t0 = time.monotonic()
        (self.run_dir / "events").mkdir(parents=True)
        try:
            if self.mode == "after":
                self.hub = Hub(SECRET)
                self.stream.attach(self.hub)
            self.workers = _Workers(self.run_dir, self.mode, self.ranks, self.rpn,
                                    self.per_worker, self.hub.address("127.0.0.1")
                                    if self.hub is not None else None, self.traced)
            ready = self.workers.replies(900)
            self.relays = {p for a in ready for p in a["relays"]}
            if any(a["down"] for a in ready):
                raise RuntimeError(f"{sum(a['down'] for a in ready)} ranks found no relay")
            self.eng.run(lambda new, got: None, time.time() + 120,
                         done=lambda: self.stream.count("start") >= self.ranks and
                         (self.hub is None or len(self.hub.relays) >= self.nodes))
            if self.stream.count("start") < self.ranks:
                raise RuntimeError(f"{self.stream.count('start')} of {self.ranks} ranks started")
        except BaseException:
            self.__exit__()
            raise
        self.setup_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.hub is not None:
            self.hub.close()  # bye: every relay flushes and exits
            self.relays |= {i.pid for i in self.hub.relays.values()}
        if self.workers is not None:
            self.workers.close()
        self.relays_killed = _stop_relays(self.relays, bye=self.mode != "file")

    @property
    def workers_(self) -> _Workers:
        assert self.workers is not None
        return self.workers

    def open_gate(self, step: int) -> None:
        from faultlab.runtime.gates import open_gate

        if self.hub is not None:
            self.hub.open_gate(step)
        else:
            open_gate(self.run_dir, step)


def control_plane(mode: str, ranks: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every measurement of one control plane (``before`` or ``after``) at ``ranks``."""
    res: dict[str, Any] = {"ranks": ranks, "mode": mode}
    t0 = time.monotonic()
    with _Plane(mode, ranks, args.ranks_per_node, args.ranks_per_worker,
                (tmp / f"{mode}-{ranks}").resolve()) as plane:
        res.update(nodes=plane.nodes, relays=len(plane.relays), setup_s=plane.setup_s)
        _log(f"{mode}, {ranks} ranks: {len(plane.workers_.procs)} workers, {len(plane.relays)} "
             f"relays up in {plane.setup_s:.1f} s; steady stepping for {args.seconds} s")
        res.update(_steady(plane.eng, plane.workers_, ranks, args.seconds))
        _log(f"{mode}, {ranks} ranks: {args.gates} gates, then {BURSTS} one-step bursts")
        res.update(_gates(plane.eng, plane.workers_, ranks, args.gates, plane.open_gate))
        res.update(_burst(plane.stream, plane.workers_, ranks, plane.hub, mode == "file"))
        if mode != "before":  # a rank whose relay was down wrote a file of its own
            res["rank_files"] = sum(1 for p in (plane.run_dir / "events").iterdir()
                                    if "-rank" in p.name)
        if plane.hub is not None:
            res["lost"] = sum(len(i.lost_t) for i in plane.hub.relays.values())
    res["relays_killed"] = plane.relays_killed
    res["total_s"] = time.monotonic() - t0
    _log(f"{mode}, {ranks} ranks: done in {res['total_s']:.0f} s")
    return res


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the finally blocks end the workers and the relays


def _meta_run(cfg_json: str) -> int:
    """The metadata phase of one control plane, in a process that strace started: the engine,
    its workers and their relays, every one traced; the windows on stdout."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    _prime_threads()  # the hub's thread
    cfg = json.loads(cfg_json)
    _reply({"pid": os.getpid()})
    try:
        with _Plane(cfg["mode"], cfg["ranks"], cfg["rpn"], cfg["per_worker"],
                    Path(cfg["run_dir"]), traced=True) as plane:
            out = _windows(plane.eng, plane.workers_, cfg["ranks"], cfg["seconds"])
        out["relays_killed"] = plane.relays_killed
    except KeyboardInterrupt:
        return 130
    _reply(out)
    return 0


def _metadata(mode: str, ranks: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Metadata calls on the run directory, counted: a fresh job of the same control plane,
    started under ``strace -f --seccomp-bpf`` (only the traced calls stop a process, so the
    ranks' other system calls run at full speed), the engine included. Per second of job: the
    ranks' and relays' calls until the engine had every record of the window, the engine's
    during the window (each of its calls stops it: it may poll less than untraced, and then
    its count is a lower bound)."""
    run_dir = (tmp / f"meta-{mode}-{ranks}").resolve()
    trace = tmp / f"strace-{mode}-{ranks}.txt"
    cfg = {"mode": mode, "ranks": ranks, "rpn": args.ranks_per_node,
           "per_worker": args.ranks_per_worker,
           "seconds": args.meta_seconds, "run_dir": str(run_dir)}
    env = {k: v for k, v in os.environ.items() if k not in CHANNEL_VARS}
    proc = subprocess.Popen(
        ["strace", "-f", "--seccomp-bpf", "-y", "-ttt", "-qq", "-e", META_TRACE, "-o",
         str(trace), sys.executable, os.path.abspath(__file__), META_COMMAND, json.dumps(cfg)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    try:
        run_pid = json.loads(proc.stdout.readline() or "{}").get("pid")
        try:
            text = proc.communicate(timeout=900)[0]
        except BaseException:  # Ctrl-C, or it hangs: the traced run cleans up after itself
            if run_pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(run_pid, signal.SIGTERM)
            raise
    finally:
        try:
            proc.wait(30)  # strace leaves once the last process it traces is gone
        except subprocess.TimeoutExpired:
            _end_tree(proc.pid)
    if proc.returncode or not text.strip():
        raise RuntimeError(f"the traced {mode} run at {ranks} ranks failed "
                           f"(code {proc.returncode})")
    got = json.loads(text.strip().splitlines()[-1])
    windows = got["windows"]
    # the ranks' and relays' calls until the engine had every record of the window's steps
    # (strace delays whoever it stops), the engine's during the window
    counted = _count_meta(trace, str(run_dir), [(w["t0"], w["end"], max(w["end"], w["done"]))
                                                for w in windows], set(got["engine"]))
    trace.unlink()
    seconds = args.meta_seconds
    out: dict[str, Any] = {"meta_relays_killed": got["relays_killed"], "meta_seconds": seconds}
    for key, (nodes, engine), w in zip(("spread", "lockstep"), counted, windows, strict=True):
        out[f"meta_{key}"] = (sum(nodes.values()) + sum(engine.values())) / seconds
        out[f"meta_{key}_engine"] = sum(engine.values()) / seconds
        out[f"meta_{key}_names"] = {n: v / seconds for n, v in nodes.most_common()}
        out[f"meta_{key}_engine_names"] = {n: v / seconds for n, v in engine.most_common()}
        out[f"meta_{key}_per_poll"] = sum(engine.values()) / max(1, w["polls"])
        out[f"meta_{key}_polls"] = w["rate"]
        out[f"meta_{key}_over_s"] = max(w["end"], w["done"]) - w["t0"]
    return out


def _end_tree(pid: int) -> None:
    """strace did not leave: end what it traces (all started by this run), then strace."""
    import psutil

    try:
        tree = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        os.waitpid(pid, 0)


# --- the tables --------------------------------------------------------------------------------

def _f(value: float | None, fmt: str = ".1f") -> str:
    return "—" if value is None or math.isnan(value) else format(value, fmt)


def _verdict(value: float | None, goal: float, unit: str) -> str:
    if value is None or math.isnan(value):
        return "not measured"
    if value <= goal:
        return f"met ({_f(goal - value)} {unit} to spare)"
    return f"missed by {_f(value - goal)} {unit} ({value / goal:.1f}x the goal)"


def _row(r: dict[str, Any]) -> list[str]:
    nodes = f"{r['nodes']:,}" + (f" ({r['relays']:,} relays)" if r["mode"] != "before" else "")
    return [f"{r['ranks']:,}", nodes, PLANES[r["mode"]], _f(r["cpu"] * 100), _f(r["lat_p50"]),
            _f(r["lat_p99"]), _f(r["gate_p50"]), _f(r["gate_p99"]), _f(r["pass_p99"]),
            _f(r["poll_ms"], ".2f")]


def _meta_goal(r: dict[str, Any]) -> str:
    lockstep, spread = r["meta_lockstep"] / r["nodes"], r["meta_spread"] / r["nodes"]
    return (f"{r['ranks']:,} ranks {_f(lockstep, '.2f')} in lockstep, "
            f"{_verdict(lockstep, GOAL_META_PER_NODE_S, '/s')}, {_f(spread, '.2f')} spread, "
            f"{_verdict(spread, GOAL_META_PER_NODE_S, '/s')}")


def _goals(results: list[dict[str, Any]]) -> list[str]:
    """The issue's goals beside the numbers: met, or missed by how much."""
    after = [r for r in results if r["mode"] == "after"]
    before = {r["ranks"]: r for r in results if r["mode"] == "before"}
    notes = []
    at = next((r for r in after if r["ranks"] == 4096), None)
    for key, goal, what in (("poll_ms", GOAL_POLL_MS, "one poll with one new step from every "
                             "rank"), ("gate_p99", GOAL_GATE_P99_MS, "gate release p99")):
        if at is not None:
            notes.append(f"goal: {what} <= {goal:g} ms at 4,096 ranks: after {_f(at[key])} ms, "
                         f"{_verdict(at[key], goal, 'ms')}; before "
                         f"{_f(before.get(4096, {}).get(key))} ms")
        elif after:
            big = after[-1]
            notes.append(f"goal: {what} <= {goal:g} ms at 4,096 ranks: not measured in this run "
                         f"(--ranks); at {big['ranks']:,} ranks after {_f(big[key])} ms, before "
                         f"{_f(before.get(big['ranks'], {}).get(key))} ms")
    notes.append(f"goal: event latency p99 <= {GOAL_LATENCY_P99_MS:g} ms: after " + "; ".join(
        f"{r['ranks']:,} ranks {_f(r['lat_p99'])} ms, "
        f"{_verdict(r['lat_p99'], GOAL_LATENCY_P99_MS, 'ms')}" for r in after))
    for r in results:
        trouble = []
        if r.get("relays_killed"):
            trouble.append(f"{len(r['relays_killed'])} relays still up 5 s after the hub's bye "
                           f"(ended here)")
        if r.get("rank_files"):
            trouble.append(f"{r['rank_files']} ranks fell back to a file of their own")
        if r.get("lost"):
            trouble.append(f"the hub lost {r['lost']} relay connections")
        if r.get("poll_samples", BURSTS) < BURSTS:
            trouble.append(f"only {r['poll_samples']} of {BURSTS} poll samples had every "
                           f"record queued")
        if trouble:
            notes.append(f"{r['ranks']:,} ranks {PLANES[r['mode']]}: " + "; ".join(trouble))
    return notes


def _meta_notes(results: list[dict[str, Any]]) -> list[str]:
    """The goal beside each relay plane's figures, then what each figure is made of."""
    notes = []
    for mode in ("after", "file"):
        metas = [r for r in results if r["mode"] == mode]
        if metas:
            notes.append(f"goal: metadata ops on the shared filesystem in steady training <= "
                         f"{GOAL_META_PER_NODE_S:g} per node per second: {PLANES[mode]} "
                         + "; ".join(_meta_goal(r) for r in metas))
    for r in results:
        for key in ("spread", "lockstep"):
            calls = ", ".join(f"{n} {v / r['nodes']:.2f}" for n, v in
                              r[f"meta_{key}_names"].items()) or "none"
            engine = ", ".join(f"{n} {v / r['nodes']:,.2f}" for n, v in
                               r[f"meta_{key}_engine_names"].items()) or "none"
            slowed = r[f"meta_{key}_polls"] < 0.9 / ENGINE_POLL_S
            notes.append(
                f"{r['ranks']:,} ranks, {PLANES[r['mode']]}, {key}, per node per second: ranks "
                f"and relays {calls}; the engine {engine} ({_f(r[f'meta_{key}_per_poll'])} a "
                f"poll; it polled {_f(r[f'meta_{key}_polls'])} times a second under strace, "
                f"against {1 / ENGINE_POLL_S:g} untraced at most"
                + (": a lower bound" if slowed else "")
                + f"); the {r['meta_seconds']} s of steps had all reached the engine "
                f"{_f(r[f'meta_{key}_over_s'])} s after the first")
        if r.get("meta_relays_killed"):
            notes.append(f"{r['ranks']:,} ranks {PLANES[r['mode']]}: "
                         f"{len(r['meta_relays_killed'])} relays of the traced job still up 5 s "
                         f"after the hub's bye (ended here)")
    return notes


def control_table(sizes: list[int], planes: list[str], args: argparse.Namespace) -> None:
    results = []
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-scale-cp-") as tmp:
        for n in sizes:
            for mode in planes:
                results.append(control_plane(mode, n, args, Path(tmp)))
    print_table(
        "the control plane before and after the node relay"
        + _subset(sizes, planes, DEFAULT_SIZES, CONTROL_PLANES),
        [f"simulated ranks running faultlab's runtime code (EventLog, StepGates, Uplink), "
         f"{args.ranks_per_node} a node, one thread each, {args.ranks_per_worker} to a worker "
         f"process; "
         f"the engine's side alone in the main process (EventStream polled every 50 ms; after: "
         f"with the Hub); before: a file per rank and gate files; after: one relay process "
         f"per node (file channel: no hub, the engine reads each node's file, the relays "
         f"runtime/gates.txt); run dirs on this machine's local disk ({os.cpu_count()} cores, "
         f"load average {load:.1f} at the start); {time.monotonic() - t0:.0f} s in all",
         f"each rank steps once a second, the ranks spread over the second; engine CPU: per "
         f"cent of one core over {args.seconds} s of job; latency: the rank's emit (record t) "
         f"to EventStream.poll returning it, every step of the {args.seconds} s",
         f"gate release: the engine opens (once it saw every rank's step) to the last rank's "
         f"pass, over {args.gates} gates; rank pass p99: every rank's own delay",
         f"poll, 1 step each: one EventStream.poll with one new step from every rank waiting "
         f"(before: in the ranks' files; after: queued in the hub; file channel: in the "
         f"relays' files), median of {BURSTS}",
         "metadata operations: the table 'metadata operations on the run directory' "
         "(--tables meta)"],
        ["ranks", "nodes", "control plane", "engine CPU (%)", "latency p50 (ms)",
         "latency p99 (ms)", "gate release p50 (ms)", "gate release p99 (ms)",
         "rank pass p99 (ms)", "poll, 1 step each (ms)"],
        [_row(r) for r in results], notes=_goals(results))


def _subset(sizes: list[int], planes: list[str], default_sizes: list[int],
            default_planes: tuple[str, ...]) -> str:
    """A title's suffix when the run measured other sizes or planes than ``make bench``'s, so
    that its block in the results page does not replace the whole table's."""
    if sizes == default_sizes and tuple(planes) == default_planes:
        return ""
    return (f" ({', '.join(f'{n:,}' for n in sizes)} ranks; "
            f"{'; '.join(PLANES[m] for m in planes)})")


def meta_table(sizes: list[int], planes: list[str], args: argparse.Namespace) -> None:
    """Metadata calls on the run directory, per node per second, of each plane at each size
    up to ``--meta-max-ranks``: a fresh job of the plane under strace (``_metadata``)."""
    sizes = [n for n in sizes if n <= args.meta_max_ranks]
    results = []
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-scale-meta-") as tmp:
        for n in sizes:
            for mode in planes:
                _log(f"{mode}, {n} ranks: metadata calls, under strace, with a fresh job")
                r = {"ranks": n, "mode": mode, "nodes": math.ceil(n / args.ranks_per_node)}
                r.update(_metadata(mode, n, args, Path(tmp)))
                results.append(r)

    def per_node(r: dict[str, Any], key: str) -> str:
        return _f(r[key] / r["nodes"], ".2f")

    print_table(
        "metadata operations on the run directory"
        + _subset(sizes, planes, [n for n in DEFAULT_SIZES if n <= META_MAX_RANKS], META_PLANES),
        [f"simulated ranks running faultlab's runtime code, {args.ranks_per_node} a node, as in "
         f"the control-plane table (before: a file per rank; after, socket channel: node relays "
         f"and the engine's hub; after, file channel: node relays, no hub, the engine reads "
         f"each node's file every 50 ms); run dirs on this machine's local disk "
         f"({os.cpu_count()} cores, load average {load:.1f} at the start); "
         f"{time.monotonic() - t0:.0f} s in all",
         f"calls on the run directory (openat, stat family, getdents64, access, mkdir, rename, "
         f"unlink, ...; not close, write or fdatasync) per node per second, counted in a fresh "
         f"job of each plane started under strace -f --seccomp-bpf -y (engine, workers, "
         f"relays), {args.meta_seconds} s with the ranks spread over each second, then "
         f"{args.meta_seconds} s in lockstep, each rank stepping once a second: the ranks' and "
         f"relays' calls until the engine had every record of those seconds, the engine's "
         f"during them; 'ranks and relays' is what the nodes make, 'engine' what faultlab "
         f"makes, both divided by the nodes"],
        ["ranks", "nodes", "control plane", "spread", "lockstep", "spread: ranks and relays",
         "spread: engine", "lockstep: ranks and relays", "lockstep: engine"],
        [[f"{r['ranks']:,}", f"{r['nodes']:,}", PLANES[r["mode"]], per_node(r, "meta_spread"),
          per_node(r, "meta_lockstep"),
          _f((r["meta_spread"] - r["meta_spread_engine"]) / r["nodes"], ".2f"),
          per_node(r, "meta_spread_engine"),
          _f((r["meta_lockstep"] - r["meta_lockstep_engine"]) / r["nodes"], ".2f"),
          per_node(r, "meta_lockstep_engine")] for r in results],
        notes=_meta_notes(results))


def loop_table(sizes: list[int], steps_arg: int) -> None:
    rows = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for n in sizes:
            # 500 steps of 4,096 ranks is 2 M records (about 2 GB of dicts): fewer steps there
            steps = steps_arg if n * steps_arg <= 600_000 else max(20, 600_000 // n)
            rows.append(measure(n, steps, Path(tmp)))
            print(f"{n} ranks: {steps} steps in, done", flush=True)
    print_table("the engine's per-loop cost against the number of ranks",
                [f"simulated ranks, one events file each on this machine's local disk, "
                 f"{steps_arg} steps in (fewer where ranks x steps > 600,000); "
                 f"{time.monotonic() - t0:.0f} s in all",
                 "poll: EventStream.poll with one new step from every rank (median of 5); "
                 "idle: nothing new",
                 "struck / reacted / count: before = the helpers of 03f7da8, after = "
                 "EventStream.first / reacted_since / count, on the same stream; ms per call"],
                ["ranks", "records", "poll, 1 step each (ms)", "idle poll (ms)",
                 "struck before", "struck after", "reacted before", "reacted after",
                 "count before", "count after"], rows,
                notes=["goal at 4,096 ranks: one poll <= 10 ms (issue 37); this table reads "
                       "a file per rank, as without the node relay: the control-plane table "
                       "measures the poll with the relays' hub; helpers that do not grow with "
                       "the records read: met when the after columns stay flat"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SIM_COMMAND]:
        return _sim_ranks(argv[1])
    if argv[:1] == [META_COMMAND]:
        return _meta_run(argv[1])
    signal.signal(signal.SIGTERM, _on_sigterm)  # as Ctrl-C: workers and relays are ended
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default=",".join(map(str, DEFAULT_SIZES)))
    p.add_argument("--steps", type=int, default=500,
                   help="the per-loop table: steps already read")
    p.add_argument("--ranks-per-node", type=int, default=8,
                   help="the control-plane table: ranks a node (a relay process each)")
    p.add_argument("--ranks-per-worker", type=int, default=64,
                   help="simulated ranks a worker process (whole nodes)")
    p.add_argument("--seconds", type=int, default=6, help="job time for CPU and latency")
    p.add_argument("--meta-seconds", type=int, default=3,
                   help="job time under strace, each of spread and lockstep")
    p.add_argument("--meta-max-ranks", type=int, default=META_MAX_RANKS,
                   help="count metadata calls up to this many ranks")
    p.add_argument("--gates", type=int, default=5)
    p.add_argument("--tables", default="loop,control,meta",
                   help="which tables: loop, control, meta")
    p.add_argument("--planes", default=None,
                   help=f"which control planes, of {', '.join(META_PLANES)} (default: "
                        f"{','.join(CONTROL_PLANES)} for the control table, all three for the "
                        f"metadata table)")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.ranks.split(",")]
    tables = set(args.tables.split(","))
    planes = args.planes.split(",") if args.planes else None
    for flag, given, valid in (("--tables", tables, ("loop", "control", "meta")),
                               ("--planes", planes or (), META_PLANES)):
        wrong = sorted(set(given) - set(valid))
        if wrong:
            p.error(f"{flag}: {', '.join(map(repr, wrong))} is not one of {', '.join(valid)}")
    if "loop" in tables:
        loop_table(sizes, args.steps)
    if "control" in tables:
        control_table(sizes, planes or list(CONTROL_PLANES), args)
    if "meta" in tables:
        meta_table(sizes, planes or list(META_PLANES), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

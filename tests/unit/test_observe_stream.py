"""faultlab.observe.EventStream: tailing real events files as ranks write and restart."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from faultlab.observe import EventStream
from faultlab.runtime.events import EventLog


def line(t: float, kind: str = "step", **fields: Any) -> str:
    return json.dumps({"t": t, "kind": kind, "rank": 0, "world_size": 1, "pid": 1,
                       "restart": 0, "node": "node0", **fields}) + "\n"


def append(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def ts(records: list[dict[str, Any]]) -> list[float]:
    return [r["t"] for r in records]


def test_returns_only_new_records_each_poll(tmp_path: Path) -> None:
    path = tmp_path / "events" / "a.jsonl"
    append(path, line(1.0) + line(2.0))
    stream = EventStream(tmp_path)
    assert ts(stream.poll()) == [1.0, 2.0]
    assert stream.poll() == []
    append(path, line(3.0))
    assert ts(stream.poll()) == [3.0]
    assert ts(stream.events) == [1.0, 2.0, 3.0] and stream.malformed == 0


def test_a_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "events" / "a.jsonl"
    # Raw UTF-8 (not \u escapes), cut inside a multi-byte character: bytes, not text, wait.
    full = line(2.0, note="X").replace('"X"', '"naïve"')
    cut = full.encode().index("ï".encode()) + 1
    append(path, line(1.0))
    append(path, full.encode()[:cut])
    stream = EventStream(tmp_path)
    assert ts(stream.poll()) == [1.0]
    assert stream.poll() == [] and stream.malformed == 0  # still incomplete: never parsed
    append(path, full.encode()[cut:-1])  # everything but the newline
    assert stream.poll() == [] and stream.malformed == 0
    append(path, b"\n")
    (record,) = stream.poll()
    assert record["t"] == 2.0 and record["note"] == "naïve" and stream.malformed == 0


def test_new_files_are_picked_up_as_ranks_restart(tmp_path: Path) -> None:
    events = tmp_path / "events"
    append(events / "node0-rank0-restart0-pid1.jsonl", line(1.0, "start"))
    stream = EventStream(tmp_path)
    assert ts(stream.poll()) == [1.0]
    append(events / "node0-rank0-restart1-pid2.jsonl", line(5.0, "start"))
    assert ts(stream.poll()) == [5.0]
    assert len(stream.events) == 2


def test_no_events_directory_yet(tmp_path: Path) -> None:
    stream = EventStream(tmp_path / "run")
    assert stream.poll() == [] and stream.events == [] and stream.max_step() == 0
    append(tmp_path / "run" / "events" / "a.jsonl", line(1.0))
    assert ts(stream.poll()) == [1.0]


def test_accepts_the_events_directory_itself(tmp_path: Path) -> None:
    append(tmp_path / "events" / "a.jsonl", line(1.0))
    stream = EventStream(tmp_path / "events")
    assert stream.events_dir == tmp_path / "events" and stream.run_dir == tmp_path
    assert ts(stream.poll()) == [1.0]


def test_malformed_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events" / "a.jsonl"
    bad: list[str | bytes] = ["not json\n", "[1, 2]\n", '{"kind": "step"}\n', '{"t": "soon"}\n',
                              '{"t": NaN, "kind": "x"}\n', '{"t": true}\n', b"\xff\xfe\n"]
    append(path, line(1.0))
    for b in bad:
        append(path, b)
    append(path, "\n" + line(2.0))  # a blank line is not a record, nor an error
    stream = EventStream(tmp_path)
    assert ts(stream.poll()) == [1.0, 2.0]
    assert stream.malformed == len(bad)


def test_records_are_ordered_by_time_across_files(tmp_path: Path) -> None:
    events = tmp_path / "events"
    append(events / "a.jsonl", line(1.0) + line(3.0) + line(5.0))
    append(events / "b.jsonl", line(2.0) + line(4.0))
    stream = EventStream(tmp_path)
    assert ts(stream.poll()) == [1.0, 2.0, 3.0, 4.0, 5.0]
    # A line flushed late by one rank can be older than what another rank already wrote.
    append(events / "b.jsonl", line(4.5) + line(6.0))
    assert ts(stream.poll()) == [4.5, 6.0]
    assert ts(stream.events) == [1.0, 2.0, 3.0, 4.0, 4.5, 5.0, 6.0]


def test_consumed_bytes_are_never_read_again(tmp_path: Path) -> None:
    path = tmp_path / "events" / "a.jsonl"
    first = line(1.0)
    append(path, first)
    stream = EventStream(tmp_path)
    stream.poll()
    # Scribble over the consumed line (same length): a reader that re-read would notice.
    path.write_bytes(b"x" * (len(first) - 1) + b"\n")
    append(path, line(2.0))
    assert ts(stream.poll()) == [2.0] and stream.malformed == 0


def test_reads_what_the_reference_trainer_writes(tmp_path: Path) -> None:
    stream = EventStream(tmp_path)
    log = EventLog(tmp_path / "events", rank=0, world_size=2, node="node0", restart=0)
    log.emit("start", resumed_from_step=0)
    log.emit("step", step=1, loss=float("nan"), samples=[0, 12], local_samples=[0, 6])
    records = stream.poll()
    log.close()
    assert [r["kind"] for r in records] == ["start", "step"]
    assert records[1]["loss"] != records[1]["loss"]  # NaN survives
    assert stream.max_step() == 1 and stream.latest_start(0) == records[0]


def write_incarnation(events: Path, t: float, world_size: int, pid0: int,
                      ranks: list[int] | None = None) -> None:
    for rank in range(world_size) if ranks is None else ranks:
        pid = pid0 + rank
        append(events / f"node{rank}-rank{rank}-pid{pid}.jsonl",
               json.dumps({"t": t + rank * 0.01, "kind": "start", "rank": rank,
                           "world_size": world_size, "pid": pid, "restart": 0,
                           "node": f"node{rank}", "resumed_from_step": 0}) + "\n")


def test_current_ranks_follow_restarts_and_world_size_changes(tmp_path: Path) -> None:
    events = tmp_path / "events"
    stream = EventStream(tmp_path)
    assert stream.current_ranks() == [] and stream.latest_start(0) is None
    write_incarnation(events, 1.0, 3, pid0=10)
    stream.poll()
    assert stream.current_ranks() == [0, 1, 2]
    # The group restarts at the same size: while it comes up, only the ranks started so far.
    write_incarnation(events, 5.0, 3, pid0=20, ranks=[1])
    stream.poll()
    assert stream.current_ranks() == [1]
    write_incarnation(events, 5.0, 3, pid0=20, ranks=[0, 2])
    stream.poll()
    assert stream.current_ranks() == [0, 1, 2]
    assert stream.latest_start(1)["pid"] == 21  # type: ignore[index]
    # A node is lost: 3 -> 2.
    write_incarnation(events, 9.0, 2, pid0=30)
    stream.poll()
    assert stream.current_ranks() == [0, 1]
    assert stream.latest_start(2)["pid"] == 22  # type: ignore[index]
    assert stream.latest_start(0)["world_size"] == 2  # type: ignore[index]


def test_count_and_max_step(tmp_path: Path) -> None:
    path = tmp_path / "events" / "a.jsonl"
    append(path, line(1.0, step=1) + line(2.0, step=2) + line(2.5, "exit", reason="error")
           + line(3.0, "exit", reason="completed") + line(4.0, step=1, skipped=True))
    stream = EventStream(tmp_path)
    stream.poll()
    assert stream.max_step() == 2
    assert stream.count("step") == 3 and stream.count("exit") == 2
    assert stream.count("exit", reason="error") == 1
    assert stream.count("step", skipped=True) == 1 and stream.count("step", rank=1) == 0
    assert stream.count("anomaly") == 0


def test_repeated_queries_read_only_what_arrived_since(tmp_path: Path) -> None:
    """count, first and current_ranks are asked on every engine loop: each keeps its place,
    and its answers stay those of a fresh scan as records arrive, late ones included."""
    path = tmp_path / "events" / "a.jsonl"
    stream = EventStream(tmp_path)
    assert stream.first("fault_injected", fault_id="f") is None
    assert stream.count("exit", reason="error") == 0
    append(path, line(1.0, "start") + line(2.0, "fault_injected", fault_id="g")
           + line(3.0, "exit", reason="error"))
    stream.poll()
    assert stream.first("fault_injected", fault_id="f") is None
    assert stream.count("exit", reason="error") == 1 and stream.current_ranks() == [0]
    append(path, line(5.0, "fault_injected", fault_id="f", step=7)
           + line(6.0, "exit", reason="error") + line(7.0, "exit", reason="completed"))
    append(tmp_path / "events" / "b.jsonl",
           line(4.0, "fault_injected", fault_id="f", step=6, rank=1)
           + line(4.5, "start", rank=1, world_size=2))
    stream.poll()
    first = stream.first("fault_injected", fault_id="f")
    assert first is not None and first["step"] == 6  # the earliest by t, not by arrival
    assert stream.count("exit", reason="error") == 2 and stream.count("exit") == 3
    assert stream.count("exit", reason="error") == 2  # asked twice: not counted twice
    assert stream.current_ranks() == [1]  # a new world size: a new incarnation


def test_polling_a_large_run_is_cheap(tmp_path: Path) -> None:
    events = tmp_path / "events"
    for f in range(8):
        append(events / f"rank{f}.jsonl",
               "".join(line(i + f / 10, step=i, samples=[0, 12]) for i in range(5000)))
    stream = EventStream(tmp_path)
    assert len(stream.poll()) == 40_000
    # Generous bounds: an idle poll is a directory scan and one stat per file, and a poll
    # after an append reads only the appended bytes (rereading 40k lines would take ~100 ms).
    t0 = time.process_time()  # this process's CPU: a loaded machine stretches only wall time
    for i in range(100):
        append(events / "rank0.jsonl", line(10_000.0 + i, step=10_000 + i))
        assert len(stream.poll()) == 1
    assert time.process_time() - t0 < 2.0
    assert stream.max_step() == 10_099 and len(stream.events) == 40_100


def test_the_directory_is_listed_only_when_it_may_have_changed(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A poll opens and stats the events directory; it lists it only when the mtime changed,
    or again within DIR_TICK_S of a change (a file made in the same tick of a coarse mtime
    clock leaves the mtime as it was). Appends to known files need no listing."""
    import os

    from faultlab.observe import stream as stream_mod

    events = tmp_path / "events"
    append(events / "a.jsonl", line(1.0))
    clock = [100.0]
    monkeypatch.setattr(stream_mod.time, "monotonic", lambda: clock[0])
    listings, real = [0], os.scandir

    def counted(path: Any) -> Any:
        listings[0] += 1
        return real(path)
    monkeypatch.setattr(stream_mod.os, "scandir", counted)
    stream = EventStream(tmp_path)
    assert ts(stream.poll()) == [1.0] and listings[0] == 1
    clock[0] += 0.5  # a file made in the same mtime tick: the directory's mtime is unchanged
    mtime = events.stat().st_mtime_ns
    append(events / "b.jsonl", line(2.0))
    os.utime(events, ns=(mtime, mtime))
    assert ts(stream.poll()) == [2.0] and listings[0] == 2  # within the tick: listed again
    clock[0] += 1.0
    assert stream.poll() == [] and listings[0] == 3  # the listing that ends the tick
    for _ in range(5):
        clock[0] += 2.0
        assert stream.poll() == []
    append(events / "a.jsonl", line(3.0))  # an append: the known file, no listing
    assert ts(stream.poll()) == [3.0] and listings[0] == 3
    append(events / "c.jsonl", line(4.0))  # a new file changes the mtime
    assert ts(stream.poll()) == [4.0] and listings[0] == 4

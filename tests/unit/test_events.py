"""faultlab.runtime.events: the per-process JSON-lines event log and its reader."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path

import pytest

from faultlab.runtime.events import RECORD_KINDS, EventLog, read_events

PROTOCOL_FIELDS = {"t", "kind", "rank", "world_size", "pid", "restart", "node"}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_one_json_line_per_emit_with_every_protocol_field(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events", rank=2, world_size=4, node="node1", restart=3)
    before = time.time()
    log.emit("start", resumed_from_step=0, preset="tiny")
    # Visible before close: the file is flushed per line, so a reader tailing it sees it now.
    assert len(_lines(log.path)) == 1
    log.emit("step", step=1, loss=2.5, samples=[0, 12])
    after = time.time()
    lines = _lines(log.path)
    log.close()

    assert len(lines) == 2 and all(line.endswith("\n") for line in lines)
    records = [json.loads(line) for line in lines]
    for rec in records:
        assert PROTOCOL_FIELDS <= set(rec)
        assert (rec["rank"], rec["world_size"], rec["restart"], rec["node"]) == (2, 4, 3, "node1")
        assert rec["pid"] == os.getpid()
        assert before <= rec["t"] <= after
    assert records[0]["kind"] == "start" and records[0]["preset"] == "tiny"
    assert records[1] == {**records[1], "kind": "step", "step": 1, "loss": 2.5,
                          "samples": [0, 12]}
    assert records[0]["t"] <= records[1]["t"]
    # One file per process: named after node, rank, restart and pid.
    assert log.path.parent == tmp_path / "events"
    for part in ("node1", "rank2", "restart3", f"pid{os.getpid()}"):
        assert part in log.path.name
    assert log.path.suffix == ".jsonl"


def test_appends_across_reopening(tmp_path: Path) -> None:
    for i in range(2):
        log = EventLog(tmp_path, rank=0, world_size=1, node="n", restart=0)
        log.emit("tick", i=i)
        log.close()
    assert [r["i"] for r in read_events(tmp_path)] == [0, 1]


def test_non_finite_values_survive(tmp_path: Path) -> None:
    log = EventLog(tmp_path, rank=0, world_size=1, node="n", restart=0)
    log.emit("anomaly", loss=float("nan"), grad_norm=float("inf"))
    log.close()
    [rec] = read_events(tmp_path)
    assert math.isnan(rec["loss"]) and rec["grad_norm"] == math.inf


def test_read_events_ignores_a_torn_last_line(tmp_path: Path) -> None:
    log = EventLog(tmp_path, rank=0, world_size=1, node="n", restart=0)
    log.emit("step", step=1)
    log.emit("step", step=2)
    log.close()
    whole = log.path.read_text()
    last = whole.splitlines(keepends=True)[-1]
    # The writer died in the middle of its third record.
    log.path.write_text(whole + last.replace('"step":2', '"step":3')[: len(last) // 2])
    assert [r["step"] for r in read_events(tmp_path)] == [1, 2]
    # Even a torn line that happens to be valid JSON is not a record: it lacks its newline.
    log.path.write_text(whole + last.rstrip("\n"))
    assert [r["step"] for r in read_events(tmp_path)] == [1, 2]


def test_read_events_merges_files_by_time(tmp_path: Path) -> None:
    logs = [EventLog(tmp_path, rank=r, world_size=2, node=f"node{r}", restart=0)
            for r in (0, 1)]
    for i in range(6):
        logs[i % 2].emit("step", step=i)
        time.sleep(0.002)
    with open(logs[0].path, "a") as f:  # a torn line in one file hides nothing of the other
        f.write('{"t": 1, "kind": "st')
    for log in logs:
        log.close()
    (tmp_path / "notes.txt").write_text("not an event file\n")
    events = read_events(tmp_path)
    assert [e["step"] for e in events] == list(range(6))
    assert [e["rank"] for e in events] == [0, 1, 0, 1, 0, 1]
    assert read_events(tmp_path / "missing") == []


def test_emit_from_many_threads_keeps_lines_whole(tmp_path: Path) -> None:
    log = EventLog(tmp_path, rank=0, world_size=1, node="n", restart=0)
    payload = "x" * 2000  # long lines, so interleaved writes would show

    def worker(k: int) -> None:
        for i in range(100):
            log.emit("tick", thread=k, i=i, payload=payload)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    records = [json.loads(line) for line in _lines(log.path)]
    assert len(records) == 400
    for k in range(4):
        assert [r["i"] for r in records if r["thread"] == k] == list(range(100))


def test_from_env_is_the_emitter_of_a_rank_faultlab_launched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAULTLAB_RUN_DIR", raising=False)
    assert EventLog.from_env() is None  # outside faultlab: nothing to write to
    monkeypatch.setenv("FAULTLAB_RUN_DIR", str(tmp_path))
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "TORCHELASTIC_RESTART_COUNT": "2",
                        "FAULTLAB_NODE": "node1"}.items():
        monkeypatch.setenv(name, value)
    log = EventLog.from_env()
    assert log is not None and not log.path.exists()  # opened on the first record
    log.emit("start", resumed_from_step=0)
    log.close()
    [record] = read_events(tmp_path / "events")
    assert log.path.name == f"node1-rank3-restart2-pid{os.getpid()}.jsonl"
    assert {k: record[k] for k in ("kind", "rank", "world_size", "restart", "node")} == \
        {"kind": "start", "rank": 3, "world_size": 4, "restart": 2, "node": "node1"}


def test_every_record_kind_faultlab_reads_is_documented() -> None:
    from faultlab.spec import EVENT_KINDS

    assert set(EVENT_KINDS) <= set(RECORD_KINDS)

"""Tail a job's event stream: ``RUN_DIR/events/*.jsonl``, one append-only file per process.

The engine polls an :class:`EventStream` every few tens of milliseconds while faults are in
flight, so a poll costs an open and a ``stat`` of the directory (listed again only when its
mtime says a file may have been added) plus one call per file (a ``stat``; for a node relay's
file, whose writer is on another host, an open, see below), and reads only the bytes appended
since the previous poll (offsets are kept per file; nothing is ever read twice).

What a reader can see, and what it does about it:

- **New files** appear whenever a rank process (re)starts; a new file changes the
  directory's mtime, which every poll looks at (an open and a ``stat`` of the directory),
  and the directory is listed when it changed (and again until ``DIR_TICK_S`` after, for a
  coarse mtime clock).
- **A torn line.** A writer flushes one line at a time, so the last line of a file can be
  incomplete (being written, or the writer was SIGKILLed mid-line). Bytes after the last
  newline are kept and retried next poll; they are never parsed early.
- **A corrupt complete line** (not JSON, not an object, no finite numeric ``t``) is counted in
  :attr:`EventStream.malformed` and skipped: one bad line must not stop the experiment.
- **A node relay's file without a hub** (the file channel: ``<node>-relay.jsonl``, synced
  by its relay after every batch) is opened at every look, never ``stat``-ed: on NFS an open
  asks the server for the file's size (close-to-open), where a ``stat`` is answered from the
  attribute cache for ``acregmin`` (3 s) and would hold a node's batches back that long.
  Either is one metadata call per node per poll: at a poll every 50 ms, 20 per node per
  second, which is why the file channel cannot keep to the socket channel's budget.
- **A hub** (``attach``: the engine's end of the node relays, ``faultlab.engine.hub``). The
  relays push each batch of their node's file (``<node>-relay.jsonl``) as they write it, with
  its offset; ``poll`` then takes those bytes through the same parser and advances that file's
  offset, and touches the disk only every ``SCAN_EVERY_S`` (a rank whose relay is down writes a
  file of its own): an open and a ``stat`` of the directory while no file was added.
  ``detach`` goes back to reading files, from the offsets the hub reached: the final read
  after the run gets only what the hub did not deliver.
- **Order.** Files are written concurrently, so the records of one poll are sorted by ``t``,
  and :attr:`EventStream.events` stays sorted by ``t`` even when a late-flushed line from one
  file is older than lines already seen from another.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultlab.runtime.relay import RELAY_FILE_SUFFIX as _RELAY

__all__ = ["SCAN_EVERY_S", "EventStream"]

SCAN_EVERY_S = 2.0
"""With a hub attached: how often ``poll`` still looks at the events directory."""
DIR_TICK_S = 1.0
"""The coarsest clock of a directory's mtime allowed for (ext3, and NFS served from it: one
second): a file made within one tick of the last change leaves the mtime as it was, so the
directory is listed again until a listing comes this long after the change was seen."""

Record = dict[str, Any]


def _t(record: Record) -> float:
    return record["t"]


def _valid(record: Any) -> bool:
    """A record: a JSON object with a finite numeric ``t`` (json gives exact types: a bool is
    not a number here)."""
    if type(record) is not dict:
        return False
    t = record.get("t")
    return (type(t) is float and math.isfinite(t)) or type(t) is int


@dataclass(slots=True)
class _Tail:
    """Read position in one events file."""

    offset: int = 0
    """Bytes consumed so far (complete lines and the kept partial line)."""
    partial: bytes = b""
    """Bytes after the last newline: an incomplete line, retried on the next poll."""
    fed: bool = False
    """A relay's file whose bytes the hub delivers (not read from disk while attached)."""


class EventStream:
    """Incremental reader of ``run_dir/events/*.jsonl``.

    ``poll()`` returns the records that appeared since the previous poll; ``events`` holds
    everything read so far. The query helpers (``max_step``, ``latest_start``,
    ``current_ranks``, ``count``, ``first``, ``reacted_since``) answer from indexes kept up to
    date by ``poll`` and never touch the disk: call ``poll()`` first. The engine asks them on
    every loop, so none of them costs more with the number of records already read: a repeated
    ``count`` or ``first`` reads only the records of its kind that arrived since it was last
    asked, and ``current_ranks`` is recomputed only after a new ``start``.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        """``run_dir``: the job's run directory, or its ``events`` directory itself (a path
        whose last part is ``events``). Neither has to exist yet."""
        path = Path(run_dir)
        self.events_dir = path if path.name == "events" else path / "events"
        self.run_dir = self.events_dir.parent
        self.malformed = 0
        """Complete lines that could not be parsed into a record with a numeric ``t``."""
        self._tails: dict[str, _Tail] = {}
        self._events: list[Record] = []
        self._by_kind: defaultdict[str, list[Record]] = defaultdict(list)
        self._starts: list[Record] = []  # sorted by t; a handful per process restart
        self._latest_start: dict[Any, Record] = {}
        self._max_step = 0
        self._ranks: list[int] | None = None  # current_ranks, until the next start
        self._counted: dict[tuple[str, str], list[int]] = {}  # query → [records seen, count]
        self._found: dict[tuple[str, str], tuple[int, Record | None]] = {}  # first's cursor
        self._hub: Any = None
        self._next_scan = 0.0
        self._was_fed: set[str] = set()
        self._listed: list[tuple[str, str]] = []  # the *.jsonl files of the last listing
        self._dir_key: tuple[int, int] | None = None  # (inode, mtime) the directory had
        self._dir_seen = 0.0  # when that key was first seen
        self._dir_racy = True  # the last listing came within DIR_TICK_S of a change
        self.late: dict[str, list[float]] = {}
        """After ``detach``: relay files whose records the hub had not delivered, with each
        such record's ``t``: what the engine did not see while the job ran."""

    # --- reading ----------------------------------------------------------------------------

    @property
    def events(self) -> list[Record]:
        """Every record read so far, sorted by ``t``. The live list: do not modify it."""
        return self._events

    def attach(self, hub: Any) -> None:
        """Take the relays' batches from ``hub`` (its ``drain()``) instead of scanning."""
        self._hub = hub
        self._next_scan = time.monotonic() + SCAN_EVERY_S

    @property
    def hub(self) -> Any:
        """The hub attached (None: files only)."""
        return self._hub

    def detach(self) -> None:
        """Back to files: the next ``poll`` reads what the hub did not deliver."""
        if self._hub is not None:
            new: list[Record] = []
            self._take_hub(new)
            if new:
                new.sort(key=_t)
                self._index(new)
        self._was_fed = {name for name, tail in self._tails.items() if tail.fed}
        self._hub = None

    def poll(self) -> list[Record]:
        """Read what was appended since the last poll; return those new records sorted by t."""
        new: list[Record] = []
        if self._hub is not None:
            self._take_hub(new)
            now = time.monotonic()
            if now >= self._next_scan:
                self._next_scan = now + SCAN_EVERY_S
                self._scan(new, skip_fed=True)
            if new:
                new.sort(key=_t)
                self._index(new)
            return new
        self._scan(new, skip_fed=False)
        if not new:
            return new
        new.sort(key=_t)  # stable: equal times keep file order, then line order
        self._index(new)
        return new

    def _take_hub(self, out: list[Record]) -> None:
        lines: list[bytes] = []  # of every batch: parsed at once
        for name, start, data in self._hub.drain():
            tail = self._tails.get(name)
            if tail is None:
                tail = self._tails[name] = _Tail(fed=True)
            if start > tail.offset:  # a gap the hub did not get: read it from the file
                try:
                    with open(self.events_dir / name, "rb") as f:
                        f.seek(tail.offset)
                        lines += self._lines(tail, f.read(start - tail.offset))
                except OSError:
                    tail.offset = start
            elif start < tail.offset:
                data = data[tail.offset - start:]
            lines += self._lines(tail, data)
        self._parse_lines(lines, out)

    def _files(self) -> list[tuple[str, str]] | None:
        """The ``*.jsonl`` files of the events directory (None: no directory yet). The
        directory is opened (an open is what makes NFS check it with the server, as a listing
        did) and its mtime read; it is listed only when that mtime is not the one of the last
        listing, or that listing came within ``DIR_TICK_S`` of the change. Else the files of
        the last listing: two metadata calls instead of the listing's four."""
        try:
            fd = os.open(self.events_dir, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return None  # the job has not created its events directory yet
        try:
            st = os.fstat(fd)
            now = time.monotonic()
            key = (st.st_ino, st.st_mtime_ns)
            if key != self._dir_key:
                self._dir_key, self._dir_seen, self._dir_racy = key, now, True
            if self._dir_racy:
                with os.scandir(fd) as it:
                    names = sorted(e.name for e in it if e.name.endswith(".jsonl"))
                self._listed = [(n, os.path.join(self.events_dir, n)) for n in names]
                self._dir_racy = now - self._dir_seen < DIR_TICK_S
        finally:
            os.close(fd)
        return self._listed

    def _scan(self, new: list[Record], *, skip_fed: bool) -> None:
        entries = self._files()
        if entries is None:
            return
        for name, path in entries:
            tail = self._tails.get(name)
            if tail is None:
                tail = self._tails[name] = _Tail(fed=skip_fed and name.endswith(_RELAY))
            if skip_fed and tail.fed:
                continue  # the hub delivers it
            read = self._read_opened if name.endswith(_RELAY) else self._read_appended
            if name in self._was_fed:
                before = len(new)
                read(path, tail, new)
                self.late.setdefault(name, []).extend(r["t"] for r in new[before:])
                continue
            read(path, tail, new)

    def _read_opened(self, path: str, tail: _Tail, out: list[Record]) -> None:
        """A relay's file, which its relay on another host syncs after each batch: opened at
        each look and read from the offset to its end. On NFS the open is what asks the
        server for the file's size (close-to-open), where a ``stat`` is answered from the
        attribute cache for ``acregmin`` (3 s); one call, the ``openat`` (``os.open``:
        Python's ``open`` adds an ``fstat``), where ``stat`` and then an open were two."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return  # vanished or unreadable right now: try again next poll
        chunks, offset = [], tail.offset
        try:
            while chunk := os.pread(fd, 1 << 20, offset):
                chunks.append(chunk)
                offset += len(chunk)
        except OSError:
            pass  # what was read is kept; the rest next poll
        finally:
            os.close(fd)
        if chunks:
            self._take(tail, b"".join(chunks), out)

    def _read_appended(self, path: str, tail: _Tail, out: list[Record]) -> None:
        try:
            size = os.stat(path).st_size
            if size <= tail.offset:
                return  # nothing new (a file is append-only; a shrunk one is not re-read)
            with open(path, "rb") as f:
                f.seek(tail.offset)
                chunk = f.read(size - tail.offset)
        except OSError:
            return  # vanished or unreadable right now: try again next poll
        self._take(tail, chunk, out)

    def _take(self, tail: _Tail, chunk: bytes, out: list[Record]) -> None:
        self._parse_lines(self._lines(tail, chunk), out)

    @staticmethod
    def _lines(tail: _Tail, chunk: bytes) -> list[bytes]:
        """The complete lines ``chunk`` ends (after what ``tail`` kept); keeps the rest."""
        tail.offset += len(chunk)
        data = tail.partial + chunk
        end = data.rfind(b"\n")
        if end < 0:
            tail.partial = data
            return []
        tail.partial = data[end + 1:]
        return [line for line in data[:end].split(b"\n") if line.strip()]

    def _parse_lines(self, lines: list[bytes], out: list[Record]) -> None:
        # One json.loads over all the lines (4,096 records: 5.7 ms, against 13.3 ms line by
        # line). Only when every line is one object and the array has one element a line;
        # else line by line, which counts the malformed ones.
        if len(lines) > 1 and all(line.startswith(b"{") and line.endswith(b"}")
                                  for line in lines):
            try:
                batch = json.loads(b"[" + b",".join(lines) + b"]")
            except (ValueError, RecursionError):
                batch = None
            if isinstance(batch, list) and len(batch) == len(lines):
                for record in batch:
                    if _valid(record):
                        out.append(record)
                    else:
                        self.malformed += 1
                return
        for line in lines:
            record = self._parse(line)
            if record is None:
                self.malformed += 1
            else:
                out.append(record)

    @staticmethod
    def _parse(line: bytes) -> Record | None:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError
            return None
        return record if _valid(record) else None

    def _index(self, new: list[Record]) -> None:
        events = self._events
        if events and new[0]["t"] < events[-1]["t"]:
            # A line flushed late by one file is older than lines already read from another:
            # only the records since its time are merged again (not the whole history), in
            # place, keeping the list's identity.
            at = bisect.bisect_right(events, new[0]["t"], key=_t)
            merged = events[at:] + new
            merged.sort(key=_t)
            events[at:] = merged
        else:
            events.extend(new)
        by_kind, max_step = self._by_kind, self._max_step
        for record in new:
            kind = record.get("kind")
            if type(kind) is str:
                by_kind[kind].append(record)
            if kind == "step":
                step = record.get("step")
                if type(step) is int and step > max_step:
                    max_step = step
            elif kind == "start":
                self._ranks = None
                bisect.insort(self._starts, record, key=_t)
                rank = record.get("rank")
                latest = self._latest_start.get(rank)
                if latest is None or record["t"] >= latest["t"]:
                    self._latest_start[rank] = record
        self._max_step = max_step

    # --- queries the engine polls -------------------------------------------------------------

    def max_step(self) -> int:
        """The highest ``step`` any rank reported so far (skipped steps included); 0 if none."""
        return self._max_step

    def latest_start(self, rank: int) -> Record | None:
        """The most recent ``start`` record of ``rank`` (by ``t``), or None if it never started."""
        return self._latest_start.get(rank)

    def current_ranks(self) -> list[int]:
        """Ranks of the newest incarnation of the job, sorted.

        An incarnation is a run of ``start`` records (in time order) sharing one world size in
        which no rank starts twice. A new incarnation begins at a start record whose
        ``world_size`` differs from the current one's, or whose rank already started in the
        current one (that rank's process restarted, so torchelastic restarted the whole worker
        group). While a restarted group is still coming up, the answer holds only the ranks
        that have started so far.
        """
        if self._ranks is not None:
            return list(self._ranks)
        ranks: set[int] = set()
        world_size: Any = None
        for record in self._starts:
            rank = record.get("rank")
            if not ranks or record.get("world_size") != world_size or rank in ranks:
                ranks = set()
                world_size = record.get("world_size")
            if isinstance(rank, int):
                ranks.add(rank)
        self._ranks = sorted(ranks)
        return list(self._ranks)

    def of_kind(self, kind: str) -> Sequence[Record]:
        """Every record of ``kind`` so far, in order of arrival. The live list, not a copy:
        do not modify it."""
        return self._by_kind.get(kind, ())

    def count(self, kind: str, **match: Any) -> int:
        """How many records of ``kind`` have every field of ``match`` equal to the given value.

        ``count("exit", reason="error")``; ``count("step", rank=0)``. Asked again, it reads
        only the records of ``kind`` that arrived since.
        """
        records = self._by_kind.get(kind, ())
        if not match:
            return len(records)
        cursor = self._counted.setdefault((kind, repr(sorted(match.items()))), [0, 0])
        items = match.items()
        cursor[1] += sum(1 for r in records[cursor[0]:]
                         if all(k in r and r[k] == v for k, v in items))
        cursor[0] = len(records)
        return cursor[1]

    def first(self, kind: str, **match: Any) -> Record | None:
        """The earliest (by ``t``) record of ``kind`` whose fields equal ``match``, or None.
        Asked again, it reads only the records of ``kind`` that arrived since."""
        records = self._by_kind.get(kind, ())
        key = (kind, repr(sorted(match.items())))
        seen, best = self._found.get(key, (0, None))
        for r in records[seen:]:
            if all(k in r and r[k] == v for k, v in match.items()) and (
                    best is None or r["t"] < best["t"]):
                best = r
        self._found[key] = (len(records), best)
        return best

    REACTION_KINDS = ("anomaly", "checkpoint_loaded", "exit", "start")
    """The kinds of record in which a job shows that it noticed a fault (``metrics``'
    detection latency)."""

    LATE_S = 5.0
    """How much older than the newest record of its kind a late-flushed line can be and still
    be looked at by :meth:`reacted_since` (files are read concurrently; a line can reach the
    reader one poll after a younger one from another file)."""

    def reacted_since(self, since_t: float, known_pids: set[int]) -> bool:
        """Did the job show any sign of noticing since ``since_t``: an anomaly, a checkpoint
        load, an exit that was not a finish, or a process that was not running then? Reads
        only the records of those kinds from the last :attr:`LATE_S` seconds before
        ``since_t`` on, newest first."""
        for kind in self.REACTION_KINDS:
            for e in reversed(self._by_kind.get(kind, ())):
                t = e["t"]
                if t <= since_t - self.LATE_S:
                    break
                if t <= since_t:
                    continue
                if kind == "exit":
                    if e.get("reason") not in ("completed", "stopped"):
                        return True
                elif kind != "start" or e.get("pid") not in known_pids:
                    return True
        return False

"""Did the job go on without the node whose GPU stayed failed, and how many restarts did it
take? The metrics of a fault that no restart in place can heal (``gpu_error`` with
``sticky: true``), defined once here.

A *lasting fault* is a fault record whose details say ``sticky: true`` and name the ``node``
it struck (``faultlab.faults.gpu``). An *incarnation* of the job is what runs between one
rank-0 ``start`` record and the next (the last one runs to the end of the records). An
incarnation *excludes* a node when it has step records and none of them comes from that node
(an incarnation that ends before its first step — a health check that made a node leave at
start — excludes nothing: it did not run).

faulty_node_excluded
    None without a lasting fault. Otherwise True iff the job ``completes`` and the last
    incarnation excludes every node a lasting fault struck.
restarts_until_excluded
    None without a lasting fault, and None when no incarnation after the (first) lasting fault
    excludes its node. Otherwise the number of rank-0 ``start`` records after the fault up to
    and including the first incarnation that excludes the node: 1 when the first restart
    already ran without it; a job that spends its restarts on the bad node scores more (or
    None, if it never got rid of it).
"""

from __future__ import annotations

from faultlab.observe.records import FaultRecord, Record

__all__ = ["faulty_node_excluded", "lasting_faults", "restarts_until_excluded"]


def lasting_faults(faults: list[FaultRecord]) -> list[FaultRecord]:
    return sorted((f for f in faults if (f.details or {}).get("sticky") is True
                   and isinstance((f.details or {}).get("node"), str)),
                  key=lambda f: f.injected_t)


def _incarnations(records: list[Record]) -> list[tuple[float, list[Record]]]:
    starts = sorted(float(r["t"]) for r in records
                    if r.get("kind") == "start" and r.get("rank") == 0)
    out = []
    for i, t in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else float("inf")
        out.append((t, [r for r in records if r.get("kind") == "step" and t <= r["t"] < end]))
    return out


def _excludes(steps: list[Record], nodes: set[str]) -> bool:
    return bool(steps) and not any(r.get("node") in nodes for r in steps)


def faulty_node_excluded(records: list[Record], faults: list[FaultRecord],
                         completes: bool) -> bool | None:
    lasting = lasting_faults(faults)
    if not lasting:
        return None
    incarnations = _incarnations(records)
    if not completes or not incarnations:
        return False
    return _excludes(incarnations[-1][1], {str(f.details["node"]) for f in lasting})


def restarts_until_excluded(records: list[Record], faults: list[FaultRecord]) -> int | None:
    lasting = lasting_faults(faults)
    if not lasting:
        return None
    first = lasting[0]
    after = [(t, steps) for t, steps in _incarnations(records) if t > first.injected_t]
    for n, (_t, steps) in enumerate(after, start=1):
        if _excludes(steps, {str(first.details["node"])}):
            return n
    return None

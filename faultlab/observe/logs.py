"""What faultlab reads from the nodes' logs: each node's text (``node_logs``), and the loss from a
trainer's own output: ``observe.log_pattern``, for jobs that emit no loss event.

A level-0 job (a user's trainer, unchanged) tells faultlab its steps through the runtime
agent's optimizer hook, but not its loss. Most trainers print it; ``observe.log_pattern`` is a
regular expression with the named groups ``step`` and ``loss`` (``step (?P<step>\\d+) loss
(?P<loss>\\S+)``), matched against every line of every node's log. The last match of a step
wins (a step replayed after a restart prints again), so the result is the loss the final
timeline kept. It feeds the loss plots and the loss-versus-golden comparison exactly as the
``loss`` of step records does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from faultlab.spec.observation import check_log_pattern

__all__ = ["losses_from_logs", "node_logs"]

def losses_from_logs(logs: Iterable[Path], pattern: str) -> dict[int, float]:
    """Step → loss from the lines of ``logs`` that match ``pattern`` (last match wins;
    a match whose groups do not parse as an integer and a float is skipped)."""
    compiled = check_log_pattern(pattern)
    out: dict[int, float] = {}
    for path in logs:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            m = compiled.search(line)
            if m is None:
                continue
            try:
                step, loss = int(m.group("step")), float(m.group("loss"))
            except (TypeError, ValueError):
                continue
            out[step] = loss  # a NaN loss is a finding, kept as printed
    return out


def node_logs(run_dir: Path) -> dict[str, str]:
    """Each node's log text by node name (``logs/node*.log`` of a run directory)."""
    return {p.stem: p.read_text(errors="replace")
            for p in sorted((Path(run_dir) / "logs").glob("node*.log"))}

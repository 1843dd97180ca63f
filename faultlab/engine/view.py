"""What a person watching ``faultlab run`` sees: a live table on a terminal, plain lines otherwise.

The engine calls ``on_events`` with each batch of new records and ``note`` for its own actions
(fault injected, undone, timeout); the view never influences the run.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

__all__ = ["NullView", "RunView", "View"]


class View(Protocol):
    """What the engine tells whoever watches a run; any object with these four methods (a
    plugin's own view need not import the engine to be one)."""

    def start(self, name: str, total_steps: int | None) -> None: ...
    def on_events(self, records: list[dict[str, Any]]) -> None: ...
    def note(self, message: str) -> None: ...
    def stop(self) -> None: ...


class NullView:
    """A ``View`` that shows nothing."""

    def start(self, name: str, total_steps: int | None) -> None: ...
    def on_events(self, records: list[dict[str, Any]]) -> None: ...
    def note(self, message: str) -> None: ...
    def stop(self) -> None: ...


class RunView(NullView):
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.live: Live | None = None
        self.rank_step: dict[int, int] = {}
        self.rank_node: dict[int, str] = {}
        self.notes: list[str] = []
        self.restarts = 0
        self.t0 = time.time()
        self.name = ""
        self.total: int | None = None
        self._last_progress = 0

    def start(self, name: str, total_steps: int | None) -> None:
        """``total_steps``: what the job runs, None when nothing says (a user's command that
        names no step count): progress is then shown without a total, never a wrong one."""
        self.name, self.total, self.t0 = name, total_steps, time.time()
        if self.console.is_terminal:
            self.live = Live(self._table(), console=self.console, refresh_per_second=4,
                             transient=False)
            self.live.start()
        else:
            self.console.print(f"[bold]{name}[/]: running "
                               + (f"{total_steps} steps" if total_steps else "the job"))

    def _say(self, message: str) -> None:
        stamp = f"+{time.time() - self.t0:6.1f}s"
        self.notes = (self.notes + [f"{stamp} {message}"])[-8:]
        if self.live is None:
            self.console.print(f"  {stamp} {escape(message)}", highlight=False)

    def note(self, message: str) -> None:
        self._say(message)
        self._refresh()

    def on_events(self, records: list[dict[str, Any]]) -> None:
        for r in records:
            kind, rank = r.get("kind"), r.get("rank", -1)
            if kind == "step":
                self.rank_step[rank] = r.get("step", 0)
            elif kind == "start":
                self.rank_node[rank] = r.get("node", "?")
                if r.get("resumed_from_step") and rank == 0:
                    self.restarts += 1
                    self._say(f"job restarted: world size {r.get('world_size')}, resumed from "
                              f"step {r.get('resumed_from_step')}")
            elif kind == "anomaly":
                self._say(f"rank {rank}: {r.get('what')} at step {r.get('step')} -> "
                          f"{r.get('action')}")
            elif kind == "exit" and r.get("reason") not in ("completed", "stopped"):
                self._say(f"rank {rank} exited: {r.get('reason')} "
                          f"{str(r.get('error', ''))[:70]}")
        top = max(self.rank_step.values(), default=0)
        every = max(1, self.total // 4) if self.total else 10  # without a total: every 10
        if self.live is None and top >= self._last_progress + every:
            self._last_progress = top
            self._say(f"step {self._of_total(top)}")
        self._refresh()

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._table())

    def _table(self) -> Table:
        table = Table(title=f"{self.name}  (+{time.time() - self.t0:.0f}s, "
                            f"restarts {self.restarts})", expand=False)
        table.add_column("rank")
        table.add_column("node")
        table.add_column("step")
        for rank in sorted(self.rank_step):
            table.add_row(str(rank), self.rank_node.get(rank, "?"),
                          self._of_total(self.rank_step[rank]))
        for n in self.notes:
            table.add_row("", "", escape(n))
        return table

    def _of_total(self, step: int) -> str:
        return f"{step}/{self.total}" if self.total else str(step)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

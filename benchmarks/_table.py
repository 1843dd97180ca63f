"""What the benchmark scripts share: the plain-text table they print their numbers in."""

from __future__ import annotations

import statistics
import sys


def print_table(title: str, setup: list[str], headers: list[str], rows: list[list[str]],
                notes: list[str] | None = None) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    print(f"\n== {title} ==")
    for s in setup:
        print(f"  {s}")
    print(line(headers))
    print("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    for n in notes or []:
        print(f"  note: {n}")
    sys.stdout.flush()


def spread(values: list[float], unit: str = " s") -> str:
    """``median [min-max]`` of ``values`` (the one value alone; an em dash for none)."""
    if not values:
        return "—"
    fmt = (lambda v: f"{v:.2f}") if unit else (lambda v: f"{v:g}")
    return (f"{fmt(statistics.median(values))}{unit} [{fmt(min(values))}-{fmt(max(values))}]"
            if len(values) > 1 else f"{fmt(values[0])}{unit}")

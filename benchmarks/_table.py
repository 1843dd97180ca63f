"""What the benchmark scripts share: the plain-text table they print their numbers in, and the
same table written into the documentation's results page.

With ``FAULTLAB_RESULTS_PAGE`` set (``make bench`` sets it to ``docs/results/latest.md``), every
``print_table`` also replaces its own block in that page (keyed by script and title), with the
command, the date, the commit and the machine that produced it: a number on that page is one a
command printed, never one typed in.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS_PAGE_ENV = "FAULTLAB_RESULTS_PAGE"
REPO = Path(__file__).resolve().parents[1]
_END = "<!-- /bench -->"


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
    page = os.environ.get(RESULTS_PAGE_ENV)
    if page:
        publish(Path(page), title, setup, headers, rows, notes or [])


def publish(page: Path, title: str, setup: list[str], headers: list[str],
            rows: list[list[str]], notes: list[str]) -> None:
    """Replace (or append) this table's block in ``page``, a Markdown file."""
    script = Path(sys.argv[0]).name
    key = f"<!-- bench: {script} / {title} -->"
    command = shlex.join(["python", f"benchmarks/{script}", *sys.argv[1:]])
    block = [key, f"### {title}", "",
             f"`{command}`: {datetime.date.today().isoformat()}, commit {_commit()}, "
             f"{machine()}.", ""]
    block += [f"- {s}" for s in setup]
    block += ["", "| " + " | ".join(map(_cell, headers)) + " |",
              "| " + " | ".join("---" for _ in headers) + " |"]
    block += ["| " + " | ".join(map(_cell, r)) + " |" for r in rows]
    block += [""] + [f"Note: {n}" for n in notes]
    block.append(_END)
    text = page.read_text() if page.exists() else "# Latest make bench\n"
    found = re.compile(re.escape(key) + r".*?" + re.escape(_END), re.S)
    new = "\n".join(block)
    text = found.sub(lambda _: new, text, count=1) if found.search(text) \
        else text.rstrip("\n") + "\n\n" + new + "\n"
    page.write_text(text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+uncommitted" if git("status", "--porcelain", "--untracked-files=no")
                   else "")


def machine() -> str:
    """The machine in words: cores, memory, the accelerator (none found: CPU)."""
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = ""
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"{os.cpu_count()} cores{memory}, {gpu}, {platform.machine()}, Python " \
           f"{platform.python_version()}"


def spread(values: list[float], unit: str = " s") -> str:
    """``median [min-max]`` of ``values`` (the one value alone; an em dash for none)."""
    if not values:
        return "—"
    fmt = (lambda v: f"{v:.2f}") if unit else (lambda v: f"{v:g}")
    return (f"{fmt(statistics.median(values))}{unit} [{fmt(min(values))}-{fmt(max(values))}]"
            if len(values) > 1 else f"{fmt(values[0])}{unit}")

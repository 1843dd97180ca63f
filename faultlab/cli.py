"""`faultlab` command line.

    faultlab run EXPERIMENT... [--report-dir DIR] [--seed N] [--dry-run] [--golden-cache DIR]
    faultlab validate EXPERIMENT...
    faultlab list faults
    faultlab report RUN_DIR

Exit codes: 0 every SLA held; 1 an SLA failed (or the run broke); 2 invalid input (nothing was
run or injected); 130 interrupted (the job was cleaned up).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from faultlab import __version__
from faultlab.errors import FaultlabError, InvalidExperimentError

EXIT_PASS, EXIT_FAIL, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="faultlab", description="Chaos engineering for distributed PyTorch "
                                             "training.")
    p.add_argument("--version", action="version", version=f"faultlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run experiments and judge their SLAs")
    run.add_argument("experiments", nargs="+", type=Path, metavar="EXPERIMENT")
    run.add_argument("--report-dir", type=Path, default=Path("reports"),
                     help="where run folders go (default: reports/)")
    run.add_argument("--seed", type=int, default=None, help="override every experiment's seed")
    run.add_argument("--dry-run", action="store_true",
                     help="validate and print the schedule; inject nothing")
    run.add_argument("--golden-cache", type=Path, default=None,
                     help="golden-run cache (default: REPORT_DIR/.golden)")
    val = sub.add_parser("validate", help="validate experiment files")
    val.add_argument("experiments", nargs="+", type=Path, metavar="EXPERIMENT")
    lst = sub.add_parser("list", help="list registered things")
    lst.add_argument("what", choices=["faults"])
    rep = sub.add_parser("report", help="re-render report.md from a run's journal.json")
    rep.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        if args.command == "list":
            return _list_faults(console)
        if args.command == "report":
            return _report(args.run_dir, console)
        from faultlab.spec import load_experiments

        experiments = load_experiments(args.experiments,
                                       seed=getattr(args, "seed", None))
        if args.command == "validate":
            for path, exp in experiments:
                console.print(f"ok  {path}  ({exp.name}: {len(exp.faults)} fault(s), "
                              f"{len(list(exp.expect.items()))} SLA(s))")
            return EXIT_PASS
        if args.dry_run:
            return _dry_run(experiments, console)
        return _run(experiments, args, console)
    except InvalidExperimentError as e:
        err.print(f"[bold red]invalid experiment[/] ({len(e.problems)} problem(s)):")
        for problem in e.problems:
            err.print(f"  {escape(str(problem))}")
        err.print("nothing was run.")
        return EXIT_INVALID
    except FaultlabError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        return EXIT_FAIL


def _list_faults(console: Console) -> int:
    from faultlab.faults import fault_types

    for name, cls in fault_types().items():
        console.print(f"[bold]{name}[/]  ({cls.family}; targets: {', '.join(cls.targets)}"
                      f"{'; reversible: needs duration_s or until' if cls.reversible else ''})")
        console.print(f"    {cls.summary()}")
        for field, info in cls.Params.model_fields.items():
            default = "" if info.is_required() else f" = {info.default!r}"
            console.print(f"    - {field}{default}: {info.description or ''}")
    return EXIT_PASS


def _report(run_dir: Path, console: Console) -> int:
    from faultlab.report.journal import read_journal, render_markdown

    try:
        journal = read_journal(run_dir)
    except FileNotFoundError:
        raise FaultlabError(f"{run_dir}: no journal.json (is it a faultlab run folder?)") \
            from None
    except ValueError as e:
        raise FaultlabError(str(e)) from None
    (run_dir / "report.md").write_text(render_markdown(journal))
    console.print(f"wrote {run_dir / 'report.md'} (verdict: {journal['verdict']})")
    return EXIT_PASS if journal["verdict"] == "pass" else EXIT_FAIL


def _dry_run(experiments: list, console: Console) -> int:  # type: ignore[type-arg]
    from faultlab.spec import describe_schedule

    for path, exp in experiments:
        console.print(f"[bold]{exp.name}[/] ({path}): {exp.topology.nodes} node(s) x "
                      f"{exp.topology.procs_per_node}, {exp.run.steps} steps, timeout "
                      f"{exp.run.timeout_s:g} s, seed {exp.seed}")
        for line in describe_schedule(exp):
            console.print(f"  - {line}")
        for name, bound in exp.expect.items():
            console.print(f"  expect {name}: {bound!r}")
    console.print("dry run: nothing was launched or injected.")
    return EXIT_PASS


def _sla_table(result) -> Table:  # type: ignore[no-untyped-def]
    table = Table(title=f"{result.name}: {result.verdict.upper()}  ({result.run_folder})")
    for col in ("SLA", "bound", "measured", "result"):
        table.add_column(col)
    for s in result.slas:
        measured = "not measured" if s.measured is None else (
            f"{s.measured:.3f}" if isinstance(s.measured, float) else str(s.measured))
        table.add_row(escape(s.name), escape(str(s.bound)),
                      escape(measured + (f" ({s.note})" if s.note else "")),
                      "[green]pass[/]" if s.passed else "[bold red]FAIL[/]")
    return table


def _run(experiments: list, args: argparse.Namespace, console: Console) -> int:  # type: ignore[type-arg]
    from faultlab.engine import RunView, run_experiment

    verdicts = []
    for path, exp in experiments:
        try:
            result = run_experiment(exp, source=path, report_dir=args.report_dir,
                                    golden_cache=args.golden_cache, view=RunView(console))
        except KeyboardInterrupt as e:
            folder = getattr(e.args[0], "run_folder", None) if e.args else None
            console.print("[bold red]interrupted[/]: every process of the job was stopped"
                          + (f"; journal in {folder}" if folder else ""))
            return EXIT_INTERRUPTED
        console.print(_sla_table(result))
        if result.error:
            console.print(f"[bold red]error:[/] {escape(result.error)}")
        for s in result.failures():
            console.print(f"[bold red]FAIL[/] {escape(s.describe())}")
        console.print(f"journal: {result.journal_path}")
        verdicts.append((exp.name, result.passed))
    if len(verdicts) > 1:
        passed = sum(ok for _n, ok in verdicts)
        console.print(f"[bold]overall: {'PASS' if passed == len(verdicts) else 'FAIL'}[/] "
                      f"({passed}/{len(verdicts)} experiments passed)")
    return EXIT_PASS if all(ok for _n, ok in verdicts) else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())

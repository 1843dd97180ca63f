"""`faultlab` command line.

    faultlab run EXPERIMENT... [--report-dir DIR] [--seed N] [--dry-run] [--golden-cache DIR]
                              [--repeat N [--min-pass-rate RATE]]
    faultlab launch [--nodes N] [--min-nodes M] ... --run-dir DIR -- COMMAND...
    faultlab init --name NAME [--out FILE] -- [torchrun FLAGS] train.py ARGS...
    faultlab sweep EXPERIMENT --param PATH=LO..HI [--points N] [--scale log|linear]
                              [--values A,B,C] [--out DIR] [--golden-cache DIR] [--seed N]
    faultlab validate EXPERIMENT...
    faultlab list faults|slas
    faultlab schema                (the JSON Schema of experiment files, for editors)
    faultlab report RUN_DIR        (a suite's folder: rebuilds report.json, .md and .html)
    faultlab metadata serve --provider aws|gce|azure [--host H] [--port N] [--node NAME]
                            [--imds-v2-required] [--notice-in-s S]

Exit codes: 0 every SLA held; 1 an SLA failed (or the run broke); 2 invalid input (nothing was
run or injected); 130 interrupted (the job was cleaned up). `faultlab metadata serve` runs until
SIGINT or SIGTERM and then exits 0. `faultlab sweep` measures, it does not judge: 0 every
point ran (whatever its verdict); 1 a point could not run (the others still did); 2 invalid
input (no point ran); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console
from rich.markup import escape

from faultlab import __version__
from faultlab.errors import FaultlabError, InvalidExperimentError
from faultlab.side_by_side import refuse_bar, refuse_with_fix, run_bars, run_with_fix
from faultlab.terminal import (
    VERDICT_STYLE,
    campaign_tables,
    detection_table,
    print_sweep,
    repeat_tables,
    secs,
    sla_table,
)

if TYPE_CHECKING:
    from faultlab.engine import RunResult
    from faultlab.side_by_side import Loaded
    from faultlab.spec import Experiment, PlannedSuite
    from faultlab.spec.sweep import SweepPoint

EXIT_PASS, EXIT_FAIL, EXIT_INVALID, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = ("exit status: 0 every experiment passed; 1 one failed (or the run broke); 2 "
              "invalid input, nothing run; 3 inconclusive: nothing failed, but a correctness SLA "
              "could not be measured (its note says what to add); 130 interrupted")
VERDICT_EXIT = {"pass": EXIT_PASS, "inconclusive": EXIT_INCONCLUSIVE}
"""A verdict's exit status (anything else: ``EXIT_FAIL``)."""


CODE_VERDICT = {EXIT_PASS: "pass", EXIT_INCONCLUSIVE: "inconclusive"}


def exit_code(verdict: str) -> int:
    """``pass`` → 0, ``inconclusive`` → 3, anything else → 1 (``EXIT_CODES``)."""
    return VERDICT_EXIT.get(verdict, EXIT_FAIL)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="faultlab", description="Chaos engineering for distributed PyTorch "
                                             "training.")
    p.add_argument("--version", action="version", version=f"faultlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run experiments and judge their SLAs", epilog=EXIT_CODES)
    run.add_argument("experiments", nargs="+", type=Path, metavar="EXPERIMENT",
                     help="experiment, campaign or suite files (YAML), run in order")
    run.add_argument("--report-dir", type=Path, default=Path("reports"),
                     help="where run folders go (default: reports/)")
    run.add_argument("--seed", type=int, default=None, help="override every experiment's seed")
    run.add_argument("--dry-run", action="store_true",
                     help="validate and print the schedule; inject nothing")
    run.add_argument("--golden-cache", type=Path, default=None,
                     help="golden-run cache (default: REPORT_DIR/.golden; on Slurm .golden in the "
                          "shared runs root)")
    run.add_argument("--repeat", type=_repeat, default=1, metavar="N",
                     help="run each experiment N times, each run independent (the golden run "
                          "is shared); report how many passed and every metric's median and "
                          "p95; passes only if every run passes, unless --min-pass-rate")
    run.add_argument("--min-pass-rate", type=_pass_rate, default=None, metavar="RATE",
                     help="with --repeat: the fraction of runs that must pass, in (0, 1] "
                          "(0.95 or 95%%; default: every run)")
    run.add_argument("--bar", action="store_true",
                     help="set the team's stack beside faultlab's bar, every comparison that "
                          "applies: a team's launch line (target.launch) runs again under "
                          "faultlab's tuned launcher (bar.md); the team's monitors "
                          "(observe.detections) with a fault that corrupts silently or slows "
                          "are set beside the reference trainer's on the same faults "
                          "(bar-monitors.md); the verdict stays the team's")
    run.add_argument("--with-fix", action="store_true",
                     help="run each experiment a second time with the fixes of the first run's "
                          "launch findings applied to target.launch and target.services, and "
                          "show both side by side (fix.md); the verdict stays the team's")
    _sweep_parser(sub)
    sub.add_parser("init", add_help=False,
                   help="write a starter experiment for your trainer from one fault-free run: "
                        "faultlab init --name NAME -- torchrun ... train.py ...")
    sub.add_parser("launch", add_help=False,
                   help="run any command as a local elastic job (torchrun agents, own store): "
                        "faultlab launch --help")
    camp = sub.add_parser("campaign", help="failure campaigns: faultlab campaign init")
    camp_sub = camp.add_subparsers(dest="campaign_command", metavar="{init}", required=True,
                                   parser_class=_Parser)
    cinit = camp_sub.add_parser("init", help="write a starter campaign whose fault mix is "
                                             "weighted like Llama 3's interruptions")
    cinit.add_argument("--name", default="my_campaign",
                       help="campaign name; the file is NAME.yaml (default: my_campaign)")
    cinit.add_argument("--out", type=Path, default=None,
                       help="file to write (default: NAME.yaml in the current directory)")
    clock = cinit.add_mutually_exclusive_group()
    clock.add_argument("--mtbf-steps", type=_steps, default=40.0, metavar="N",
                       help="mean training steps between faults: the step clock, the same "
                            "scoring run after run (default: 40)")
    clock.add_argument("--mtbf-s", type=_seconds, default=None, metavar="S",
                       help="mean seconds between faults instead: the wall clock (faults also "
                            "strike while the job restarts; where they land varies)")
    cinit.add_argument("--force", action="store_true", help="overwrite an existing file")
    val = sub.add_parser("validate", help="validate experiment files")
    val.add_argument("experiments", nargs="+", type=Path, metavar="EXPERIMENT",
                     help="experiment, campaign or suite files (YAML); a suite's members too")
    val.add_argument("--golden-cache", type=Path, default=None,
                     metavar="DIR", help="where faultlab run caches golden runs: a campaign's "
                                         "mtbf_s is checked against the step time of one cached "
                                         "there (default: where faultlab run looks, "
                                         "reports/.golden or, on Slurm, the shared runs root's)")
    lst = sub.add_parser("list", help="list registered things")
    lst.add_argument("what", choices=["faults", "slas", "targets"],
                     help="faults: every fault and its params; slas: every expect key; "
                          "targets: every topology.launcher, what it offers and its settings")
    sub.add_parser("schema", help="print the JSON Schema of experiment, campaign and suite "
                                  "files, for editors: faultlab schema > faultlab.schema.json")
    rep = sub.add_parser("report", help="re-render report.md from a run's journal.json (a "
                                        "suite run: its report.json, .md and .html)")
    rep.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    md = sub.add_parser("metadata", help="fake cloud metadata endpoints (spot preemption)")
    md_sub = md.add_subparsers(dest="metadata_command", metavar="{serve}", required=True,
                               parser_class=_Parser)
    serve = md_sub.add_parser("serve", help="serve one fake metadata endpoint until SIGINT or "
                                            "SIGTERM")
    serve.add_argument("--provider", choices=["aws", "gce", "azure"], required=True,
                       help="the cloud whose metadata endpoint to play")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default: 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=_port, default=0, help="port (default: 0, a free one)")
    serve.add_argument("--node", default="node0", help="the node it plays (default: node0)")
    serve.add_argument("--imds-v2-required", action="store_true",
                       help="AWS: refuse requests without an IMDSv2 token (HttpTokens=required)")
    serve.add_argument("--notice-in-s", type=_seconds, default=None, metavar="S",
                       help="announce a preemption S seconds after start, with the cloud's "
                            "usual notice (AWS 120 s, GCE and Azure 30 s)")
    dk = sub.add_parser("docker", help="the docker target's engine objects")
    dk_sub = dk.add_subparsers(dest="docker_command", metavar="{clean}", required=True,
                               parser_class=_Parser)
    clean = dk_sub.add_parser("clean", help="remove the containers, networks and images that "
                                            "faultlab runs left behind (label faultlab=1)")
    clean.add_argument("--run", default=None, metavar="RUN_ID",
                       help="only this run's (its launch.json says run_id)")
    return p


SWEEP_EXIT_CODES = ("a sweep measures, it does not judge: exit status 0 every point ran, "
                    "whatever its verdict; 1 a point could not run (the others still ran); 2 "
                    "invalid input, nothing run; 130 interrupted")


def _sweep_parser(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="run one experiment once per value of one parameter "
                                      "(a fault's magnitude) and show where each detection "
                                      "signal starts to notice: a detection curve",
                        epilog=SWEEP_EXIT_CODES)
    sw.add_argument("experiment", type=Path, metavar="EXPERIMENT", help="one experiment file")
    sw.add_argument("--param", required=True, metavar="PATH=LO..HI",
                    help="the value to sweep, a dotted path into the experiment "
                         "(faults.0.params.factor, or by the fault's id: "
                         "faults[slow-gpu-rank-1].params.factor), with a range LO..HI; with "
                         "--values, the path alone")
    sw.add_argument("--points", type=_points, default=5, metavar="N",
                    help="how many values LO..HI spans, both ends included (default: 5)")
    sw.add_argument("--scale", choices=["log", "linear"], default=None,
                    help="spacing of LO..HI (default: log when HI/LO >= 10, else linear)")
    sw.add_argument("--values", default=None, metavar="A,B,C",
                    help="the values, listed, instead of a range: --param PATH --values "
                         "1.2,2,3")
    sw.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="the sweep's folder (sweep.json, sweep.md, sweep.png, runs/; "
                         "default: REPORT_DIR/<name>-sweep-<timestamp>)")
    sw.add_argument("--report-dir", type=Path, default=Path("reports"),
                    help="where the default --out goes (default: reports/)")
    sw.add_argument("--golden-cache", type=Path, default=None,
                    help="golden-run cache (default: REPORT_DIR/.golden), shared by every point")
    sw.add_argument("--seed", type=int, default=None, help="override the experiment's seed")


def _points(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of points >= 2; e.g. "
                                         f"--points 5")
    return int(text)


def _docker_clean(run_id: str | None, console: Console) -> int:
    from faultlab.targets.docker.engine import connect, remove_run

    removed = remove_run(connect(), run_id)
    for kind, names in removed.items():
        console.print(f"removed {len(names)} {kind}" + (f": {', '.join(names)}" if names else ""))
    return 0


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port in 0-65535 (0 picks a free "
                                         f"one)")
    return int(text)


def _repeat(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of runs >= 1; e.g. "
                                         f"--repeat 20")
    return int(text)


def _pass_rate(text: str) -> Fraction:
    from faultlab.judge.repeats import parse_pass_rate

    try:
        return parse_pass_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _at_least(minimum: float, unit: str) -> Callable[[str], float]:
    """An argparse type: a finite number of ``unit`` >= ``minimum``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value >= minimum or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit} "
                                             f">= {minimum:g}")
        return value
    return parse


_steps = _at_least(1, "steps")
_seconds = _at_least(0, "seconds")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # its command after `--` is not ours to parse
        from faultlab.targets.launcher import main as launch_main

        return launch_main(argv[1:])
    if argv[:1] == ["init"]:
        from faultlab.engine.starter import main as init_main

        console = Console(highlight=False, soft_wrap=True)
        try:
            return init_main(argv[1:], console)
        except FaultlabError as e:
            Console(stderr=True, highlight=False, soft_wrap=True).print(
                f"faultlab init: error: {escape(str(e))}")
            return EXIT_INVALID
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run" and args.min_pass_rate is not None and args.repeat < 2:
        from faultlab.judge.repeats import format_rate

        rate = format_rate(args.min_pass_rate)
        parser.error(f"--min-pass-rate {rate} needs --repeat N with N >= 2 (a single run "
                     f"either passes or fails); e.g. --repeat 20 --min-pass-rate {rate}")
    console = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        if args.command == "list":
            return {"faults": _list_faults, "slas": _list_slas,
                    "targets": _list_targets}[args.what](console)
        if args.command == "schema":
            return _schema()
        if args.command == "report":
            return _report(args.run_dir, console)
        if args.command == "metadata":
            return _metadata_serve(args, console, err)
        if args.command == "docker":
            return _docker_clean(args.run, console)
        if args.command == "campaign":
            return _campaign_init(args, console, err)
        if args.command == "sweep":
            return _sweep(args, parser, console)
        from faultlab.spec import load_experiments

        experiments = load_experiments(args.experiments,
                                       seed=getattr(args, "seed", None))
        _refuse_what_cannot_run(experiments)
        if args.command == "validate":
            from faultlab.spec import load_campaign
            from faultlab.spec.checkpoint_args import checkpoint_warnings

            for path, exp in experiments:
                campaign = load_campaign(path, seed=args.seed if hasattr(args, "seed") else None)
                if campaign is not None:
                    from faultlab.engine.campaign import check_rate_cached

                    rate = check_rate_cached(campaign[0], args.golden_cache, path, campaign[1])
                    console.print(f"ok  {path}  (campaign {exp.name}: {len(exp.faults)} "
                                  f"arrival(s) from seed {campaign[0].schedule_seed}, "
                                  f"{len(campaign[0].expect.items())} SLA(s); "
                                  f"{escape(rate)})")
                    continue
                console.print(f"ok  {path}  ({exp.name}: {len(exp.faults)} fault(s), "
                              f"{len(list(exp.expect.items()))} SLA(s))")
                # Valid, but judged vacuously once a run resumes from another's checkpoints.
                for warning in checkpoint_warnings(exp.target.command, path):
                    console.print(f"[bold yellow]warning[/] {escape(str(warning))}")
            for path, suite in _planned_suites(args.experiments):
                plan = suite.suite.plan
                num_campaigns = sum(load_campaign(path.parent / m) is not None
                                    for m in suite.suite.experiments)
                console.print(f"ok  {path}  (pre-launch suite {suite.name}: "
                              f"{len(suite.suite.experiments)} experiment(s)"
                              + (f", {num_campaigns} of them campaign(s)" if num_campaigns
                                 else "")
                              + f"; plan {plan.num_gpus} GPUs in {plan.num_nodes} node(s))")
            return EXIT_PASS
        if args.dry_run:
            return _dry_run(experiments, console, args.seed)
        if args.repeat > 1:
            _refuse_repeated_campaigns(experiments)
        suites = _planned_suites(args.experiments)
        if suites:
            return _run_suite(suites[0], experiments, args, console)
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


def _campaign_init(args: argparse.Namespace, console: Console, err: Console) -> int:
    from faultlab.spec import parse_document
    from faultlab.spec.campaign_starter import starter_campaign

    out: Path = args.out or Path(f"{args.name}.yaml")
    if out.exists() and not args.force:
        err.print(f"faultlab campaign init: error: {out} exists; choose another --out or add "
                  f"--force to overwrite it")
        return EXIT_INVALID
    text = starter_campaign(args.name, mtbf_steps=args.mtbf_steps, mtbf_s=args.mtbf_s)
    parse_document(text, out)  # a starter that does not validate is our bug: raise here
    out.write_text(text)
    rate = f"{args.mtbf_s:g} s" if args.mtbf_s is not None else f"{args.mtbf_steps:g} steps"
    console.print(f"wrote {out}: a campaign of {args.name!r} (mtbf {rate}); see the "
                  f"schedule with: faultlab run --dry-run {out}")
    return EXIT_PASS


def _list_faults(console: Console) -> int:
    from faultlab.faults import fault_types
    from faultlab.spec.target import launcher_names, launcher_offers

    for name, cls in fault_types().items():
        hosts = [n for n in launcher_names()
                 if not cls.needs or set(cls.needs) <= launcher_offers(n)]
        only = (f"; its target must offer {', '.join(cls.needs)} (topology.launcher: "
                f"{' or '.join(hosts) or 'none registered'})" if cls.needs else "")
        console.print(f"[bold]{name}[/]  ({cls.family}; targets: {', '.join(cls.targets)}"
                      f"{'; reversible: needs duration_s or until' if cls.reversible else ''}"
                      f"{only})")
        console.print(f"    {cls.summary()}")
        if cls.capabilities():
            console.print(f"    capabilities: {', '.join(cls.capabilities())}")
        for field, info in cls.Params.model_fields.items():
            default = "" if info.is_required() else f" = {info.default!r}"
            console.print(f"    - {field}{default}: {info.description or ''}")
    return EXIT_PASS


def _list_targets(console: Console) -> int:
    from faultlab.spec.target import launcher_class, launcher_names

    for name in launcher_names():
        cls = launcher_class(name)
        offers = ", ".join(sorted(getattr(cls, "offers", ()))) or "the core only"
        console.print(f"[bold]{name}[/]  ({cls.__module__}:{cls.__qualname__}; offers: "
                      f"{offers})")
        console.print(f"    {(cls.__doc__ or '').strip().splitlines()[0]}")
        settings = getattr(cls, "settings", None)
        for field, info in (settings.model_fields.items() if settings is not None else ()):
            default = "" if info.is_required() else f" = {info.default!r}"
            console.print(f"    - topology.{name}.{field}{default}: {info.description or ''}")
    return EXIT_PASS


def _schema() -> int:
    from faultlab.spec.schema import document_schema

    # plain print, not rich: the JSON must reach a file byte for byte, never wrapped
    print(json.dumps(document_schema(), indent=2, ensure_ascii=False))
    return EXIT_PASS


def _list_slas(console: Console) -> int:
    from faultlab.judge.slas import SLAS

    op = {"max": "an upper bound", "min": "a lower bound", "bool": "true or false"}
    for key, sla in SLAS.items():
        console.print(f"[bold]{key}[/]  ({op[sla.kind]})")
        console.print(f"    {sla.description}")
    return EXIT_PASS


def _report(run_dir: Path, console: Console) -> int:
    from faultlab.report.journal import read_journal, render_markdown
    from faultlab.report.prelaunch import is_suite_folder
    from faultlab.report.repeats import is_repeat_folder
    from faultlab.report.sweep import is_sweep_folder

    if is_suite_folder(run_dir):
        return _report_suite(run_dir, console)
    if is_repeat_folder(run_dir):
        return _report_repeats(run_dir, console)
    if is_sweep_folder(run_dir):
        return _report_sweep(run_dir, console)
    try:
        journal = read_journal(run_dir)
    except FileNotFoundError:
        raise FaultlabError(f"{run_dir}: no journal.json (is it a faultlab run folder?)") \
            from None
    except ValueError as e:
        raise FaultlabError(str(e)) from None
    (run_dir / "report.md").write_text(render_markdown(journal))
    console.print(f"wrote {run_dir / 'report.md'} (verdict: {journal['verdict']})")
    if journal.get("campaign") is None and journal["verdict"] == "inconclusive":
        _print_unmeasured([s for s in journal["slas"] if s.get("result") == "inconclusive"],
                          console)
    if journal.get("campaign"):  # a campaign run: its page too, and its tables
        from faultlab.report.html import render_campaign_html

        (run_dir / "report.html").write_text(render_campaign_html(journal))
        for table in campaign_tables(journal["campaign"]["score"]):
            console.print(table)
        console.print(f"wrote {run_dir / 'report.html'}")
    return exit_code(journal["verdict"])


def _metadata_serve(args: argparse.Namespace, console: Console, err: Console) -> int:
    import shlex
    import signal
    import threading

    from faultlab.metadata import CONTROL_TOKEN_HEADER, MetadataServer

    prog = "faultlab metadata serve"
    try:
        server = MetadataServer(args.provider, args.host, args.port, node=args.node,
                                imds_v2_required=args.imds_v2_required)
    except ValueError as e:
        err.print(f"{prog}: error: {escape(str(e))}")
        return EXIT_INVALID
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda _sig, _frame: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start()
        except OSError as e:
            err.print(f"{prog}: error: cannot serve on {escape(args.host)}:{args.port}: "
                      f"{escape(str(e))}")
            return EXIT_FAIL
        console.print(f"faultlab metadata ({args.provider}, node {escape(args.node)}) serving "
                      f"at {escape(server.url)}")
        for name, value in server.env().items():
            console.print(f"export {name}={escape(shlex.quote(value))}")
        console.print(f"control token: {server.control_token}  (send it as "
                      f"{CONTROL_TOKEN_HEADER} to POST {escape(server.url)}/_faultlab/preempt)")
        if args.notice_in_s is not None and not stop.wait(args.notice_in_s):
            deadline = server.announce_preemption()
            console.print(f"preemption announced: the node goes away in "
                          f"{deadline - time.time():.0f} s")
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("stopped")
    return EXIT_PASS


def _refuse_what_cannot_run(experiments: Loaded) -> None:
    """What the targets know would stop a job, its golden run's included, before anything is
    launched (``Target.preflight``: Slurm's run directory the nodes do not share, a partition
    too small ...), refused as invalid input, located at the field to change."""
    from faultlab.errors import Problem
    from faultlab.spec._base import render_path
    from faultlab.spec._yaml import read_yaml
    from faultlab.targets import target_class

    problems = []
    for path, exp in experiments:
        check = getattr(target_class(exp), "preflight", None)
        found = check(exp) if check is not None else []
        if not found:
            continue
        try:
            doc = read_yaml(Path(path).read_text(), path)
        except OSError:
            doc = None
        problems += [Problem(Path(path), doc.line_of(key) if doc else None, render_path(key),
                             message) for key, message in found]
    if problems:
        raise InvalidExperimentError(problems)


def _refuse_repeated_campaigns(experiments: Loaded) -> None:
    """``--repeat`` runs each member through the repeat loop, which would run a campaign as a
    plain experiment: unscored, its campaign SLAs never judged. Refuse before anything runs."""
    from faultlab.errors import Problem
    from faultlab.spec import load_campaign

    problems = [Problem(path, None, "campaign", "a campaign cannot run with --repeat N (each "
                                                "run would go unscored and its campaign SLAs "
                                                "unjudged); run it without --repeat, or N "
                                                "times with different --report-dir")
                for path, _exp in experiments if load_campaign(path) is not None]
    if problems:
        raise InvalidExperimentError(problems)


def _dry_run(experiments: Loaded, console: Console, seed: int | None) -> int:
    from faultlab.spec import describe_schedule, load_campaign
    from faultlab.spec.checkpoint_args import checkpoint_warnings

    for path, exp in experiments:
        campaign = load_campaign(path, seed=seed)
        console.print(f"[bold]{exp.name}[/] ({path}): "
                      + ("campaign, " if campaign else "")
                      + f"{exp.topology.nodes} node(s) x "
                      f"{exp.topology.procs_per_node}, {exp.run.steps} steps, timeout "
                      f"{exp.run.timeout_s:g} s, seed {exp.seed}"
                      + (f", {len(exp.faults)} arrival(s) scheduled from seed "
                         f"{campaign[0].schedule_seed}" if campaign else ""))
        # As validate says it: a run would resume from the golden run's checkpoints.
        for warning in checkpoint_warnings(exp.target.command, path):
            console.print(f"  [bold yellow]warning[/] {escape(str(warning))}")
        for line in describe_schedule(exp):
            console.print(f"  - {line}")
        # A campaign's own SLAs (ettr ...) are judged beside the compiled experiment's.
        expect = campaign[0].expect if campaign else exp.expect
        for name, bound in expect.items():
            console.print(f"  expect {name}: {bound!r}")
    console.print("dry run: nothing was launched or injected.")
    return EXIT_PASS


def _print_unmeasured(rows: list[Any], console: Console) -> None:
    """An inconclusive run's lines under its table: what could not be measured, and why."""
    for s in rows:
        name, note = (s.name, s.note) if hasattr(s, "name") else (s["name"], s.get("note"))
        console.print(f"[bold yellow]INCONCLUSIVE[/] {escape(name)}: "
                      f"{escape(note or 'not measured')}")
    if rows:
        console.print("inconclusive is not a pass: nothing failed, but nothing showed the run "
                      f"right either (exit status {EXIT_INCONCLUSIVE})")


def _run(experiments: Loaded, args: argparse.Namespace, console: Console, *,
         report_dir: Path | None = None, golden_root: Path | None = None,
         on_result: Callable[..., None] | None = None) -> int:
    """Run each experiment; ``golden_root``: the report directory whose ``.golden`` is the
    default golden cache (a suite's runs go to a folder of their own, its cache does not)."""
    from faultlab.engine import RunView, run_experiment
    from faultlab.engine.golden import golden_cache_for
    from faultlab.judge.verdict import combine
    from faultlab.spec import load_campaign

    verdicts: list[str] = []
    repeat = getattr(args, "repeat", 1)
    if getattr(args, "bar", False):
        refuse_bar(experiments)
    if getattr(args, "with_fix", False):
        refuse_with_fix(experiments, repeat=repeat)
    for index, (path, exp) in enumerate(experiments):
        # where run_experiment would look on its own (on Slurm, the shared runs root's)
        golden_cache = golden_cache_for(exp, args.golden_cache,
                                        golden_root or report_dir or args.report_dir)
        if repeat > 1:
            code = _run_repeated(exp, path, args, console, index=index,
                                 report_dir=report_dir or args.report_dir,
                                 golden_cache=golden_cache, on_result=on_result)
            if code == EXIT_INTERRUPTED:
                return code
            verdicts.append(CODE_VERDICT.get(code, "fail"))
            continue
        campaign = load_campaign(path, seed=getattr(args, "seed", None))
        try:
            if campaign is not None:
                from faultlab.engine.campaign import run_campaign

                try:
                    ran = run_campaign(campaign[0], source=path, line=campaign[1],
                                       report_dir=report_dir or args.report_dir,
                                       golden_cache=golden_cache, view=RunView(console))
                except InvalidExperimentError as e:
                    if on_result is None:  # alone: nothing ran but its golden run
                        raise
                    # In a suite the experiments before it have run: it fails, the suite
                    # goes on, and its report says why.
                    for problem in e.problems:
                        console.print(f"[bold red]invalid campaign[/] {escape(str(problem))}")
                    on_result(index, None, "fail", "; ".join(map(str, e.problems)))
                    verdicts.append("fail")
                    continue
                result = ran.result
                for table in campaign_tables(ran.score.to_dict()):
                    console.print(table)
            else:
                result = run_experiment(exp, source=path,
                                        report_dir=report_dir or args.report_dir,
                                        golden_cache=golden_cache, view=RunView(console))
        except KeyboardInterrupt as e:
            return _interrupted(e, "run_folder", "journal in", index, on_result, console)
        if on_result is not None:
            on_result(index, result.run_folder, result.verdict)
        if result.slas:  # none: stopped before the launch, and the error says why
            console.print(sla_table(result))
        else:
            console.print(f"[bold]{escape(result.name)}: {result.verdict.upper()}[/]  "
                          f"({escape(str(result.run_folder))})")
        if result.detection:
            console.print(detection_table(result.detection))
        if result.error:
            console.print(f"[bold red]error:[/] {escape(result.error)}")
        for s in result.failures():
            console.print(f"[bold red]FAIL[/] {escape(s.describe())}")
        if result.verdict == "inconclusive":
            _print_unmeasured(result.unmeasured(), console)
        console.print(f"journal: {result.journal_path}")
        if getattr(args, "bar", False) and campaign is None:
            try:
                run_bars(exp, path, result, args, console, report_dir=report_dir,
                          golden_cache=golden_cache)
            except KeyboardInterrupt as e:
                return _interrupted(e, "run_folder", "journal in", index, None, console)
        if getattr(args, "with_fix", False) and campaign is None:
            try:
                run_with_fix(exp, path, result, args, console, report_dir=report_dir,
                              golden_cache=golden_cache)
            except KeyboardInterrupt as e:
                return _interrupted(e, "run_folder", "journal in", index, None, console)
        verdicts.append(result.verdict)
    overall = combine(verdicts)
    if len(verdicts) > 1:
        inconclusive = verdicts.count("inconclusive")
        console.print(f"[bold]overall: {overall.upper()}[/] "
                      f"({verdicts.count('pass')}/{len(verdicts)} experiments passed"
                      + (f", {inconclusive} inconclusive" if inconclusive else "") + ")")
    return exit_code(overall)


def _interrupted(e: KeyboardInterrupt, attr: str, what: str, index: int,
                 on_result: Callable[[int, Path, str], None] | None, console: Console) -> int:
    """Ctrl-C or SIGTERM during a run: the partial result (``e.args[0]``) is recorded as a
    failure where the caller keeps a record, and its folder named."""
    folder = getattr(e.args[0], attr, None) if e.args else None
    if folder is not None and on_result is not None:
        on_result(index, folder, "fail")
    console.print("[bold red]interrupted[/]: every process of the job was stopped"
                  + (f"; {what} {folder}" if folder else ""))
    return EXIT_INTERRUPTED


# --- repeated runs: one experiment N times, judged together ----------------------------------

def _run_repeated(exp: Experiment, path: Path, args: argparse.Namespace,
                  console: Console, *, index: int, report_dir: Path,
                  golden_cache: Path | None,
                  on_result: Callable[[int, Path, str], None] | None) -> int:
    from faultlab.engine import RunView
    from faultlab.engine.repeat import run_repeated
    from faultlab.judge.repeats import ALL_PASS

    repeat = args.repeat

    def view(i: int) -> RunView:
        console.print(f"[bold]{escape(exp.name)}: run {i}/{repeat}[/]")
        return RunView(console)

    def ran(i: int, result: RunResult) -> None:
        m = result.metrics
        failed = ", ".join(s.name for s in result.failures())
        if failed and result.findings:  # what explains it, by name (the report has the rest)
            failed += f" ({', '.join(dict.fromkeys(f.cause for f in result.findings))})"
        verdict = VERDICT_STYLE.get(result.verdict, VERDICT_STYLE["fail"])
        console.print(f"run {i}/{repeat}: {verdict}"
                      f"  resume {secs(m.resume_time_s)}, detection "
                      f"{secs(m.detection_latency_s)}, recovery {secs(m.recovery_time_s)}, "
                      f"lost steps {m.lost_steps if m.lost_steps is not None else '—'}"
                      + (f"  failed: {escape(failed)}" if failed else "")
                      + (f"  error: {escape(result.error)}" if result.error else "")
                      + f"  ({result.run_folder.name})")

    try:
        outcome = run_repeated(exp, repeat, min_pass_rate=args.min_pass_rate or ALL_PASS,
                               source=path, report_dir=report_dir, golden_cache=golden_cache,
                               view_factory=view, on_run=ran)
    except KeyboardInterrupt as e:
        return _interrupted(e, "folder", "record of the runs so far in", index, on_result,
                            console)
    if on_result is not None:
        on_result(index, outcome.folder, outcome.verdict)
    for table in repeat_tables(outcome.name, outcome.summary.to_dict(), outcome.folder):
        console.print(table)
    verdict = VERDICT_STYLE.get(outcome.verdict, VERDICT_STYLE["fail"])
    console.print(f"[bold]{escape(exp.name)}[/]: {verdict}  {outcome.summary.stability()}")
    console.print(f"record: {outcome.record_path} (and report.md; each run under "
                  f"{outcome.folder / 'runs'})")
    return exit_code(outcome.verdict)


def _report_repeats(folder: Path, console: Console) -> int:
    from faultlab.report.repeats import rerender_folder

    record = _rerender(folder, "repeats", rerender_folder)
    console.print(f"wrote {folder / 'repeats.json'}, {folder / 'report.md'} (verdict: "
                  f"{record['verdict']}; {record['summary']['stability']})")
    return exit_code(record["verdict"])


def _rerender(folder: Path, what: str, render: Callable[[Path], dict[str, Any]]
              ) -> dict[str, Any]:
    """``render(folder)``, its failure one located line (a folder someone edited by hand)."""
    try:
        return render(folder)
    except (OSError, ValueError, KeyError) as e:
        raise FaultlabError(f"{folder}: cannot rebuild the {what} report: "
                            f"{type(e).__name__}: {e}") from None


# --- pre-launch suites: every experiment of the suite, then one report folder --------------

def _planned_suites(paths: list[Path]) -> list[tuple[Path, PlannedSuite]]:
    """The pre-launch suites among ``paths`` (already validated)."""
    from faultlab.spec import PlannedSuite, load_document

    return [(p, doc) for p in paths if isinstance(doc := load_document(p), PlannedSuite)]


def _run_suite(suite: tuple[Path, PlannedSuite], experiments: Loaded,
               args: argparse.Namespace, console: Console) -> int:
    from faultlab.errors import Problem

    path, doc = suite
    if len(args.experiments) > 1:
        raise InvalidExperimentError([Problem(path, None, "", "a pre-launch suite writes one "
                                              "report folder of its own: run it alone "
                                              "(faultlab run SUITE), not with other files")])
    from faultlab.engine.runner import new_run_folder
    from faultlab.report.environment import suite_environment
    from faultlab.report.prelaunch import SuiteRun
    from faultlab.spec import load_campaign

    folder = new_run_folder(args.report_dir, doc.name)
    run = SuiteRun(folder, suite_file=path, suite=doc.suite.model_dump(mode="json"),
                   experiments=[(p, e.name, [f.type for f in e.faults]) for p, e in experiments],
                   environment=suite_environment(),
                   campaigns=[p for p, _e in experiments if load_campaign(p) is not None])
    code = _run(experiments, args, console, report_dir=run.runs_dir,
                golden_root=args.report_dir, on_result=run.ran)
    report = run.finish(interrupted=code == EXIT_INTERRUPTED)
    console.print(f"[bold]pre-launch report: {report['verdict'].upper()}[/]  "
                  f"{folder / 'report.html'} (and report.md, report.json)")
    if code == EXIT_INTERRUPTED:
        return code
    return exit_code(report["verdict"])


def _report_suite(folder: Path, console: Console) -> int:
    from faultlab.report.prelaunch import REPORT_FILES, render_folder

    report = _rerender(folder, "suite", render_folder)
    console.print(f"wrote {', '.join(str(folder / n) for n in REPORT_FILES)} "
                  f"(verdict: {report['verdict']})")
    return exit_code(report["verdict"])


# --- sweeps: one experiment over the values of one parameter ------------------------------

def _sweep_values(args: argparse.Namespace, parser: argparse.ArgumentParser
                  ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The path and the record's ``param`` (path, scale, values) of ``--param``/``--values``;
    a mistake in them is the parser's error (exit 2, nothing run)."""
    from faultlab.spec.sweep import (
        auto_scale,
        integral_at,
        parse_param_path,
        parse_values,
        range_values,
    )

    text, _, span = args.param.partition("=")
    try:
        path = parse_param_path(text.strip())
        if args.values is not None:
            if span:
                parser.error(f"--param {args.param!r} has a range and --values lists values: "
                             f"give one, e.g. --param {text} --values 1.2,3")
            return path, {"path": text.strip(), "scale": "values",
                          "values": parse_values(args.values)}
        lo, sep, hi = span.partition("..")
        if not sep:
            parser.error(f"--param {args.param!r} needs a range PATH=LO..HI (e.g. "
                         f"{text or 'faults.0.params.factor'}=1.1..3), or --values A,B,C")
        try:
            low, high = float(lo), float(hi)
        except ValueError:
            parser.error(f"--param {args.param!r}: {lo!r}..{hi!r} is not a range of two "
                         f"numbers, e.g. 1e-7..1e-1")
        scale = args.scale or auto_scale(low, high)
        values = range_values(low, high, points=args.points, scale=scale,
                              integers=integral_at(args.experiment, path)
                              and low.is_integer() and high.is_integer())
    except ValueError as e:
        parser.error(f"--param {args.param!r}: {e}")
    return path, {"path": text.strip(), "scale": scale, "values": values}


def _sweep(args: argparse.Namespace, parser: argparse.ArgumentParser, console: Console) -> int:
    from faultlab.engine import RunView
    from faultlab.engine.runner import new_run_folder
    from faultlab.engine.sweep import run_sweep
    from faultlab.report.sweep import cell
    from faultlab.spec.sweep import sweep_points

    path, param = _sweep_values(args, parser)
    points = sweep_points(args.experiment, path, param["values"], seed=args.seed)
    _refuse_what_cannot_run([(args.experiment, p.experiment) for p in points])
    name = points[0].experiment.name
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {str(args.out)!r} exists and is not empty; name a new folder")
    folder = args.out or new_run_folder(args.report_dir, f"{name}-sweep")
    folder.mkdir(parents=True, exist_ok=True)
    num = len(points)

    def view(point: SweepPoint) -> RunView:
        console.print(f"[bold]{escape(name)}: point {point.index}/{num}: "
                      f"{escape(param['path'])}={point.value!r}[/]")
        return RunView(console)

    def ran(point: SweepPoint, result: RunResult, row: dict[str, Any]) -> None:
        said = "; ".join(f"{s['name']}: {cell(row, s['name'])}" for s in row["signals"])
        console.print(f"point {point.index}/{num} ({escape(param['path'])}={point.value!r}): "
                      f"{result.verdict}" + (f"  error: {escape(result.error)}"
                                             if result.error else "")
                      + f"  {escape(said or 'no signal fired')}")

    try:
        outcome = run_sweep(points, folder, param=param, source=args.experiment,
                            report_dir=args.report_dir, golden_cache=args.golden_cache,
                            view_factory=view, on_point=ran)
    except KeyboardInterrupt as e:
        console.print("[bold red]interrupted[/]: every process of the job was stopped"
                      + (f"; the points so far in {folder}" if e.args else ""))
        return EXIT_INTERRUPTED
    print_sweep(outcome.record, console)
    console.print(f"wrote {folder / 'sweep.json'}, sweep.md, sweep.png (each point's run "
                  f"under {folder / 'runs'})")
    failed = outcome.failed_points
    if failed:
        console.print(f"[bold red]{len(failed)} of {num} point(s) could not run[/]: "
                      + "; ".join(f"{p['value']!r}: {escape(p['error'])}" for p in failed))
    return EXIT_FAIL if failed else EXIT_PASS


def _report_sweep(folder: Path, console: Console) -> int:
    from faultlab.report.sweep import rerender_folder

    record = _rerender(folder, "sweep", rerender_folder)
    print_sweep(record, console)
    console.print(f"wrote {folder / 'sweep.json'}, sweep.md, sweep.png")
    return EXIT_FAIL if any(p["error"] for p in record["points"]) else EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())

"""``faultlab run --bar`` and ``faultlab run --with-fix``: the same experiment run a second way,
set side by side with the team's run.

- ``--bar`` (:func:`run_bars`): the team's launch line against faultlab's tuned launcher
  (``bar.md``), and the team's monitors against the reference trainer's on the same faults
  (``bar-monitors.md``, appended to the team's ``report.md``).
- ``--with-fix`` (:func:`run_with_fix`): the team's launch line against the same line with the
  fixes of its run's launch findings applied (``fix.md``, the fixed ``target:`` as YAML).

Each writes its page into the team's run folder and prints the same table; an experiment for
which neither can run is refused before anything runs (:func:`refuse_bar`,
:func:`refuse_with_fix`), located at its ``target.launch``. ``faultlab.cli`` parses the flags
and calls these after the team's run. It may import ``faultlab.errors``, ``faultlab.spec``,
``faultlab.engine``, ``faultlab.observe``, ``faultlab.report`` and ``faultlab.terminal``
(``ALLOWED`` in ``tests/unit/test_import_rules.py``), and rich; never ``faultlab.cli``, which
imports it. The engine and what loads torch it imports inside its functions, as
``faultlab.cli`` does, so that ``faultlab --help`` loads neither the engine nor torch.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from faultlab.errors import InvalidExperimentError
from faultlab.terminal import rows_table

if TYPE_CHECKING:
    from faultlab.engine import RunResult
    from faultlab.errors import Problem
    from faultlab.spec import Experiment

    Loaded = list[tuple[Path, Experiment]]
    """What ``load_experiments`` returns: each experiment with the file it came from."""


BAR_METRICS = ("completes", "restarts", "detection_latency_s", "resume_time_s",
               "recovery_time_s", "lost_steps")
"""What ``--bar`` sets side by side, beside every SLA's result."""


def _at_launch(path: Path, message: str) -> Problem:
    """A problem located at the experiment file's ``target.launch`` (its line when found)."""
    from faultlab.errors import Problem
    from faultlab.spec._yaml import read_yaml

    try:
        at = read_yaml(Path(path).read_text(), path).line_of(("target", "launch"))
    except (OSError, ValueError):
        at = None
    return Problem(Path(path), at, "target.launch", message)


def refuse_bar(experiments: Loaded) -> None:
    """``--bar`` runs every comparison that applies (``run_bars``); an experiment for which
    none can run is refused before anything runs: a trainer that needs its own launcher (a
    failed set-up must never be printed as a bar) and has no monitors to compare, or one with
    neither a launch line of the team's nor monitors of its own."""
    from faultlab.spec.bar import monitor_bar_applies
    from faultlab.spec.launch import bar_refusal

    problems = []
    for path, exp in experiments:
        line = exp.target.launch_line(exp.topology.launcher)
        why = bar_refusal(line)
        no_monitors = monitor_bar_applies(exp)
        if no_monitors is None or (line is not None and why is None):
            continue
        if why is not None:
            problems.append(_at_launch(path, f"--bar cannot run {exp.name!r} under faultlab's "
                                             f"launcher: {why}; run it without --bar (the team's "
                                             f"run stands on its own)"))
            continue
        problems.append(_at_launch(path, f"--bar has nothing to set beside the bar for "
                                         f"{exp.name!r}: it runs under faultlab's own launcher "
                                         f"(no target.launch of the team's), and {no_monitors}; "
                                         f"give it the team's launch line or monitors with a "
                                         f"fault they should notice, or run it without --bar"))
    if problems:
        raise InvalidExperimentError(problems)


def run_bars(exp: Experiment, path: Path, team: RunResult, args: argparse.Namespace,
              console: Console, **kw: Any) -> None:
    """Every comparison of ``--bar`` that applies to ``exp``: the team's launch line against
    faultlab's launcher (``bar.md``), and the team's monitors against the reference trainer's
    on the same faults (``bar-monitors.md``)."""
    from faultlab.spec.bar import monitor_bar_applies
    from faultlab.spec.launch import bar_refusal

    line = exp.target.launch_line(exp.topology.launcher)
    if line is not None:
        why = bar_refusal(line)
        if why is None:
            _run_bar(exp, path, team, args, console, **kw)
        else:  # refuse_bar let it through for its monitors
            console.print(f"[bold]{escape(exp.name)}[/]: --bar does not run its launch line "
                          f"under faultlab's launcher: {escape(why)}")
    if monitor_bar_applies(exp) is None:
        _run_bar_monitors(exp, path, team, args, console, **kw)


def _run_bar_monitors(exp: Experiment, path: Path, team: RunResult,
                      args: argparse.Namespace, console: Console, *,
                      report_dir: Path | None, golden_cache: Path | None) -> None:
    """Run ``exp``'s faults on the reference trainer with its bar monitors on
    (``faultlab.spec.bar``) and set each of the team's monitors beside each of the bar's:
    printed, as ``bar-monitors.md`` in the team's run folder and at the end of its report."""
    from faultlab.engine import RunView, run_experiment
    from faultlab.report.detection import onset_text
    from faultlab.report.monitors import MONITORS_HEADER, monitor_rows, monitors_markdown
    from faultlab.spec.bar import monitor_bar_experiment

    def journal(result: RunResult) -> dict[str, Any] | None:
        p = result.journal_path
        return json.loads(p.read_text()) if p is not None and p.exists() else None

    bar_journal, why, where = None, None, "not run"
    try:
        bar_exp = monitor_bar_experiment(exp, path)
    except InvalidExperimentError as e:
        why = "the reference trainer cannot run the same faults: " + "; ".join(
            str(p) for p in e.problems)
    else:
        console.print(f"[bold]{escape(exp.name)}[/]: the same faults on the reference trainer, "
                      f"its monitors on (the bar)")
        bar = run_experiment(bar_exp, source=path, report_dir=report_dir or args.report_dir,
                             golden_cache=golden_cache, view=RunView(console))
        bar_journal, where = journal(bar), f"{bar.verdict.upper()}, `{bar.run_folder}`"
        why = None if bar_journal is not None else f"the bar's run failed: {bar.error}"
    team_journal = journal(team) or {}
    rows, notes = monitor_rows(team_journal, [s.name for s in exp.observe.detections],
                               bar_journal, why)
    title = f"{exp.name}: the team's monitors beside the bar's, on the same faults"
    console.print(rows_table(title, MONITORS_HEADER, rows))
    for note in notes:
        console.print(escape(note))
    onsets = [f"- team: {onset_text((team_journal.get('detection') or {}).get('onset'))}"]
    if bar_journal is not None:
        onsets.append(f"- bar: {onset_text((bar_journal.get('detection') or {}).get('onset'))}")
    lines = [f"## {title}", "", *monitors_markdown(rows), "", *(f"- {n}" for n in notes),
             *onsets,
             f"- team's run: `{team.run_folder}`", f"- the bar's run: {where}"]
    (team.run_folder / "bar-monitors.md").write_text("\n".join(lines) + "\n")
    report = team.run_folder / "report.md"
    if report.exists():
        report.write_text(report.read_text().rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
    console.print(f"side by side: {team.run_folder / 'bar-monitors.md'}")


def _run_bar(exp: Experiment, path: Path, team: RunResult, args: argparse.Namespace,
             console: Console, *, report_dir: Path | None, golden_cache: Path | None) -> None:
    """Run ``exp`` again under faultlab's tuned launcher, the bar, and set the two runs side by
    side: printed, and as ``bar.md`` in the team's run folder."""
    from faultlab.engine import RunView, run_experiment

    tuned = exp.model_copy(update={"target": exp.target.model_copy(
        update={"launch": "faultlab"})})
    console.print(f"[bold]{escape(exp.name)}[/]: the same experiment under faultlab's tuned "
                  f"launcher (the bar)")
    bar = run_experiment(tuned, source=path, report_dir=report_dir or args.report_dir,
                         golden_cache=golden_cache, view=RunView(console))
    title = f"{exp.name}: the team's launch line against faultlab's launcher"
    lines = [f"# {title}", "",
             *_side_by_side(console, title, "faultlab's launcher (the bar)", team, bar), "",
             f"- team's run: `{team.run_folder}`", f"- the bar's run: `{bar.run_folder}`"]
    findings = json.loads(team.journal_path.read_text())["run"].get("launch_findings") or []
    lines += [f"- {f['cause']}: {f['text']}; to change it: {f['change']}" for f in findings]
    (team.run_folder / "bar.md").write_text("\n".join(lines) + "\n")
    console.print(f"side by side: {team.run_folder / 'bar.md'}")


def refuse_with_fix(experiments: Loaded, *, repeat: int) -> None:
    """``--with-fix`` where there is nothing faultlab could fix is refused before anything
    runs: the fixes change the team's torchrun line and services (launch findings)."""
    from faultlab.spec import load_campaign
    from faultlab.spec.launch import is_torchrun_like

    problems = []
    for path, exp in experiments:
        line = exp.target.launch_line(exp.topology.launcher)
        if repeat > 1:
            why = "--repeat and --with-fix: run the fix once, then repeat the fixed experiment"
        elif load_campaign(path) is not None:
            why = ("a campaign's faults are drawn per run; --with-fix proves a fix on one "
                   "experiment: run the experiment its finding came from")
        elif line is None:
            why = (f"{exp.name!r} runs under faultlab's own launcher (no target.launch of the "
                   f"team's, or launch: faultlab): there is nothing of the team's launch to fix")
        elif not is_torchrun_like(line):
            why = (f"{exp.name!r}'s launch line starts {line[0]!r}: the fixes faultlab knows "
                   f"are torchrun's and ft_launcher's (launch findings)")
        else:
            continue
        problems.append(_at_launch(path, f"--with-fix has nothing to fix: {why}"))
    if problems:
        raise InvalidExperimentError(problems)


def fixed_target(exp: Experiment, findings: list[dict[str, Any]]
                 ) -> tuple[Any, list[str], list[str]]:
    """``exp``'s target with the fix of every finding that has one applied in turn, the
    causes applied, and why each other finding's fix was not (``--with-fix``)."""
    from faultlab.observe.launch_fixes import apply_fix
    from faultlab.spec.target import launcher_offers, launchers_offering

    launched = exp.target.launch_line(exp.topology.launcher)
    if launched is None:  # faultlab's own launcher: nothing of the team's to fix
        return exp.target, [], []
    line: Sequence[str] = launched
    services: Mapping[str, Sequence[str]] = dict(exp.target.services)
    applied: list[str] = []
    skipped: list[str] = []
    for f in findings:
        cause = f["cause"]
        if not f.get("fix"):
            skipped.append(f"{cause}: {f.get('no_fix') or 'no fix'}")
            continue
        fixed = apply_fix(cause, line, services)
        if fixed is None:  # nothing left to change in the line as the fixes before left it
            continue
        if set(fixed.services) - set(services) and \
                "services" not in launcher_offers(exp.topology.launcher):
            skipped.append(f"{cause}: its fix adds a service, and faultlab runs target.services "
                           f"beside the nodes only where the target offers services "
                           f"({', '.join(launchers_offering(['services']))}; this "
                           f"experiment's nodes are {exp.topology.launcher}): paste it on the "
                           f"cluster")
            continue
        if cause not in applied:
            applied.append(cause)
        line, services = fixed.launch, fixed.services
    target = exp.target.model_copy(update={
        "launch": tuple(line), "services": {k: tuple(v) for k, v in services.items()}})
    return target, applied, skipped


def run_with_fix(exp: Experiment, path: Path, team: RunResult, args: argparse.Namespace,
                  console: Console, *, report_dir: Path | None,
                  golden_cache: Path | None) -> None:
    """Run ``exp`` again with the fixes of the team's run's launch findings applied, and set
    the two runs side by side: printed, and as ``fix.md`` in the team's run folder."""
    from faultlab.engine import RunView, run_experiment
    from faultlab.observe.launch_fixes import target_yaml

    journal = json.loads(team.journal_path.read_text()) if team.journal_path.exists() else {}
    findings = (journal.get("run") or {}).get("launch_findings") or []
    target, applied, skipped = fixed_target(exp, findings)
    head = [f"# {exp.name}: the team's launch line against the same line with its findings' "
            f"fixes", ""]
    if not applied:
        why = ("; ".join(skipped) if skipped else
               "the run had no launch finding" + (" (it passed)" if team.passed else ""))
        console.print(f"[bold]{escape(exp.name)}[/]: --with-fix has nothing to fix: "
                      f"{escape(why)}; no second run")
        (team.run_folder / "fix.md").write_text("\n".join(
            [*head, f"Nothing to fix: {why}. No second run.", "",
             f"- team's run: `{team.run_folder}`"]) + "\n")
        return
    fixed_exp = exp.model_copy(update={"target": target})
    console.print(f"[bold]{escape(exp.name)}[/]: the same experiment with the fix of "
                  f"{', '.join(applied)} applied")
    fix = run_experiment(fixed_exp, source=path, report_dir=report_dir or args.report_dir,
                         golden_cache=golden_cache, view=RunView(console))
    table = _side_by_side(console, f"{exp.name}: the team's launch line against it fixed "
                                   f"({', '.join(applied)})", "with the fix", team, fix)
    pasted = target_yaml(target.launch, target.services)
    lines = [*head, *table, "",
             f"- team's run: `{team.run_folder}`", f"- the fixed run: `{fix.run_folder}`", "",
             "## The fix, as run", "", f"Applied: {', '.join(applied)}.", "", "```yaml",
             pasted, "```", ""]
    lines += [f"- {f['cause']}: {f['text']}; to change it: {f['change']}" for f in findings]
    lines += [f"- not applied: {s}" for s in skipped]
    (team.run_folder / "fix.md").write_text("\n".join(lines) + "\n")
    console.print(f"side by side: {team.run_folder / 'fix.md'}")


def _side_by_side(console: Console, title: str, right: str, team: RunResult,
                  other: RunResult) -> list[str]:
    """Print the team's run beside ``other`` (``bar_rows``) and return it as Markdown rows,
    for ``--bar`` and ``--with-fix``."""
    rows = bar_rows(team, other)
    console.print(rows_table(title, ("", "team's launch line", right), rows))
    return [f"| | team's launch line | {right} |", "| --- | --- | --- |",
            *(f"| {a} | {b} | {c} |" for a, b, c in rows)]


def bar_rows(team: RunResult, bar: RunResult) -> list[tuple[str, str, str]]:
    """The rows of ``--bar``'s table: verdict, the recovery metrics, then every SLA."""
    def metric(result: RunResult, name: str) -> str:
        value = getattr(result.metrics, name, None)
        if value is None:
            return "not measured"
        return f"{value:.2f} s" if name.endswith("_s") else str(value)

    def sla(result: RunResult, name: str) -> str:
        found = next((s for s in result.slas if s.name == name), None)
        return "—" if found is None else found.result.upper() if found.result != "pass" \
            else "pass"

    rows = [("verdict", team.verdict.upper(), bar.verdict.upper())]
    rows += [(name, metric(team, name), metric(bar, name)) for name in BAR_METRICS]
    names = list(dict.fromkeys([s.name for s in team.slas] + [s.name for s in bar.slas]))
    rows += [(f"SLA {name}", sla(team, name), sla(bar, name)) for name in names]
    return rows

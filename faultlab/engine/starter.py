"""``faultlab init``: from "I have a trainer" to "I have a chaos test" in one command.

    faultlab init --name my_job -- torchrun --nnodes 2 --nproc-per-node 1 train.py --steps 40

It keeps the whole torchrun line as the experiment's ``target.launch``, every flag as given,
so that what recovers in the experiment is the user's own launcher (its rendezvous, timeouts
and restart budget); it reads the topology (nodes, ranks per node, restarts) from the flags,
and only the flags that must differ per node or per launch become placeholders: a literal
rendezvous endpoint, master address or port, node rank or rendezvous id (the golden run, the
experiment and runs in parallel must never collide on a port), and it says so. A command that
is not a torchrun line runs under plain torchrun (``launch: torchrun``). It runs that line
without faults under faultlab (level 0: the trainer is not changed), twice by default: two runs
that end bitwise equal make the starter check ``bitwise_equal_to_golden``; two that differ (a
GPU trainer's atomics, cuBLAS workspaces, NCCL's choices) make it judge recovery within the
trainer's own noise (``matches_golden_within_noise``, ``golden: {runs: 2}``), and its header
says from which step they differ and the usual causes. Then it writes a
starter experiment from what it measured: the topology, the checkpoint directory the trainer
used (an argument naming it becomes ``{run_dir}/...``, so that runs never share
checkpoints), a ``rank_kill`` after the first checkpoint, and SLAs set from the measured
start-up, step and checkpoint times plus headroom. It prints what it measured and where the
experiment is.

It never touches the user's checkpoints: a checkpoint-like argument with a fixed path
(``--ckpt-dir ckpt``, ``faultlab.spec.checkpoint_args``) is pointed into the run's own
directory *before* the fault-free run (``--ckpt-dir {run_dir}/ckpt``), and it says so. A
trainer that picks its checkpoint directory itself (no argument names it) cannot be redirected;
if the run then saved checkpoints outside its run directory, or resumed from one it did not
write, init stops without writing an experiment (one that every run would judge vacuously),
names the directory and asks for the argument. It deletes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from faultlab.errors import InitError, InvalidExperimentError
from faultlab.faults.process import RankKillFault
from faultlab.judge.noise import CAUSES, Reproducibility, compare_runs
from faultlab.observe.checkpoint_origin import checkpoint_roots, foreign_resumes, outside_saves
from faultlab.spec import experiment_from_dict
from faultlab.spec.checkpoint_args import CheckpointArg, checkpoint_args
from faultlab.spec.launch import trainer_argv

__all__ = ["InitError", "LineChange", "Measured", "TorchrunArgs", "parse_torchrun",
           "starter_document"]

RESUME_COLD_STARTS = 3
"""The starter's resume bound, in cold starts of the job (``faultlab.sla.timing``)."""

# A loss line as most trainers print it: "step 12 loss 2.3", "step=12, loss=2.3", "[12] loss:".
_LOSS_GUESS = (r"step[\s:=#]*(?P<step>\d+)\b.*?\bloss[\s:=]*"
               r"(?P<loss>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))")



@dataclass
class LineChange:
    """A flag of the user's torchrun line that the experiment runs otherwise, and why."""

    given: str
    """The flag as the user wrote it (``--rdzv-endpoint localhost:29400``); empty: added."""
    became: str
    """What ``target.launch`` holds instead (``--rdzv-endpoint {rdzv_endpoint}``)."""
    meaning: str
    """What faultlab puts in the placeholder."""
    reason: str
    """Why the literal cannot stay."""

    def shown(self) -> str:
        if self.given:
            return f"{self.given} runs as {self.became} ({self.meaning}): {self.reason}"
        return f"{self.became} added ({self.meaning}): {self.reason}"


@dataclass
class TorchrunArgs:
    """What ``faultlab init`` takes from a torchrun command line."""

    nodes: int = 1
    min_nodes: int | None = None
    procs_per_node: int = 1
    max_restarts: int = 3
    """From ``--max-restarts``; torchrun's default (0) for a torchrun line without it, and
    faultlab's (3) for a command that is not one (faultlab's plain torchrun line fills it)."""
    command: list[str] = field(default_factory=list)
    """The rank's command as faultlab's launcher runs it; ``python`` is the interpreter
    faultlab runs on, as torchrun would use its own."""
    launch: list[str] | None = None
    """The user's own launch line (``target.launch``): the launcher and every flag as given,
    in order, except those that must differ per node or per launch, which are placeholders
    (``changes``); None: the command was not a torchrun line."""
    changes: list[LineChange] = field(default_factory=list)
    """Every flag of the line that became a placeholder, or was added, and why."""


# Flags that take no value (torchrun 2.13's parser); every other flag takes one.
_NO_VALUE = ("--standalone", "--no-python", "--run-path", "-m", "--module",
             "--virtual-local-rank", "-h", "--help")

_NO_COLLISION = ("the golden run, the experiment's runs and runs in parallel must never "
                 "collide on a port")
# Flag -> (placeholder, what faultlab puts there, why a literal cannot stay). A literal address
# or port would be bound by every launch of the experiment at once; a literal node rank would
# give every node of the line the same one; a literal id lets parallel runs meet.
_PER_LAUNCH: dict[str, tuple[str, str, str]] = {
    "--rdzv-endpoint": ("rdzv_endpoint", "a free HOST:PORT faultlab picks for every launch",
                        _NO_COLLISION),
    "--master-port": ("master_port", "a free port faultlab picks for every launch",
                      _NO_COLLISION),
    "--master-addr": ("master_addr", "the host of faultlab's free port, where its nodes meet",
                      "every node of the experiment runs on this machine"),
    "--node-rank": ("node_rank", "each node's own index, 0 ... nodes - 1",
                    "one literal would give every node of the line the same rank"),
    "--rdzv-id": ("rdzv_id", "an id of each launch's own",
                  "with a fixed id, runs in parallel could join each other's rendezvous"),
}


def _int_flag(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InitError(f"{name}: expected an integer, got {value!r}") from None


def _launcher(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """``(the launcher's own words, the rest)`` of a torchrun-like line; None: not one. The
    launcher is named as faultlab runs it: ``torchrun`` beside faultlab's interpreter first,
    ``python`` that interpreter, as for the command (its workers must import what faultlab's
    do)."""
    exe = Path(argv[0]).name
    if exe.startswith("python") and argv[1:3] == ["-m", "torch.distributed.run"]:
        return ["python", "-m", "torch.distributed.run"], argv[3:]
    if exe == "torchrun":
        return ["torchrun"], argv[1:]
    if argv[0].startswith("-"):  # torchrun's flags without its name
        return ["torchrun"], argv
    return None


def parse_torchrun(argv: list[str]) -> TorchrunArgs:
    """``[torchrun | python -m torch.distributed.run] [flags] script.py|-m module [args]``, or
    a plain ``python train.py ...``. A torchrun line is kept whole as ``launch``: the topology
    is read from its flags, and only the flags that must differ per node or per launch become
    placeholders (``changes`` says which and why)."""
    args = list(argv)
    if not args:
        raise InitError("give the training command after --, e.g. -- torchrun "
                        "--nproc-per-node 2 train.py")
    out = TorchrunArgs()
    found = _launcher(args)
    if found is None:
        out.command = ["python" if Path(args[0]).name.startswith("python") else args[0],
                       *args[1:]]
        return out
    line, args = found
    out.max_restarts = 0  # torchrun's default: the line runs as the user runs it
    seen: dict[str, str] = {}
    no_python, module = False, False
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        name, eq, inline = flag.partition("=")
        norm = name.replace("_", "-")
        short_inline = not eq and not name.startswith("--") and len(name) > 2  # -r3, -t3
        takes_value = norm not in _NO_VALUE and not short_inline
        if eq or not takes_value:
            value = inline
        elif args:
            value = args.pop(0)
        else:
            break  # a flag without its value: no script follows, reported below
        seen[norm] = value
        if norm == "--nnodes":
            low, _, high = value.partition(":")
            out.nodes = _int_flag("--nnodes", high or low)
            out.min_nodes = _int_flag("--nnodes", low) if high else None
        elif norm == "--nproc-per-node":
            if not value.isdigit():
                raise InitError(f"--nproc-per-node: give a number of ranks per node, got "
                                f"{value!r} (faultlab runs on CPU/gloo without a GPU)")
            out.procs_per_node = int(value)
        elif norm == "--max-restarts":
            out.max_restarts = _int_flag("--max-restarts", value)
        elif norm == "--no-python":
            no_python = True
        elif norm in ("-m", "--module"):
            module = True
            continue  # the command says -m (``python -m pkg`` follows the line as ``-m pkg``)
        per_launch = _PER_LAUNCH.get(norm)
        if per_launch is not None and value != f"{{{per_launch[0]}}}":
            placeholder, meaning, reason = per_launch
            became = f"{name}={{{placeholder}}}" if eq else f"{name} {{{placeholder}}}"
            out.changes.append(LineChange(flag if eq else f"{flag} {value}", became, meaning,
                                          f"{reason}, and the experiment keeps "
                                          f"{{{placeholder}}}"))
            value = f"{{{placeholder}}}"
        line += [f"{name}={value}"] if eq else [flag, value] if takes_value else [flag]
    if not args:
        raise InitError("no training script after the torchrun flags")
    out.launch = line + _meeting_place(out, seen)
    if no_python:
        out.command = args
    elif module:
        out.command = ["python", "-m", *args]
    else:
        out.command = ["python", *args]
    return out


def _meeting_place(out: TorchrunArgs, seen: dict[str, str]) -> list[str]:
    """The flags a line of several nodes lacks to tell them where to meet (on a cluster the
    scheduler's environment gives them: ``PET_MASTER_ADDR`` ...), in the line's own rendezvous:
    torchrun's default, static, needs a master and each node's rank; c10d an endpoint."""
    if out.nodes < 2 or "--standalone" in seen:
        return []
    if seen.get("--rdzv-backend", "static") == "static":
        missing = ["--node-rank"] if "--rdzv-endpoint" in seen else \
            ["--master-addr", "--master-port", "--node-rank"]
    else:
        missing = ["--rdzv-endpoint"]
    added: list[str] = []
    for flag in (f for f in missing if f not in seen):
        placeholder, meaning, reason = _PER_LAUNCH[flag]
        added += [flag, f"{{{placeholder}}}"]
        out.changes.append(LineChange("", f"{flag} {{{placeholder}}}", meaning,
                                      f"your line gives {out.nodes} nodes no {flag} (a "
                                      f"cluster's environment does); {reason}"))
    return added


@dataclass
class Measured:
    """What the fault-free run showed."""

    ok: bool
    wall_s: float
    steps: int
    startup_s: float | None
    step_time_s: float | None
    checkpoint_steps: list[int]
    checkpoint_paths: list[str]
    checkpoint_s: float | None
    final_checkpoint: bool
    loss_pattern: str | None
    step_source: str | None
    final_readable: bool = False
    """The final checkpoint was read back and hashed (the ``final_digest`` record faultlab
    appends for a job that writes none, or the job's own): the bitwise check can be judged."""
    reproducible: Reproducibility | None = None
    """What a second fault-free run said (None: init ran one, ``--runs 1``)."""

    @property
    def checkpoint_dir(self) -> str | None:
        parents = {str(Path(p).parent) for p in self.checkpoint_paths}
        return parents.pop() if len(parents) == 1 else None

    @property
    def checkpoint_every(self) -> int | None:
        gaps = [b - a for a, b in zip(self.checkpoint_steps, self.checkpoint_steps[1:],
                                      strict=False) if b > a]
        return min(gaps) if gaps else (self.checkpoint_steps[0] if self.checkpoint_steps
                                       else None)


def _compare(m: Measured, dir_a: Path, events_a: list[dict[str, Any]], dir_b: Path,
             events_b: list[dict[str, Any]]) -> Reproducibility:
    """Two fault-free runs of the same line: the same final digest, or where they differ (by
    the losses their logs print, and their final checkpoints' weights)."""
    from faultlab.observe.final_state import final_checkpoint_path
    from faultlab.observe.logs import losses_from_logs

    def digest(events: list[dict[str, Any]]) -> str | None:
        found = [e["digest"] for e in events if e.get("kind") == "final_digest"
                 and isinstance(e.get("digest"), str)]
        return found[-1] if found else None

    def losses(run_dir: Path) -> dict[int, float]:
        if not m.loss_pattern:
            return {}
        return losses_from_logs(sorted((run_dir / "logs").glob("node*.log")), m.loss_pattern)

    a, b = digest(events_a), digest(events_b)
    return compare_runs(a is not None and a == b, losses(dir_a), losses(dir_b),
                        final_checkpoint_path(events_a), final_checkpoint_path(events_b))


def measure(events: list[dict[str, Any]], logs: list[Path], ok: bool,
            wall_s: float, launched_t: float | None = None) -> Measured:
    """Read the fault-free run's events and logs (``launched_t``: when the job was launched,
    from which its start-up is measured; else from its first record)."""
    steps = [e for e in events if e.get("kind") == "step" and e.get("rank") == 0]
    starts = [e for e in events if e.get("kind") == "start"]
    saves = [e for e in events if e.get("kind") == "checkpoint_saved"]
    t0 = launched_t if launched_t is not None else \
        min((float(e["t"]) for e in events), default=0.0)
    first_step = min((float(e["t"]) for e in steps), default=None)
    times = [float(e["step_time_s"]) for e in steps[1:] if isinstance(e.get("step_time_s"),
                                                                       int | float)]
    last_step = max((int(e["step"]) for e in steps), default=0)
    ckpt_steps = sorted({int(e["step"]) for e in saves if isinstance(e.get("step"), int)})
    text = "\n".join(p.read_text(errors="replace") for p in logs if p.is_file())
    found = re.search(_LOSS_GUESS, text, flags=re.IGNORECASE | re.MULTILINE)
    return Measured(
        ok=ok, wall_s=wall_s, steps=last_step,
        startup_s=None if first_step is None or not starts else first_step - t0,
        step_time_s=statistics.median(times) if times else None,
        checkpoint_steps=ckpt_steps,
        checkpoint_paths=[str(e["path"]) for e in saves if isinstance(e.get("path"), str)],
        checkpoint_s=max((float(e["seconds"]) for e in saves
                          if isinstance(e.get("seconds"), int | float)), default=None),
        final_checkpoint=bool(ckpt_steps) and ckpt_steps[-1] >= last_step > 0,
        loss_pattern=f"(?i){_LOSS_GUESS}" if found else None,
        step_source=next((str(e["step_source"]) for e in steps if e.get("step_source")),
                         None),
        final_readable=any(e.get("kind") == "final_digest" and isinstance(e.get("digest"), str)
                           for e in events))


def _with_run_dir(command: list[str], ckpt_dir: str | None) -> tuple[list[str], bool]:
    """Replace an argument that names the checkpoint directory by ``{run_dir}/checkpoints``."""
    if ckpt_dir is None:
        return command, False
    real = os.path.realpath(ckpt_dir)
    out, replaced = [], False
    for arg in command:
        name, eq, value = arg.partition("=")
        target = value if eq else arg
        if target and os.path.realpath(target) == real:
            out.append(f"{name}={{run_dir}}/checkpoints" if eq else "{run_dir}/checkpoints")
            replaced = True
        else:
            out.append(arg)
    return out, replaced


def own_checkpoint_dirs(command: list[str]) -> tuple[list[str], list[CheckpointArg]]:
    """``command`` with every fixed checkpoint-like argument pointed into the run directory
    (``--ckpt-dir ckpt`` → ``--ckpt-dir {run_dir}/ckpt``), and the arguments it changed."""
    out, moved = list(command), []
    for arg in checkpoint_args(command):
        if arg.fixed:
            out[arg.index] = arg.with_value(arg.in_run_dir())
            moved.append(arg)
    return out, moved


def shared_checkpoints(events: list[dict[str, Any]], run_dir: Path) -> str | None:
    """Why no experiment may be written: the fault-free run resumed from a checkpoint it did
    not write, or saved its checkpoints outside its run directory (None: neither)."""
    resumed = foreign_resumes(events, run_dir)
    if resumed:
        where = ", ".join(checkpoint_roots([r.path for r in resumed]))
        return (f"the fault-free run resumed from {resumed[0].path} (step {resumed[0].step}), "
                f"a checkpoint it did not write, in {where}, which no argument of the command "
                f"names: it started where an earlier run left off. No experiment was written, "
                f"and faultlab deleted nothing. Give the command the trainer's "
                f"checkpoint-directory argument (e.g. --ckpt-dir ckpt): init then points it "
                f"into its own run directory.")
    outside = outside_saves(events, run_dir)
    if outside:
        names = [Path(p).name for p in outside]
        return (f"the trainer saved its checkpoints to {', '.join(checkpoint_roots(outside))} "
                f"({', '.join(names[:4])}{' ...' if len(names) > 4 else ''}), outside the "
                f"run directory, and no argument of the command names that directory: every "
                f"run would resume from the one before it. No experiment was written, and "
                f"faultlab deleted nothing (remove them yourself if you do not want them). "
                f"Give the command the trainer's checkpoint-directory argument (e.g. --ckpt-dir "
                f"ckpt) and run init again: it points it into its own run directory.")
    return None


def starter_document(name: str, tr: TorchrunArgs, m: Measured) -> dict[str, Any]:
    """The starter experiment for what ``m`` measured (validated before it is returned)."""
    if not m.ok:
        raise InitError("the fault-free run failed; fix the command first (see the logs)")
    if m.steps < 2:
        raise InitError(f"the fault-free run reached step {m.steps}: faultlab saw no optimizer "
                        f"steps (does the trainer step a torch.optim optimizer?)")
    command, _ = _with_run_dir(tr.command, m.checkpoint_dir)
    every = m.checkpoint_every or max(1, m.steps // 4)
    first_ckpt = m.checkpoint_steps[0] if m.checkpoint_steps else every
    kill_at = min(m.steps - 1, first_ckpt + max(1, every // 2))
    # Relative bounds (faultlab.sla.timing), so the file holds on a machine of another speed:
    # a restart pays a start-up again (a fresh process, its imports, the rendezvous), well
    # under the job's whole cold start, which the bound allows three of; recovery then replays
    # at most the steps since the checkpoint, which it allows twice over.
    resume = {"cold_starts": RESUME_COLD_STARTS}
    recovery = {"cold_starts": RESUME_COLD_STARTS, "step_times": 2 * every}
    doc: dict[str, Any] = {
        "name": name,
        "description": f"{name}: a rank killed after the first checkpoint must restart, "
                       f"resume from that checkpoint and finish (written by faultlab init)",
        "topology": _topology(tr),
        "run": {"steps": m.steps, "checkpoint_every": every,
                "timeout_s": math.ceil(3 * m.wall_s + 60)},
        "target": _target(tr, command),
        "faults": [{"id": "kill", "type": RankKillFault.type,
                    "target": {"rank": tr.nodes * tr.procs_per_node - 1},
                    "trigger": {"at_step": kill_at}}],
        "expect": {"completes": True, "max_restarts": max(1, tr.max_restarts),
                   "resume_time_s": resume, "recovery_time_s": recovery,
                   "lost_steps": every},
    }
    # Whenever the golden run's final checkpoint reads back: init has already refused a run
    # whose checkpoints lie outside its run directory, so every run's are its own.
    if m.final_readable and (m.reproducible is None or m.reproducible.reproducible):
        doc["expect"]["bitwise_equal_to_golden"] = True
    elif m.reproducible is not None:  # two fault-free runs differ: judge it by its own noise
        doc["golden"] = {"runs": 2}
        doc["expect"]["matches_golden_within_noise"] = True
    if m.loss_pattern:
        doc["observe"] = {"log_pattern": m.loss_pattern}
    try:
        experiment_from_dict(doc)
    except InvalidExperimentError as e:  # our own output must load; say so if it does not
        raise InitError(f"the starter experiment does not validate: {e}") from None
    return doc


def _topology(tr: TorchrunArgs) -> dict[str, Any]:
    """The shape the flags give. A line of the user's keeps its own restart budget, 0 included
    (faultlab's value would only mislead: the line's literal is what runs); faultlab's plain
    torchrun line gets at least 1, so that the starter's rank_kill can be recovered from."""
    topology: dict[str, Any] = {"nodes": tr.nodes, "procs_per_node": tr.procs_per_node,
                                "max_restarts": tr.max_restarts if tr.launch is not None
                                else max(1, tr.max_restarts)}
    if tr.min_nodes is not None:
        topology["min_nodes"] = tr.min_nodes
    return topology


def _target(tr: TorchrunArgs, command: list[str]) -> dict[str, Any]:
    target: dict[str, Any] = {"command": list(command)}
    if tr.launch is not None:
        target["launch"] = list(tr.launch)
    return target


def _no_restarts(tr: TorchrunArgs) -> str | None:
    """Why the user's line cannot recover from a killed rank on its own (None: it can)."""
    if tr.launch is None or tr.max_restarts > 0:
        return None
    given = any(a.partition("=")[0].replace("_", "-") == "--max-restarts" for a in tr.launch)
    why = "--max-restarts 0" if given else "no --max-restarts: torchrun defaults to 0"
    return (f"your line restarts nothing ({why}): the experiment's rank_kill ends the whole "
            f"job, as it would on your cluster; add --max-restarts N to target.launch for the "
            f"job to recover by itself")


def render(doc: dict[str, Any], tr: TorchrunArgs, m: Measured, argv: list[str]) -> str:
    """The YAML file, headed by what it is for and the exact command that wrote it."""
    lines = [f"# {doc['name']}: a starter chaos experiment for your trainer, written by",
             f"#   faultlab init --name {doc['name']} -- {shlex.join(argv)}",
             f"# Measured in the fault-free run: {m.steps} steps in {m.wall_s:.1f} s, launch to "
             f"the first step (a cold start) {_s(m.startup_s)}, a step {_s(m.step_time_s)}, "
             f"checkpoints at steps {m.checkpoint_steps or 'none'} ({_s(m.checkpoint_s)} each).",
             "# resume_time_s and recovery_time_s are relative: in cold starts and step times,",
             "# which every run measures again on its own target before its fault, so the file "
             "holds on a",
             "# slower machine too. Tighten them to what you need; write seconds (a number) for "
             "a bound",
             "# that is a production SLA or a configured timer.",
             f"# Run it: faultlab run {doc['name']}.yaml"]
    if tr.launch is not None:
        lines.append("# It runs your own launch line (target.launch) on every node, your flags "
                     "as you gave them; faultlab fills only the {placeholders}, per node and "
                     "per launch. Change topology and the line together.")
    else:
        lines.append("# No target.launch: the command was not a torchrun line, so it runs under "
                     "plain torchrun (launch: torchrun); set target.launch to your own line to "
                     "test your launcher.")
    restarts = _no_restarts(tr)
    if restarts:
        lines.append(f"# NOTE: {restarts}.")
    if m.checkpoint_dir and "{run_dir}" not in " ".join(doc["target"]["command"]):
        lines.append(f"# NOTE: the trainer wrote checkpoints to {m.checkpoint_dir}, which no "
                     f"argument names: every run would share them. Give the trainer a flag for "
                     f"it and pass {{run_dir}}/checkpoints.")
    repro = m.reproducible
    if repro is not None and repro.reproducible:
        lines.append("# Two fault-free runs ended bitwise equal: the trainer is reproducible "
                     "here, and the experiment checks bitwise equality with the golden run.")
    elif repro is not None:
        lines.append(f"# Two fault-free runs differ {_where(repro)}: the trainer is not bitwise "
                     f"reproducible here, so the experiment judges recovery against its own "
                     f"run-to-run noise (matches_golden_within_noise, golden: {{runs: 2}}). To "
                     f"make it bitwise, look at {CAUSES.removeprefix('the usual causes and ')}.")
    elif "bitwise_equal_to_golden" not in doc["expect"]:
        lines.append(f"# No bitwise_equal_to_golden: the final checkpoint "
                     f"{'could not be read back' if m.final_checkpoint else 'was not found'}.")
    return "\n".join(lines) + "\n" + yaml.safe_dump(doc, sort_keys=False, width=100)


def _where(repro: Reproducibility) -> str:
    if repro.first_step is None:
        return "in their final checkpoints only"
    return f"from step {repro.first_step} (largest loss difference {repro.max_loss_diff:.3g})"


def _final(m: Measured) -> str:
    if m.final_readable:
        return "yes, read back (the experiment checks bitwise equality with the golden run)"
    if m.final_checkpoint:
        return "yes, but it could not be read back: no bitwise check"
    return "no (no bitwise check: save at the end of training to get one)"


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def init_parser() -> argparse.ArgumentParser:
    """The options of ``faultlab init`` (before its ``--``; the command follows it)."""
    parser = argparse.ArgumentParser(prog="faultlab init", description=__doc__.splitlines()[0],
                                     usage="faultlab init --name NAME [options] -- COMMAND ...")
    parser.add_argument("--name", required=True, help="the experiment's name")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write it (default: NAME.yaml here)")
    parser.add_argument("--report-dir", type=Path, default=Path("reports"),
                        help="where the fault-free run's folder goes (default: reports/)")
    parser.add_argument("--timeout-s", type=float, default=900.0,
                        help="stop the fault-free run after this long (default 900)")
    parser.add_argument("--runs", type=int, choices=(1, 2), default=2,
                        help="fault-free runs: 2 (the default) also measures whether the trainer "
                             "is bitwise reproducible, and picks the starter's verdict by it")
    return parser


def main(argv: list[str], console: Any) -> int:
    """``faultlab init [--name N] [--out FILE] [--timeout-s S] -- COMMAND``; returns the exit
    code (0 written, 1 the fault-free run failed, 2 bad input)."""
    from rich.markup import escape

    from faultlab.engine.runner import run_experiment
    from faultlab.runtime.events import read_events

    own, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    args = init_parser().parse_args(own)
    tr = parse_torchrun(command)
    out = args.out or Path(f"{args.name}.yaml")
    tr.command, moved = own_checkpoint_dirs(tr.command)
    # The fault-free run runs the very line the experiment will: same launcher, same flags.
    probe = experiment_from_dict({
        "name": args.name, "target": _target(tr, tr.command), "topology": _topology(tr),
        "run": {"timeout_s": args.timeout_s}, "expect": {"completes": True}})
    shown = [*tr.launch, *trainer_argv(tr.launch, tr.command, ("python",))] \
        if tr.launch is not None else tr.command
    console.print(f"fault-free run of: {escape(shlex.join(shown))} "
                  f"({tr.nodes} node(s) x {tr.procs_per_node} rank(s))")
    if tr.launch is None:
        console.print("  launch: not a torchrun line, so the experiment runs the command under "
                      "plain torchrun (launch: torchrun: faultlab fills nodes, rendezvous and "
                      "restarts); give init your torchrun line to test your own launcher")
    else:
        console.print("  launch: your own line (target.launch), every flag as you gave it"
                      + ("" if tr.changes else ": nothing in it differs per node or launch"))
    for change in tr.changes:
        console.print(f"  launch: {escape(change.shown())}")
    restarts = _no_restarts(tr)
    if restarts:
        console.print(f"  restarts: {escape(restarts)}")
    for arg in moved:
        console.print(f"  checkpoints: {escape(arg.shown())} runs as "
                      f"{escape(arg.shown(arg.in_run_dir()))} ({{run_dir}} is each run's own "
                      f"directory): init neither reads nor writes {escape(arg.value)}, and the "
                      f"experiment keeps {{run_dir}}")
    if not checkpoint_args(tr.command):
        console.print("  checkpoints: no checkpoint-directory argument in the command "
                      "(--ckpt-dir, --save-dir, --output-dir ...); if the trainer saves or "
                      "resumes outside the run directory, init stops after the run and says "
                      "where")
    result = run_experiment(probe, report_dir=args.report_dir)
    job_dir = result.run_folder / "job"
    events = read_events(job_dir / "events")
    ok = result.error is None and not result.timed_out and bool(
        [s for s in result.slas if s.name == "completes" and s.passed])
    wall = max((float(e["t"]) for e in events), default=0.0) - \
        min((float(e["t"]) for e in events), default=0.0)
    launched_t = json.loads(result.journal_path.read_text())["run"].get("launched_t")
    measured = measure(events, sorted((job_dir / "logs").glob("node*.log")), ok, wall,
                       launched_t)
    for label, value in (("steps", measured.steps), ("wall", _s(measured.wall_s)),
                         ("launch to the first step", _s(measured.startup_s)),
                         ("median step", _s(measured.step_time_s)),
                         ("step number from", measured.step_source or "n/a"),
                         ("checkpoints at steps", measured.checkpoint_steps or "none"),
                         ("checkpoint directory", measured.checkpoint_dir or "n/a"),
                         ("slowest checkpoint save", _s(measured.checkpoint_s)),
                         ("final checkpoint", _final(measured)),
                         ("loss in the log", measured.loss_pattern or "not found")):
        console.print(f"  {label}: {escape(str(value))}")
    shared = shared_checkpoints(events, job_dir)
    if shared:
        console.print(f"init stopped: {escape(shared)}")
        return 1
    if not ok:
        console.print(f"the fault-free run did not complete; see {job_dir / 'logs'}")
        return 1
    if args.runs == 2 and measured.final_readable:
        console.print("second fault-free run: is the trainer bitwise reproducible?")
        again = run_experiment(probe, report_dir=args.report_dir)
        second = read_events(again.run_folder / "job" / "events")
        if again.error is None and not again.timed_out:
            repro = measured.reproducible = _compare(measured, job_dir, events,
                                                     again.run_folder / "job", second)
            said = "yes, bitwise" if repro.reproducible else \
                f"no: the runs differ {_where(repro)}"
            console.print(f"  reproducible: {escape(said)}")
        else:
            console.print(f"  the second run did not complete ({again.error or 'timeout'}); "
                          f"reproducibility not measured")
    doc = starter_document(args.name, tr, measured)
    out.write_text(render(doc, tr, measured, command))
    console.print(f"wrote {out}: run it with `faultlab run {out}`")
    return 0

"""The experiment schema: valid documents load, and every mistake is reported where it is.

Each error case asserts the exact problem: line, YAML path and message, as a user sees it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import faultlab.spec as spec
from faultlab.errors import InvalidExperimentError, Problem
from faultlab.faults import fault_types
from faultlab.judge import SLA_KINDS, SLAS
from faultlab.spec import (
    Expect,
    Experiment,
    Selector,
    Suite,
    experiment_from_dict,
    parse_document,
    parse_experiment,
)
from reference_trainer.config import PRESETS

FILE = Path("experiments/x.yaml")

FULL = """\
# Kill rank 1 at step 12 and hang a random rank after the 2nd checkpoint.
# Hardware: any CPU machine. Command: faultlab run experiments/x.yaml
name: full-example_1
description: "every part of the schema"
seed: 7
target:
  trainer: reference
  preset: small
  overrides: {global_batch: 12, async_checkpoint: true, lr: 1, inject_nonfinite: [[3, 0]]}
topology: {nodes: 3, procs_per_node: 2, min_nodes: 2, backend: gloo, max_restarts: 5}
run: {steps: 30, checkpoint_every: 5, timeout_s: 120}
faults:
  - id: kill-1
    type: rank_kill
    target: {rank: 5}
    trigger: {at_step: 12}
    params: {signal: TERM}
  - type: rank_hang
    target: random
    trigger: {after_event: {kind: checkpoint_saved, count: 2, match: {rank: 0}}}
    duration_s: 10
    until: reaction
  - type: node_hang
    target: {node: 2}
    trigger: {at_time_s: 5.5}
    until: reaction
  - type: node_kill
    target: random
    trigger: {every: {mtbf_s: 30, max_count: 3, start_after_s: 1}}
  - type: rank_kill
    target: all
    trigger: {at_step: 30}
expect:
  completes: true
  max_restarts: 2
  detection_latency_s: 5.0
  resume_time_s: 10
  recovery_time_s: 15
  lost_steps: 10
  goodput: 0.5
  bitwise_equal_to_golden: false
  samples_exactly_once: true
"""


def problems(text: str) -> list[tuple[int | None, str, str]]:
    """(line, path, message) of every problem of ``text``; fails if it is valid."""
    with pytest.raises(InvalidExperimentError) as info:
        parse_document(textwrap.dedent(text), FILE)
    assert all(p.file == FILE for p in info.value.problems)
    return [(p.line, p.path, p.message) for p in info.value.problems]


def one_problem(text: str) -> tuple[int | None, str, str]:
    found = problems(text)
    assert len(found) == 1, found
    return found[0]


def doc(fault: str = "", **sections: str) -> str:
    """A valid document with one fault (``fault`` as YAML lines under the list) and any
    top-level section replaced."""
    parts = {"name": "name: t", "topology": "topology: {nodes: 2, procs_per_node: 2}",
             "run": "run: {steps: 40}", **sections}
    body = "\n".join(parts.values())
    if fault:
        body += "\nfaults:\n" + textwrap.indent(textwrap.dedent(fault).strip(), "  ")
    return body + "\n"


KILL = """\
- type: rank_kill
  target: {rank: 1}
  trigger: {at_step: 12}
"""


# ----------------------------------------------------------------------------- valid


def test_minimal_document_takes_every_default() -> None:
    exp = parse_experiment("name: minimal\n")
    assert exp.name == "minimal" and exp.seed == 0 and exp.description is None
    assert exp.target.is_reference and exp.target.trainer == "reference"
    assert exp.target.preset == "tiny" and exp.target.overrides == {}
    assert (exp.topology.nodes, exp.topology.procs_per_node) == (2, 1)
    assert exp.topology.effective_min_nodes == 2 and exp.topology.backend == "auto"
    assert (exp.run.steps, exp.run.checkpoint_every, exp.run.timeout_s) == (40, 10, 300.0)
    assert exp.faults == () and exp.expect.items() == []


def test_full_document() -> None:
    exp = parse_experiment(FULL, FILE)
    assert exp.seed == 7 and exp.target.preset == "small"
    assert exp.target.overrides == {"global_batch": 12, "async_checkpoint": True, "lr": 1.0,
                                    "inject_nonfinite": ((3, 0),)}
    assert exp.topology.world_size == 6 and exp.topology.effective_min_nodes == 2
    assert [f.id for f in exp.faults] == ["kill-1", "rank_hang-1", "node_hang-2",
                                          "node_kill-3", "rank_kill-4"]
    kill, hang, node_hang, mtbf, everyone = exp.faults
    assert (kill.target.kind, kill.target.value) == ("rank", 5)
    assert kill.trigger.kind == "at_step" and kill.trigger.at_step == 12
    assert kill.params.signal == "TERM"  # type: ignore[attr-defined]
    assert isinstance(kill.params, fault_types()["rank_kill"].Params)
    assert hang.target.kind == "random" and hang.trigger.kind == "after_event"
    assert hang.trigger.after_event.match == {"rank": 0}  # type: ignore[union-attr]
    assert (hang.duration_s, hang.until) == (10.0, "reaction")
    assert node_hang.trigger.at_time_s == 5.5 and node_hang.duration_s is None
    assert mtbf.trigger.every.max_count == 3  # type: ignore[union-attr]
    assert mtbf.params.signal == "KILL"  # type: ignore[attr-defined]  # the fault's default
    assert everyone.target.kind == "all" and everyone.target.value is None
    assert exp.expect.items() == [
        ("completes", True), ("max_restarts", 2), ("detection_latency_s", 5.0),
        ("resume_time_s", 10.0), ("recovery_time_s", 15.0), ("lost_steps", 10),
        ("goodput", 0.5), ("bitwise_equal_to_golden", False), ("samples_exactly_once", True)]
    assert type(kill.build()).__name__ == "RankKillFault"


def test_the_model_round_trips_through_python() -> None:
    exp = parse_experiment(FULL)
    dumped = exp.model_dump(mode="json")
    assert dumped["faults"][0]["params"] == {"signal": "TERM"}
    assert dumped["faults"][0]["target"] == {"kind": "rank", "value": 5}
    assert Experiment.model_validate(dumped) == exp


def test_command_target_as_a_list_or_a_shell_string(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    listed = parse_experiment('name: c\ntarget: {command: ["python", "t.py", "--x=1 2"]}\n')
    split = parse_experiment("name: c\ntarget: {command: \"python t.py '--x=1 2'\"}\n")
    assert listed.target.command == split.target.command == ("python", "t.py", "--x=1 2")
    assert not listed.target.is_reference
    assert listed.target.trainer is None and listed.target.preset is None


def test_the_sla_table_covers_every_expect_key() -> None:
    # Expect is built from the SLA declarations (SLAS): same keys, same order; besides them it
    # has detected_by, which signals the detection SLAs count
    fields = [k for k in Expect.model_fields if k != "detected_by"]
    assert list(SLAS) == fields == list(SLA_KINDS)
    exp = parse_experiment("name: e\nexpect: {goodput: 0.5, completes: true, lost_steps: 3}\n")
    assert [k for k, _ in exp.expect.items()] == ["completes", "lost_steps", "goodput"]
    assert SLA_KINDS["goodput"] == "min" and SLA_KINDS["lost_steps"] == "max"
    assert SLA_KINDS["completes"] == "bool"
    assert SLAS["max_restarts"].holds(2, 2) and not SLAS["max_restarts"].holds(3, 2)
    assert SLAS["goodput"].holds(0.6, 0.5) and not SLAS["goodput"].holds(0.4, 0.5)
    assert SLAS["completes"].holds(False, False) and not SLAS["completes"].holds(True, False)


def test_all_is_the_public_api() -> None:
    # ("@py_builtins" and friends: pytest rewrites the asserts of the whole faultlab
    # distribution, since it ships a pytest11 plugin.)
    public = {n for n in vars(spec) if not n.startswith(("_", "@"))} - {
        "loader", "model", "schedule", "target", "faults", "expect", "trainers", "observation",
        "checkpoint_args", "campaign", "campaign_starter", "launch", "launch_check", "schema",
        "sweep", "bar"}
    assert set(spec.__all__) == public
    assert {"load_document", "load_experiments", "parse_experiment", "Experiment", "Suite",
            "FaultSpec", "Selector", "Trigger", "Expect", "Topology", "RunSpec",
            "TargetSpec", "describe_schedule", "resolve_selector"} <= public
    assert not {"SLAS", "SLA_KINDS", "Sla"} & public  # the judge's (faultlab.judge)


def test_python_construction_is_as_strict_as_yaml() -> None:
    assert Selector(kind="rank", value=2).value == 2
    with pytest.raises(ValueError, match="a rank selector takes an integer"):
        Selector(kind="rank")
    with pytest.raises(InvalidExperimentError) as info:
        experiment_from_dict({"name": "p", "faults": [
            {"type": "rank_kill", "target": {"rank": 9}, "trigger": {"at_step": 1}}]})
    (p,) = info.value.problems
    assert (p.line, p.path) == (None, "faults[0].target.rank")


# ------------------------------------------------------------------- located problems


def test_problem_renders_as_file_line_path_message() -> None:
    (line, path, message) = one_problem(doc("""\
        - type: rank_kill
          target: {rank: 1}
          trigger: {at_step: ten}
        """))
    assert (line, path, message) == (7, "faults[0].trigger.at_step",
                                     "expected an integer, got 'ten'")
    assert str(Problem(FILE, line, path, message)) == (
        "experiments/x.yaml:7 faults[0].trigger.at_step: expected an integer, got 'ten'")


def test_all_problems_are_reported_at_once_sorted_by_line() -> None:
    found = problems("""\
        name: t
        run: {steps: 0}
        faults:
          - type: rank_kill
            target: {rank: 1}
            trigger: {at_step: 1.5}
        expect: {goodput: 0}
        """)
    assert found == [
        (2, "run.steps", "must be >= 1, got 0"),
        (6, "faults[0].trigger.at_step", "expected an integer, got 1.5"),
        (7, "expect.goodput", "must be > 0, got 0"),
    ]


@pytest.mark.parametrize("text, expected", [
    ("name: t\ntopolgy: {}\n",
     (2, "topolgy", "unknown key 'topolgy'; did you mean 'topology'?")),
    ("name: t\nzzz: 1\n",
     (2, "zzz", "unknown key 'zzz'; valid keys: name, description, seed, topology, run, "
                "target, observe, faults, expect, golden")),
    (doc("- {type: rank_kill, target: {rank: 1}, tigger: {at_step: 2}, trigger: {at_step: 2}}"),
     (5, "faults[0].tigger", "unknown key 'tigger'; did you mean 'trigger'?")),
    (doc(KILL, topology="topology: {nodes: 2, procs_per_nod: 1}"),
     (2, "topology.procs_per_nod", "unknown key 'procs_per_nod'; did you mean "
                                   "'procs_per_node'?")),
    (doc("- {type: rank_kill, target: {rnk: 1}, trigger: {at_step: 2}}"),
     (5, "faults[0].target.rnk", "unknown key 'rnk'; did you mean 'rank'?")),
    (doc("- {type: rank_kill, target: {rank: 1}, trigger: {at_stp: 2}}"),
     (5, "faults[0].trigger.at_stp", "unknown key 'at_stp'; did you mean 'at_step'?")),
    (doc("- {type: rank_kill, target: {rank: 1}, trigger: {at_step: 2}, params: {sgnal: KILL}}"),
     (5, "faults[0].params.sgnal", "unknown key 'sgnal'; did you mean 'signal'?")),
    (doc("- {type: rank_hang, target: {rank: 1}, trigger: {at_step: 2}, params: {x: 1},"
         " until: reaction}"),
     (5, "faults[0].params.x", "unknown key 'x': rank_hang takes no params")),
    ("name: t\nexpect: {goodptu: 0.5}\n",
     (2, "expect.goodptu", "unknown key 'goodptu'; did you mean 'goodput'?")),
])
def test_unknown_keys_suggest_the_closest_valid_key(text: str, expected: tuple) -> None:
    assert one_problem(text) == expected


def test_unknown_fault_type_lists_the_known_ones() -> None:
    known = ", ".join(sorted(fault_types()))
    assert "rank_kill" in known and "node_hang" in known
    assert one_problem(doc(KILL.replace("rank_kill", "rank_kil"))) == (
        5, "faults[0].type", f"unknown fault type 'rank_kil'; did you mean 'rank_kill'? known "
                             f"types: {known}")
    assert one_problem(doc(KILL.replace("rank_kill", "quantum_decoherence")))[2] == (
        f"unknown fault type 'quantum_decoherence'; known types: {known}")


def test_params_are_checked_against_the_faults_own_params() -> None:
    assert one_problem(doc(KILL + "  params: {signal: HUP}")) == (
        8, "faults[0].params.signal", "expected one of KILL, TERM, SEGV, ABRT, got 'HUP'")
    # node_kill's own Params allow fewer signals than rank_kill's
    node_kill = "- {type: node_kill, target: {node: 1}, trigger: {at_step: 2}, params: " \
                "{signal: SEGV}}"
    assert one_problem(doc(node_kill)) == (
        5, "faults[0].params.signal", "expected one of KILL, TERM, got 'SEGV'")
    assert one_problem(doc(KILL + "  params: [KILL]")) == (
        8, "faults[0].params", "expected a mapping with keys signal, got ['KILL']")


@pytest.mark.parametrize("target, line, path, message", [
    ("{rank: 4}", 5, "faults[0].target.rank",
     "rank 4 does not exist: the job has 4 ranks (0..3 = topology.nodes × procs_per_node)"),
    ("{rank: -1}", 5, "faults[0].target.rank", "must be >= 0, got -1"),
    ("{rank: one}", 5, "faults[0].target.rank", "expected an integer, got 'one'"),
    ("{rank: 1, node: 0}", 5, "faults[0].target",
     "expected exactly one of {rank: N}, {node: N}, random or all, got rank and node"),
    ("rank 1", 5, "faults[0].target",
     "expected {rank: N}, {node: N}, random or all, got 'rank 1'; write {rank: 1}"),
    ("{node: 0}", 5, "faults[0].target",
     "rank_kill cannot target a node; it accepts {rank: N}, random or all (to hit a whole "
     "node, use node_kill)"),
])
def test_rank_kill_targets(target: str, line: int, path: str, message: str) -> None:
    # one-line faults: the fault's own line is 5
    fault = f"- {{type: rank_kill, target: {target}, trigger: {{at_step: 2}}}}"
    assert one_problem(doc(fault)) == (line, path, message)


def test_node_targets() -> None:
    assert one_problem(doc("- {type: node_kill, target: {node: 2}, trigger: {at_step: 2}}")) \
        == (5, "faults[0].target.node", "node 2 does not exist: the job has 2 nodes (0..1)")
    assert one_problem(doc("- {type: node_kill, target: all, trigger: {at_step: 2}}")) == (
        5, "faults[0].target", "node_kill cannot target every rank; it accepts {node: N} or "
                               "random")
    assert one_problem(doc("- {type: node_hang, target: {rank: 0}, trigger: {at_step: 2}, "
                           "until: reaction}"))[2].endswith("(to hit a whole rank, use "
                                                            "rank_hang)")


def test_a_reversible_fault_must_say_how_it_is_undone() -> None:
    hang = """\
        - type: rank_hang
          target: {rank: 1}
          trigger: {at_step: 12}
        """
    assert one_problem(doc(hang)) == (
        5, "faults[0]", "rank_hang must be undone: add duration_s: <seconds>, until: "
                        "reaction, or both (whichever comes first)")
    assert parse_experiment(doc(hang + "  duration_s: 3")).faults[0].duration_s == 3.0
    assert one_problem(doc(hang + "  until: forever")) == (
        8, "faults[0].until", "expected one of reaction, got 'forever'")
    assert one_problem(doc(hang + "  duration_s: 0")) == (
        8, "faults[0].duration_s", "must be > 0, got 0")


def test_an_irreversible_fault_has_no_duration() -> None:
    assert problems(doc(KILL + "  duration_s: 5\n  until: reaction")) == [
        (8, "faults[0].duration_s", "rank_kill cannot be undone (it is not reversible), so "
                                    "it takes no duration_s; remove it"),
        (9, "faults[0].until", "rank_kill cannot be undone (it is not reversible), so it "
                               "takes no until; remove it"),
    ]


@pytest.mark.parametrize("trigger, path, message", [
    ("{}", "faults[0].trigger",
     "set exactly one of at_step, at_time_s, after_event, every; got none"),
    ("{at_step: 2, every: {mtbf_s: 3}}", "faults[0].trigger",
     "set exactly one of at_step, at_time_s, after_event, every; got at_step and every"),
    ("{at_step: 41}", "faults[0].trigger.at_step",
     "step 41 is past the end of the run (run.steps = 40), so the fault would never fire"),
    ("{at_step: 0}", "faults[0].trigger.at_step", "must be >= 1, got 0"),
    ("{at_time_s: 300}", "faults[0].trigger.at_time_s",
     "300 s is not before the experiment's timeout (run.timeout_s = 300), so the fault "
     "would never fire"),
    ("{at_time_s: .nan}", "faults[0].trigger.at_time_s", "expected a finite number, got nan"),
    ("{every: {mtbf_s: 0}}", "faults[0].trigger.every.mtbf_s", "must be > 0, got 0"),
    ("{every: {max_count: 2}}", "faults[0].trigger.every.mtbf_s", "required key is missing"),
    ("{after_event: {kind: checkpoint_save}}", "faults[0].trigger.after_event.kind",
     "unknown event kind 'checkpoint_save'; did you mean 'checkpoint_saved'? known kinds: "
     "start, step, checkpoint_saved, checkpoint_loaded, anomaly, preemption_notice, "
     "fault_injected, final_digest, exit"),
    ("{after_event: {kind: step, count: 0}}", "faults[0].trigger.after_event.count",
     "must be >= 1, got 0"),
    ("{after_event: {kind: step, match: {rank: [0]}}}",
     "faults[0].trigger.after_event.match.rank",
     "expected a string, number, true/false or null, got [0]"),
])
def test_trigger_problems(trigger: str, path: str, message: str) -> None:
    fault = f"- {{type: rank_kill, target: {{rank: 1}}, trigger: {trigger}}}"
    assert one_problem(doc(fault)) == (5, path, message)


def test_fault_ids_are_unique_and_valid() -> None:
    two = KILL.replace("- type", "- id: a\n  type") * 2
    assert one_problem(doc(two)) == (
        9, "faults[1].id", "duplicate fault id 'a' (also faults[0]); ids must be unique")
    assert one_problem(doc(KILL.replace("- type", "- id: 'a b'\n  type"))) == (
        5, "faults[0].id", "'a b' is not a valid fault id: use letters, digits, '_', '-' "
                           "and '.'")


def test_missing_required_keys() -> None:
    assert one_problem("description: no name\n") == (1, "name", "required key is missing")
    assert problems(doc("- {target: all}")) == [
        (5, "faults[0].type", "required key is missing"),
        (5, "faults[0].trigger", "required key is missing"),
    ]


@pytest.mark.parametrize("section, line, path, message", [
    ("topology: {nodes: 0}", 2, "topology.nodes", "must be >= 1, got 0"),
    ("topology: {nodes: 2, min_nodes: 3}", 2, "topology.min_nodes",
     "min_nodes (3) cannot exceed nodes (2)"),
    ("topology: {backend: mpi}", 2, "topology.backend",
     "expected one of auto, gloo, nccl, got 'mpi'"),
    ("topology: {backend: ncl}", 2, "topology.backend",
     "expected one of auto, gloo, nccl, got 'ncl'; did you mean 'nccl'?"),
    # the settings blocks of the registered targets: slurm's, and netns's (examples/plugin,
    # which make installs into the venv as a team's package)
    ("topology: 4", 2, "topology", "expected a mapping with keys nodes, procs_per_node, "
                                   "min_nodes, backend, max_restarts, launcher, netns, slurm, "
                                   "got 4"),
    ("run: {timeout_s: -1}", 2, "run.timeout_s", "must be > 0, got -1"),
    ("run: {timeout_s: .inf}", 2, "run.timeout_s", "expected a finite number, got inf"),
    ("run: {steps: '10'}", 2, "run.steps", "expected an integer, got '10'"),
    ("run: {checkpoint_every: true}", 2, "run.checkpoint_every",
     "expected an integer, got True"),
    ("seed: -3", 2, "seed", "must be >= 0, got -3"),
    ("expect: {completes: 1}", 2, "expect.completes", "expected true or false, got 1"),
    ("expect: {max_restarts: -1}", 2, "expect.max_restarts", "must be >= 0, got -1"),
    ("expect: {goodput: 1.5}", 2, "expect.goodput", "must be <= 1, got 1.5"),
    ("expect: {resume_time_s: 0}", 2, "expect.resume_time_s", "must be > 0, got 0"),
    ("description: [a]", 2, "description", "expected a string, got ['a']"),
])
def test_section_problems(section: str, line: int, path: str, message: str) -> None:
    assert one_problem(f"name: t\n{section}\n") == (line, path, message)


def test_names_are_slugs() -> None:
    assert one_problem("name: Rank Kill!\n") == (
        1, "name", "'Rank Kill!' is not a valid experiment name: use only lowercase letters, "
                   "digits, '_' and '-' (e.g. 'rank_kill')")
    assert one_problem("name: 12\n") == (1, "name", "expected a string, got 12")


@pytest.mark.parametrize("target, line, path, message", [
    ("{preset: tinyy}", 2, "target.preset",
     "unknown preset 'tinyy'; did you mean 'tiny'? choose from: " + ", ".join(PRESETS)),
    ("{trainer: mine}", 2, "target.trainer",
     "unknown trainer 'mine': the bundled trainer is 'reference'; to run your own trainer, "
     "set command: [...] instead"),
    ("{overrides: {global_bach: 4}}", 2, "target.overrides.global_bach",
     "unknown reference-trainer setting 'global_bach'; did you mean 'global_batch'?"),
    ("{overrides: {steps: 4}}", 2, "target.overrides.steps",
     "'steps' cannot be overridden: set run.steps instead"),
    ("{overrides: {run_dir: /tmp}}", 2, "target.overrides.run_dir",
     "'run_dir' cannot be overridden: faultlab gives every run its own directory"),
    ("{overrides: {lr: fast}}", 2, "target.overrides.lr", "expected a number, got 'fast'"),
    ("{overrides: {async_checkpoint: 1}}", 2, "target.overrides.async_checkpoint",
     "expected true or false, got 1"),
    # values the trainer's own TrainConfig rejects, mapped back from its flag to the key
    ("{overrides: {lr: -1}}", 2, "target.overrides.lr", "-1.0 must be a finite number > 0"),
    ("{overrides: {nonfinite_policy: panic}}", 2, "target.overrides.nonfinite_policy",
     "'panic' is not one of rollback, skip, abort"),
    ("{overrides: {inject_nonfinite: [[99, 0]]}}", 2, "target.overrides.inject_nonfinite",
     "step 99 is outside 1..40"),
    ("{command: []}", 2, "target.command", "must not be empty"),
    ("{command: [python, 3]}", 2, "target.command[1]", "expected a string, got 3"),
    ("{command: \"python 'unclosed\"}", 2, "target.command",
     "cannot split \"python 'unclosed\" into arguments: No closing quotation; write it as a "
     "list instead"),
    ("{command: [sleep, '1'], trainer: reference}", 2, "target.command",
     "set either trainer (the bundled reference trainer) or command (your own), not both"),
    ("{command: [sleep, '1'], preset: tiny}", 2, "target.preset",
     "preset applies to the reference trainer only; pass your trainer's own flags in "
     "command"),
    ("{overrides: {1: 2}}", 2, "target.overrides[1]", "keys must be strings, got 1"),
])
def test_target_problems(target: str, line: int, path: str, message: str) -> None:
    assert one_problem(f"name: t\ntarget: {target}\n") == (line, path, message)


@pytest.mark.parametrize("target,message", [
    ("{command: [no-such-trainer-xyz, --steps, '3']}",
     "'no-such-trainer-xyz' is not found: not on PATH, and no executable file of that name "
     "(relative paths start from the directory faultlab runs in, "),
    ("{command: [python, no_such_train.py]}",
     "'no_such_train.py': no such file (relative paths start from the directory faultlab "
     "runs in, "),
])
def test_a_command_that_cannot_start_is_refused_at_load(target: str, message: str) -> None:
    # every rank would fail the same way, restart after restart
    line, path, text = one_problem(f"name: t\ntarget: {target}\n")
    assert (line, path) == (2, "target.command") and text.startswith(message), text


# ----------------------------------------------------------------- document-level


@pytest.mark.parametrize("text, line, message", [
    ("", 1, "the document is empty; an experiment needs at least a name"),
    ("# only a comment\n\n", 1, "the document is empty; an experiment needs at least a name"),
    ("- name: t\n", 1, "expected a mapping with keys name, description, seed, topology, run, "
                       "target, observe, faults, expect, golden (or a suite: name, description, "
                       "suite), got [{'name': 't'}]"),
    ("just text\n", 1, "expected a mapping with keys name, description, seed, topology, run, "
                       "target, observe, faults, expect, golden (or a suite: name, description, "
                       "suite), got 'just text'"),
    ("name: t\nfaults: [\n", 3, "invalid YAML: while parsing a flow node expected the node "
                                "content, but found '<stream end>'"),
    ("name: t\n  seed: 1\n", 2, "invalid YAML: mapping values are not allowed here"),
    ("name: t\n---\nname: u\n", 2, "invalid YAML: expected a single document in the stream "
                                   "but found another document"),
    ("name: t\nseed: \x07\n", 2, "invalid YAML: special characters are not allowed "
                                 "(character #x0007)"),
    ("name: t\nseed: !!python/object:os.system x\n", 2,
     "invalid YAML: could not determine a constructor for the tag "
     "'tag:yaml.org,2002:python/object:os.system'"),
])
def test_document_problems(text: str, line: int, message: str) -> None:
    assert one_problem(text) == (line, "", message)


def test_duplicate_keys_are_reported_at_the_second_one() -> None:
    found = problems("""\
        name: t
        seed: 1
        run:
          steps: 10
          steps: 20
        seed: 2
        """)
    assert found == [
        (5, "run.steps", "duplicate key 'steps' (first at line 4); YAML keeps only the last "
                         "one, so remove one of them"),
        (6, "seed", "duplicate key 'seed' (first at line 2); YAML keeps only the last one, "
                    "so remove one of them"),
    ]
    # and alongside the document's other problems
    assert [p[1] for p in problems("name: t\nname: u\nseed: x\n")] == ["name", "seed"]


def test_yaml_anchors_and_merge_keys_are_not_duplicates() -> None:
    exp = parse_experiment("""\
name: t
topology: {nodes: 2, procs_per_node: 2}
faults:
  - &kill {type: rank_kill, target: {rank: 1}, trigger: {at_step: 2}}
  - <<: *kill
    target: {rank: 2}
""")
    assert [f.target.value for f in exp.faults] == [1, 2]


def test_hostile_yaml_is_a_located_problem() -> None:
    # recursive alias: a list that contains itself
    assert problems("name: t\ndescription: &a [*a]\n")[0][:2] == (2, "description")
    # "billion laughs": aliases nested ten deep are walked once, not expanded
    laughs = "name: t\na0: &a0 [x, x]\n" + "".join(
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}]\n" for i in range(1, 10))
    assert [p[1] for p in problems(laughs)] == [f"a{i}" for i in range(10)]
    # an integer too long for Python to convert
    assert one_problem("name: t\nseed: " + "9" * 5000 + "\n")[:2] == (2, "seed")
    # nesting deeper than the parser's recursion
    deep = "name: t\ndescription: " + "[" * 5000 + "]" * 5000 + "\n"
    assert one_problem(deep)[2].startswith("invalid YAML")


def test_a_suite_is_not_an_experiment() -> None:
    assert isinstance(parse_document("name: s\nsuite: [a.yaml]\n"), Suite)
    with pytest.raises(InvalidExperimentError) as info:
        parse_experiment("name: s\nsuite: [a.yaml]\n", FILE)
    assert [(p.line, p.path) for p in info.value.problems] == [(2, "suite")]
    assert one_problem("name: s\nsuite: [a.yaml]\nfaults: []\n") == (
        3, "faults", "unknown key 'faults'; valid keys: name, description, suite")
    assert one_problem("name: s\nsuite: []\n") == (2, "suite", "must not be empty")


def test_seed_override() -> None:
    assert parse_experiment("name: t\nseed: 3\n", seed=11).seed == 11
    assert parse_experiment("name: t\nseed: 3\n").seed == 3
    with pytest.raises(InvalidExperimentError, match=r"seed: the seed override \(--seed\) "
                                                     r"must be an integer in \[0, 2\*\*63\), "
                                                     r"got -1"):
        parse_experiment("name: t\n", seed=-1)


def test_the_slurm_block_is_the_slurm_targets_settings_and_survives_a_dump() -> None:
    """``topology.slurm:`` is parsed by ``SlurmTarget.settings`` into ``topology.settings``
    (the defaults where absent, None for a target without settings), and a dump (a
    campaign's runs, the journal's document) writes it back under its key."""
    from faultlab.targets.slurm.settings import SlurmSettings

    exp = spec.experiment_from_dict({"name": "s", "topology": {
        "launcher": "slurm", "slurm": {"time_limit": "5:00", "sbatch_args": "--exclusive"}}})
    assert exp.topology.settings == SlurmSettings(time_limit="5:00",
                                                  sbatch_args=("--exclusive",))
    dumped = exp.model_dump(mode="json")
    assert dumped["topology"]["slurm"]["sbatch_args"] == ["--exclusive"]
    assert spec.experiment_from_dict(dumped) == exp
    bare = spec.experiment_from_dict({"name": "s", "topology": {"launcher": "slurm"}})
    assert bare.topology.settings == SlurmSettings()
    local = spec.experiment_from_dict({"name": "s"})
    assert local.topology.settings is None and "slurm" not in local.model_dump()["topology"]

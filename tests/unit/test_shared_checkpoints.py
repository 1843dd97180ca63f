"""Checkpoints shared between runs (issue 21): found in synthetic event streams, the run stopped
before anything is launched, the verdict naming a resume from a checkpoint the run did not
write, ``faultlab validate`` warning of a fixed checkpoint argument, ``faultlab init`` pointing
it into its run directory. Every message is located and shows the ``{run_dir}`` fix; no file
of the user's is ever deleted.

The one real job of this scenario is ``tests/integration/test_fixed_checkpoint_dir.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from faultlab.cli import main as cli_main
from faultlab.engine import run_experiment
from faultlab.engine.golden import golden_key, golden_run
from faultlab.engine.shared_checkpoints import (
    OWN_CHECKPOINTS_CHECK,
    SharedCheckpoint,
    golden_outside_message,
    golden_resumed_message,
    own_checkpoints_check,
    preexisting_checkpoints,
)
from faultlab.engine.starter import (
    measure,
    own_checkpoint_dirs,
    parse_torchrun,
    shared_checkpoints,
    starter_document,
)
from faultlab.observe.checkpoint_origin import foreign_resumes, outside_saves
from faultlab.spec import load_experiment
from faultlab.spec.checkpoint_args import checkpoint_args, checkpoint_warnings

REPO = Path(__file__).resolve().parents[2]

EXPERIMENT = """\
# the natural first experiment: the trainer's usual fixed --ckpt-dir
name: my_job
target:
  command: [python, train.py, --steps, "40", --ckpt-every, "10",
            --ckpt-dir, ckpt]
run: {steps: 40, timeout_s: 60}
topology: {nodes: 2, procs_per_node: 1, max_restarts: 2}
faults:
  - {id: kill, type: rank_kill, target: {rank: 1}, trigger: {at_step: 15}}
expect: {completes: true, bitwise_equal_to_golden: true}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project: train.py and my_job.yaml, faultlab run from there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "my_job.yaml").write_text(EXPERIMENT)
    return tmp_path


# -- which arguments are checkpoint locations ---------------------------------------------

@pytest.mark.parametrize("command,found", [
    (["python", "t.py", "--ckpt-dir", "ckpt", "--ckpt-every", "10"], [(3, "--ckpt-dir", "ckpt")]),
    (["python", "t.py", "--checkpoint_dir=/data/c"], [(2, "--checkpoint_dir", "/data/c")]),
    (["python", "t.py", "--checkpoint.folder", "out"], [(3, "--checkpoint.folder", "out")]),
    (["python", "t.py", "--save-dir", "s", "--output-dir", "o", "--out_dir=x"],
     [(3, "--save-dir", "s"), (5, "--output-dir", "o"), (6, "--out_dir", "x")]),
    (["python", "t.py", "trainer.default_root_dir=runs", "+callbacks.ckpt.dirpath=c"],
     [(2, "trainer.default_root_dir", "runs"), (3, "+callbacks.ckpt.dirpath", "c")]),
    (["python", "t.py", "--save", "/ckpts", "--resume", "ck/latest.pt"],
     [(3, "--save", "/ckpts"), (5, "--resume", "ck/latest.pt")]),
    (["python", "t.py", "ckpt_path=/runs/last.ckpt"], [(2, "ckpt_path", "/runs/last.ckpt")]),
    # not a location: a number, a keyword, a switch, another kind of directory
    (["python", "t.py", "--ckpt-every", "4", "--num-checkpoints", "3", "ckpt_path=last",
      "--save", "--resume", "--log-dir", "logs", "--data-dir", "d",
      "--resume-from-checkpoint", "true"], []),
])
def test_checkpoint_like_arguments_are_recognised(command: list[str],
                                                  found: list[tuple[int, str, str]]) -> None:
    assert [(a.index, a.name, a.value) for a in checkpoint_args(command)] == found


def test_a_fixed_argument_is_warned_of_at_its_line_with_the_fix(project: Path) -> None:
    exp = load_experiment("my_job.yaml")
    [warning] = checkpoint_warnings(exp.target.command, Path("my_job.yaml"))
    assert str(warning).startswith("my_job.yaml:5 target.command[7]: --ckpt-dir ckpt is a "
                                   "fixed checkpoint path")
    assert str(warning).endswith("give each run its own: --ckpt-dir {run_dir}/ckpt")
    joined = ["python", "t.py", "--ckpt-dir={run_dir}/ckpt", "dirpath=/data/run1/"]
    assert [w.message.rsplit(": ", 1)[1] for w in checkpoint_warnings(joined, None)] == \
        ["dirpath={run_dir}/run1"]


def test_validate_and_dry_run_warn_and_still_pass(project: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["validate", "my_job.yaml"]) == 0
    out = capsys.readouterr().out
    assert "ok  my_job.yaml" in out
    assert "warning my_job.yaml:5 target.command[7]: --ckpt-dir ckpt is a fixed" in out
    assert cli_main(["run", "--dry-run", "my_job.yaml"]) == 0  # and before anything runs
    out = " ".join(capsys.readouterr().out.split())
    assert "warning my_job.yaml:5 target.command[7]: --ckpt-dir ckpt is a fixed" in out
    assert "dry run: nothing was launched or injected." in out


def test_no_shipped_experiment_shares_checkpoints() -> None:
    files = sorted(REPO.glob("examples/*/experiments/*.yaml")) + \
        sorted(REPO.glob("experiments/*.yaml"))
    commands = [(f, load_experiment(f).target.command) for f in files
                if "suite" not in f.read_text()]
    assert sum(1 for _f, c in commands if c) >= 10  # the level-0 examples were read
    assert [str(w) for f, c in commands for w in checkpoint_warnings(c, f)] == []


# -- the evidence in the events -----------------------------------------------------------

def _ev(t: float, kind: str, rank: int = 0, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "rank": rank, **fields}


def test_a_resume_from_the_golden_runs_checkpoint_is_foreign(tmp_path: Path) -> None:
    shared, run = tmp_path / "ckpt", tmp_path / "run"
    events = [_ev(1, "start"), _ev(1, "start", 1),
              _ev(3, "checkpoint_loaded", 0, step=40, path=str(shared / "step_40"),
                  step_source="path"),
              _ev(3.1, "checkpoint_loaded", 1, step=40, path=str(shared / "step_40")),
              _ev(4, "exit", 0, reason="completed")]
    [resume] = foreign_resumes(events, run)
    assert (resume.path, resume.step, resume.ranks, resume.t) == \
        (str(shared / "step_40"), 40, (0, 1), 3)


def test_resumes_from_the_runs_own_checkpoints_are_not(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "fixed"
    events = [
        _ev(1, "checkpoint_saved", step=10, path=str(run / "ckpt" / "step_10")),
        _ev(2, "checkpoint_loaded", 1, step=10, path=str(run / "ckpt" / "step_10")),
        # inside the run directory, even unrecorded (a copy, a framework's own file)
        _ev(3, "checkpoint_loaded", 1, step=10, path=str(run / "ckpt" / "last.ckpt")),
        # outside, but saved by this run before the load
        _ev(4, "checkpoint_saved", step=20, path=str(outside / "step_20")),
        _ev(5, "checkpoint_loaded", 1, step=20, path=str(outside / "step_20")),
        # not a resume: pretrained weights (no step), a load of step 0
        _ev(6, "checkpoint_loaded", 0, step=None, path="/models/base.pt"),
        _ev(7, "checkpoint_loaded", 0, step=0, path="/models/init.pt"),
    ]
    assert foreign_resumes(events, run) == []
    # the same path loaded before this run saved it: an earlier run's
    early = [_ev(1, "checkpoint_loaded", 0, step=20, path=str(outside / "step_20")),
             *events[3:5]]
    assert [r.path for r in foreign_resumes(early, run)] == [str(outside / "step_20")]


def test_paths_are_compared_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fixed" / "step_20").mkdir(parents=True)
    os.symlink(tmp_path / "fixed" / "step_20", tmp_path / "latest")
    events = [_ev(1, "checkpoint_saved", step=20, path="fixed/step_20"),
              _ev(2, "checkpoint_loaded", 1, step=20, path=str(tmp_path / "latest"))]
    assert foreign_resumes(events, tmp_path / "run") == []
    assert outside_saves(events, tmp_path / "run") == ["fixed/step_20"]
    assert outside_saves(events, tmp_path) == []


# -- what the run and its verdict say -----------------------------------------------------

def test_the_verdict_names_a_resume_the_run_did_not_write(project: Path) -> None:
    exp = load_experiment("my_job.yaml")
    ckpt = project / "ckpt" / "step_40"
    events = [_ev(3, "checkpoint_loaded", r, step=40, path=str(ckpt)) for r in (0, 1)]
    check = own_checkpoints_check(exp, Path("my_job.yaml"), events, project / "run")
    assert check is not None and check.name == OWN_CHECKPOINTS_CHECK and not check.passed
    assert check.note.startswith(f"resumed from {ckpt} (step 40, ranks 0, 1), a checkpoint "
                                 f"this run did not write")
    assert "my_job.yaml:5 target.command[7]: --ckpt-dir ckpt is the same path for every " \
           "run; give each run its own: --ckpt-dir {run_dir}/ckpt" in check.note
    assert own_checkpoints_check(exp, None, events[:0], project / "run") is None


def test_a_directory_no_argument_names_is_located_at_the_command(project: Path) -> None:
    exp = load_experiment("my_job.yaml")
    error = SharedCheckpoint([foreign_resumes(
        [_ev(1, "checkpoint_loaded", step=30, path="/srv/team/ckpts/step_30")], "/r")[0]],
        Path("/r"))
    message = golden_resumed_message(exp, Path("my_job.yaml"), error)
    assert message.startswith("my_job.yaml:4 target.command: the golden run resumed from "
                              "/srv/team/ckpts/step_30 (step 30, rank 0)")
    assert "no argument of target.command names /srv/team/ckpts" in message
    assert "--ckpt-dir {run_dir}/checkpoints" in message and "deleted nothing" in message


def test_golden_checkpoints_outside_its_run_dir_stop_the_run(project: Path) -> None:
    """A cached golden run whose checkpoints lie in ./ckpt: the experiment is not launched, the
    message is located and shows the fix, and the user's checkpoints are left as they were."""
    exp = load_experiment("my_job.yaml")
    cache = project / "reports" / ".golden"
    cache.mkdir(parents=True)
    saved = [str(project / "ckpt" / f"step_{s}") for s in (10, 20, 30, 40)]
    (cache / f"{golden_key(exp)}.json").write_text(json.dumps({
        "digest": "ab" * 32, "losses": {}, "wall_s": 1.0, "run_dir": str(cache / "g"),
        "tensors": {}, "not_measured": None, "checkpoints_outside": saved}))
    message = golden_outside_message(exp, Path("my_job.yaml"), str(cache / "g"), saved)
    assert "they are gone now" in message
    (project / "ckpt" / "step_40").mkdir(parents=True)
    (project / "ckpt" / "step_40" / ".metadata").write_text("theirs")
    result = run_experiment(exp, source=Path("my_job.yaml"), report_dir=project / "reports")
    assert result.verdict == "fail" and result.slas == []
    assert result.error is not None and result.error.startswith(
        "my_job.yaml:5 target.command[7]: ")
    # it stopped before the golden run: the directory already held a checkpoint
    assert f"{project / 'ckpt'} already holds files" in result.error
    assert "--ckpt-dir {run_dir}/ckpt" in result.error
    assert not (result.run_folder / "job" / "events").exists()
    assert (project / "ckpt" / "step_40" / ".metadata").read_text() == "theirs"
    # with the directory gone, the cached golden run's checkpoints stop it after the golden
    (project / "ckpt" / "step_40" / ".metadata").unlink()
    (project / "ckpt" / "step_40").rmdir()
    result = run_experiment(exp, source=Path("my_job.yaml"), report_dir=project / "reports")
    assert result.golden is not None and result.golden.cached
    assert result.error == golden_outside_message(exp, Path("my_job.yaml"), str(cache / "g"),
                                                  saved)
    assert "the golden run saved its checkpoints to " + str(project / "ckpt") in result.error
    assert not (result.run_folder / "job" / "events").exists()
    journal = json.loads(result.journal_path.read_text())
    assert journal["verdict"] == "fail" and journal["run"]["error"] == result.error


def test_an_empty_fixed_directory_does_not_stop_before_the_golden_run(project: Path) -> None:
    exp = load_experiment("my_job.yaml")
    (project / "ckpt").mkdir()
    assert preexisting_checkpoints(exp, Path("my_job.yaml")) is None


# -- faultlab init -------------------------------------------------------------------------

def test_init_points_a_fixed_checkpoint_argument_into_its_run_dir(project: Path) -> None:
    tr = parse_torchrun(["torchrun", "--nnodes", "2", "train.py", "--ckpt-dir", "ckpt",
                         "--steps", "12"])
    tr.command, moved = own_checkpoint_dirs(tr.command)
    assert tr.command == ["python", "train.py", "--ckpt-dir", "{run_dir}/ckpt", "--steps", "12"]
    assert [a.shown() for a in moved] == ["--ckpt-dir ckpt"]
    job = project / "reports" / "my_job-1" / "job"
    events = [_ev(104.0 + s, "step", step=s, step_time_s=1.0) for s in range(1, 13)] + \
        [_ev(105.0 + s, "checkpoint_saved", step=s, seconds=0.2,
             path=str(job / "ckpt" / f"step_{s}")) for s in (4, 8, 12)] + \
        [_ev(118.0, "final_digest", digest="d" * 64, source="final_checkpoint")]  # read back
    assert shared_checkpoints(events, job) is None
    doc = starter_document("my_job", tr, measure(events, [], ok=True, wall_s=20.0))
    assert doc["target"]["command"] == tr.command
    assert doc["expect"]["bitwise_equal_to_golden"] is True


def test_init_stops_when_the_trainer_chose_a_shared_directory(project: Path) -> None:
    job = project / "reports" / "my_job-1" / "job"
    saved = [_ev(105.0 + s, "checkpoint_saved", step=s, path=str(project / "checkpoints" /
                                                                  f"step_{s}"))
             for s in (10, 20, 30)]
    message = shared_checkpoints(saved, job)
    assert message is not None and message.startswith(
        f"the trainer saved its checkpoints to {project / 'checkpoints'} (step_10, step_20, "
        f"step_30), outside the run directory")
    resumed = [_ev(2, "checkpoint_loaded", step=30, path=str(project / "checkpoints" /
                                                             "step_30"))]
    message = shared_checkpoints(resumed, job)
    assert message is not None and message.startswith(
        f"the fault-free run resumed from {project / 'checkpoints' / 'step_30'} (step 30), a "
        f"checkpoint it did not write")


def test_a_cache_entry_from_before_reads_its_checkpoints_from_its_events(project: Path) -> None:
    exp = load_experiment("my_job.yaml")
    cache = project / "reports" / ".golden"
    (cache / "g" / "events").mkdir(parents=True)
    saved = str(project / "ckpt" / "step_40")
    (cache / "g" / "events" / "node0-rank0.jsonl").write_text(json.dumps(
        _ev(1, "checkpoint_saved", step=40, path=saved)) + "\n")
    (cache / f"{golden_key(exp)}.json").write_text(json.dumps({
        "digest": "ab" * 32, "losses": {}, "wall_s": 1.0, "run_dir": str(cache / "g"),
        "tensors": {}, "not_measured": None}))
    golden = golden_run(exp, cache, timeout_s=1)
    assert golden.cached and golden.checkpoints_outside == (saved,)

"""A user's first experiment with the trainer's usual fixed checkpoint directory (issue 21), on
the unchanged examples/fsdp2_dcp trainer: real DCP saves and loads, as level 0 reports them.

Launch 1 is the golden run of ``--ckpt-dir <fixed>`` (4 steps, checkpoints at 2 and 4): its
checkpoints lie outside its run directory, so the experiment is stopped before it starts,
with the located message and the ``{run_dir}`` fix, and the checkpoints are left in place.
Launch 2 is the experiment of a trainer that picks the same directory itself (``CKPT_DIR``, no
argument): it resumes from step_4, trains nothing, and its verdict says so first.
The detection logic itself is unit-tested on synthetic streams
(``tests/unit/test_shared_checkpoints.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlab.engine import run_experiment
from faultlab.engine.shared_checkpoints import OWN_CHECKPOINTS_CHECK
from faultlab.spec import load_experiment

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

EXPERIMENT = """\
name: shared_ckpt
target:
  command: [python, {trainer}, --steps, "4", --ckpt-every, "2"{ckpt_arg}]
topology: {{nodes: 2, procs_per_node: 1, max_restarts: 2}}
run: {{steps: 4, timeout_s: 240}}
faults:
  - {{id: kill, type: rank_kill, target: {{rank: 1}}, trigger: {{at_step: 3}}}}
expect: {{completes: true{bitwise}}}
"""


def _experiment(folder: Path, name: str, ckpt_arg: str, bitwise: str) -> Path:
    path = folder / name
    path.write_text(EXPERIMENT.format(trainer=REPO / "examples" / "fsdp2_dcp" / "train.py",
                                      ckpt_arg=ckpt_arg, bitwise=bitwise))
    return path


def test_a_fixed_checkpoint_dir_is_caught_before_and_after_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = tmp_path / "ckpt"
    reports = tmp_path / "reports"
    fixed = _experiment(tmp_path, "fixed.yaml", f', --ckpt-dir, "{ckpt}"',
                        ", bitwise_equal_to_golden: true")
    result = run_experiment(load_experiment(fixed), source=fixed, report_dir=reports)
    assert result.golden is not None and not result.golden.cached, result.error
    assert result.verdict == "fail" and result.slas == []
    assert result.error is not None and result.error.startswith(
        f"{fixed}:3 target.command[7]: the golden run saved its checkpoints to {ckpt}, outside "
        f"its run directory"), result.error
    assert "still there (step_2 … step_4, 2 in all)" in result.error
    assert f"--ckpt-dir {ckpt} is the same path for every run; give each run its own: " \
           f"--ckpt-dir {{run_dir}}/ckpt" in result.error
    assert not (result.run_folder / "job" / "events").exists(), "the experiment was launched"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2", "step_4"]

    # The trainer's own default directory: nothing in the command names it.
    monkeypatch.setenv("CKPT_DIR", str(ckpt))
    implicit = _experiment(tmp_path, "implicit.yaml", "", "")
    result = run_experiment(load_experiment(implicit), source=implicit, report_dir=reports)
    first = result.slas[0]
    assert (first.name, first.passed) == (OWN_CHECKPOINTS_CHECK, False)
    assert first.note.startswith(f"resumed from {ckpt / 'step_4'} (step 4, ranks 0, 1), a "
                                 f"checkpoint this run did not write"), first.note
    assert f"{implicit}:3 target.command: no argument of target.command names {ckpt}" in \
        first.note
    assert result.verdict == "fail"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2", "step_4"]

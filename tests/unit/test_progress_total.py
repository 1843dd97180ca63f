"""The progress line counts to what the job runs: for a user's trainer without ``run.steps``,
the step count its command names, or no total at all; never ``step 30/40`` for a 30-step job.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from faultlab.engine.view import RunView
from faultlab.spec import experiment_from_dict
from faultlab.spec.checkpoint_args import steps_of_command

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "fsdp2_dcp" / "train.py")


@pytest.mark.parametrize(("args", "steps"), [
    (["--steps", "30"], 30),
    (["--max-steps=12", "--lr", "3"], 12),
    (["trainer.max_steps=7"], 7),  # Hydra / Lightning
    (["--training.steps", "5"], 5),  # torchtitan
    (["--max_iters=9"], 9),  # nanoGPT
    (["--lr", "3", "--steps"], None),  # a switch with no value
    (["--warmup-steps", "100"], None),  # not the run's length
])
def test_steps_of_command(args: list[str], steps: int | None) -> None:
    assert steps_of_command(["python", TRAIN, *args]) == steps


@pytest.mark.parametrize(("doc", "planned"), [
    ({"target": {"command": ["python", TRAIN, "--steps", "30"]}}, 30),
    ({"target": {"command": ["python", TRAIN]}}, None),
    ({"target": {"command": ["python", TRAIN, "--steps", "30"]}, "run": {"steps": 16}}, 16),
    ({}, 40),  # the reference trainer runs run.steps, its default included
])
def test_planned_steps(doc: dict, planned: int | None) -> None:
    assert experiment_from_dict({"name": "p", **doc}).planned_steps == planned


def test_the_progress_line_shows_no_total_it_does_not_know() -> None:
    out = io.StringIO()
    view = RunView(Console(file=out, force_terminal=False, width=120))
    view.start("job", None)
    view.on_events([{"kind": "step", "rank": 0, "step": 30}])
    shown = out.getvalue()
    assert "running the job" in shown and "step 30" in shown and "step 30/" not in shown

"""The launcher's argument checks (faultlab.targets.launcher.LocalJob) and the reference
trainer's preflight() of the run directory (reference_trainer.plugin).

Nothing here starts a process: LocalJob is only constructed, preflight only looks at files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faultlab.targets.launcher import JobResult, LaunchError, LocalJob
from reference_trainer.config import TrainConfig
from reference_trainer.plugin import PreflightError, preflight


def _cfg(run_dir: Path, **kw: object) -> TrainConfig:
    return TrainConfig(run_dir=run_dir, **kw)  # type: ignore[arg-type]


# --- preflight -------------------------------------------------------------------------------


def test_new_run_dir_is_created_with_its_subdirectories(tmp_path: Path) -> None:
    run_dir = tmp_path / "a" / "b" / "run"
    preflight(_cfg(run_dir))
    for sub in ("events", "checkpoints", "logs"):
        assert (run_dir / sub).is_dir()


def test_existing_empty_run_dir_is_fine_with_either_policy(tmp_path: Path) -> None:
    for policy in ("fail", "scratch"):
        preflight(_cfg(tmp_path, on_no_valid_checkpoint=policy))
    preflight(_cfg(tmp_path))  # and a second time, with the subdirectories now present


@pytest.mark.parametrize("what", ["checkpoints", "events", "."])
def test_a_regular_file_where_a_directory_belongs(tmp_path: Path, what: str) -> None:
    run_dir = tmp_path / "run"
    if what == ".":
        run_dir.write_text("not a directory")
        culprit = run_dir
    else:
        run_dir.mkdir()
        culprit = run_dir / what
        culprit.write_text("not a directory")
    with pytest.raises(PreflightError) as info:
        preflight(_cfg(run_dir))
    assert str(info.value).startswith("--run-dir: ")
    assert repr(str(culprit)) in str(info.value)
    assert culprit.is_file()  # reported, not replaced


def _step_dir_without_manifest(run_dir: Path) -> Path:
    step = run_dir / "checkpoints" / "step_00000010"
    step.mkdir(parents=True)
    (step / "__0_0.distcp").write_bytes(b"\0" * 64)
    return step


def _step_dir_with_corrupt_manifest(run_dir: Path, text: str) -> Path:
    step = run_dir / "checkpoints" / "step_00000010"
    step.mkdir(parents=True)
    (step / "MANIFEST.json").write_text(text)
    return step


MANIFESTS = {
    "not-json": "{\"format\": \"faultlab-ref",
    "not-an-object": "[1, 2, 3]",
    "wrong-checksum": json.dumps({"format": "faultlab-reference-trainer-checkpoint/1",
                                  "step": 10, "world_size": 1, "files": {},
                                  "manifest_sha256": "0" * 64}),
    "no-checksum": json.dumps({"format": "faultlab-reference-trainer-checkpoint/1",
                               "step": 10, "files": {}}),
}


def test_checkpoint_without_manifest_fails_preflight(tmp_path: Path) -> None:
    _step_dir_without_manifest(tmp_path)
    with pytest.raises(PreflightError) as info:
        preflight(_cfg(tmp_path, on_no_valid_checkpoint="fail"))
    msg = str(info.value)
    assert "step_00000010" in msg and "MANIFEST.json" in msg
    assert "--on-no-valid-checkpoint scratch" in msg


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_checkpoint_with_corrupt_manifest_fails_preflight(tmp_path: Path, kind: str) -> None:
    _step_dir_with_corrupt_manifest(tmp_path, MANIFESTS[kind])
    with pytest.raises(PreflightError) as info:
        preflight(_cfg(tmp_path, on_no_valid_checkpoint="fail"))
    assert "step_00000010" in str(info.value) and "corrupt" in str(info.value)


@pytest.mark.parametrize("kind", ["no-manifest", *sorted(MANIFESTS)])
def test_scratch_policy_accepts_invalid_checkpoints(tmp_path: Path, kind: str) -> None:
    if kind == "no-manifest":
        step = _step_dir_without_manifest(tmp_path)
    else:
        step = _step_dir_with_corrupt_manifest(tmp_path, MANIFESTS[kind])
    preflight(_cfg(tmp_path, on_no_valid_checkpoint="scratch"))
    assert step.is_dir()  # preflight only looks


def test_every_invalid_checkpoint_is_named(tmp_path: Path) -> None:
    _step_dir_without_manifest(tmp_path)
    other = tmp_path / "checkpoints" / "step_00000020"
    other.mkdir()
    (other / "MANIFEST.json").write_text("garbage")
    with pytest.raises(PreflightError) as info:
        preflight(_cfg(tmp_path))
    assert "step_00000010" in str(info.value) and "step_00000020" in str(info.value)


def test_unfinished_saves_and_quarantine_are_not_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    (ckpt / ".tmp-step_00000010-abcdef").mkdir(parents=True)
    (ckpt / "corrupt" / "step_00000005-1234abcd").mkdir(parents=True)
    (ckpt / "step_00000007.old").mkdir()
    preflight(_cfg(tmp_path, on_no_valid_checkpoint="fail"))


# --- LocalJob arguments ----------------------------------------------------------------------


@pytest.mark.parametrize("kw,flag,value", [
    ({"nodes": 0}, "--nodes", 0),
    ({"procs_per_node": 0}, "--procs-per-node", 0),
    ({"nodes": 2, "min_nodes": 3}, "--min-nodes", 3),
    ({"nodes": 2, "min_nodes": 0}, "--min-nodes", 0),
    ({"max_restarts": -1}, "--max-restarts", -1),
    ({"last_call_timeout_s": -1}, "--rdzv-last-call-s", -1),
])
def test_local_job_rejects_bad_arguments(tmp_path: Path, kw: dict[str, int], flag: str,
                                         value: int) -> None:
    with pytest.raises(LaunchError) as info:
        LocalJob(command=["true"], run_dir=tmp_path / "run", **kw)  # type: ignore[arg-type]
    assert str(info.value).startswith(f"{flag}: {value!r} ")
    assert not (tmp_path / "run").exists()


def test_preflight_needs_a_sample_per_rank(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match=r"^--global-batch: 5 "):
        preflight(_cfg(tmp_path, global_batch=5), world_size=6)
    preflight(_cfg(tmp_path, global_batch=6), world_size=6)


def test_local_job_defaults_and_command(tmp_path: Path) -> None:
    job = LocalJob(command=["python", "train.py"], run_dir=tmp_path, nodes=3, procs_per_node=2)
    assert job.min_nodes == 3 and job.world_size == 6  # min_nodes defaults to --nodes
    assert LocalJob(command=["x"], run_dir=tmp_path, nodes=3, min_nodes=2).min_nodes == 2
    argv = job.agent_argv("127.0.0.1:1", "", "127.0.0.1")
    assert argv[-3:] == ["--no-python", "python", "train.py"]  # run as given, no interpreter
    with pytest.raises(LaunchError, match="^command: empty"):
        LocalJob(command=[], run_dir=tmp_path)


def test_job_result_ok_ignores_killed_nodes_only() -> None:
    assert JobResult({"node0": 0, "node1": -9}, killed={"node1"}, wall_s=1.0).ok
    assert not JobResult({"node0": 0, "node1": -9}, killed=set(), wall_s=1.0).ok
    assert not JobResult({"node0": 1, "node1": 0}, killed={"node1"}, wall_s=1.0).ok
    assert not JobResult({"node0": -9}, killed={"node0"}, wall_s=1.0).ok  # nothing counted
    assert not JobResult({"node0": None}, killed=set(), wall_s=1.0).ok  # still running


def test_replicas_that_do_not_divide_the_ranks_are_refused(tmp_path: Path) -> None:
    preflight(_cfg(tmp_path, replicate=3), world_size=6)
    with pytest.raises(PreflightError, match=r"--replicate: 2 does not divide the world size "
                                             r"\(3\): use a divisor of it, or 1"):
        preflight(_cfg(tmp_path, replicate=2), world_size=3)

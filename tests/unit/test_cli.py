"""Bad command lines: exit code 2 and one line on stderr naming the flag and the value."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from faultlab.targets import launcher
from reference_trainer.health import EXIT_CODES
from reference_trainer.train import parse_config

REPO = Path(__file__).resolve().parents[2]


def _names_flag_and_value(line: str, flag: str, value: str) -> bool:
    """``flag`` appears, followed on the same line by ``value`` as a whole token."""
    pattern = re.escape(flag) + r":.*(?<![\w.-])" + re.escape(value) + r"(?![\w.])"
    return re.search(pattern, line) is not None


# A real interpreter per case (each pays for importing torch, 2.7 CPU-s a trainer): one per
# program, for what only a real process shows (the exit code, one line on stderr and nothing
# else, no run folder created). Which flags and values are refused, and how each is named, is
# the in-process tests' below: the trainer's every check is parse_config's.
SUBPROCESS_CASES = [
    ("reference_trainer.train", ["--steps", "ten"], "--steps", "'ten'"),
    ("faultlab.cli", ["--nodes", "0", "--", "true"], "--nodes", "0"),
]


@pytest.mark.parametrize("module,args,flag,value", SUBPROCESS_CASES,
                         ids=[f"{c[0].split('.')[1]}{c[2]}" for c in SUBPROCESS_CASES])
def test_bad_flag_in_a_real_process(tmp_path: Path, module: str, args: list[str], flag: str,
                                    value: str) -> None:
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "FAULTLAB_RUN_DIR"}
    sub = ["launch"] if module == "faultlab.cli" else []
    proc = subprocess.run([sys.executable, "-m", module, *sub, "--run-dir", str(run_dir), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_CODES["usage"] == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert _names_flag_and_value(lines[0], flag, value), lines[0]
    assert proc.stdout == ""
    assert not run_dir.exists()  # nothing was launched, nothing was created


# --- the same paths in-process (cheap) -------------------------------------------------------


@pytest.mark.parametrize("args,flag,value", [
    (["--steps", "ten"], "--steps", "'ten'"),
    (["--lr", "fast"], "--lr", "'fast'"),
    (["--deterministic", "maybe"], "--deterministic", "'maybe'"),
    (["--inject-nonfinite", "x:1"], "--inject-nonfinite", "'x:1'"),
    (["--steps", "10", "--stop-after", "11"], "--stop-after", "11"),
    (["--stop-after", "50", "--steps", "10"], "--stop-after", "50"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints", "0"),
    (["--checkpoint-every", "0"], "--checkpoint-every", "0"),
    (["--preset", "huge"], "--preset", "'huge'"),
])
def test_parse_config_usage_errors(args: list[str], flag: str, value: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(["--run-dir", "r", *args])
    assert info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert _names_flag_and_value(lines[0], flag, value), lines[0]


def test_parse_config_needs_a_run_dir(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FAULTLAB_RUN_DIR", raising=False)
    with pytest.raises(SystemExit) as info:
        parse_config(["--steps", "3"])
    assert info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "--run-dir" in lines[0]


def test_parse_config_takes_the_run_dir_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAULTLAB_RUN_DIR", str(tmp_path / "from-env"))
    assert parse_config(["--steps", "3"]).run_dir == tmp_path / "from-env"
    assert parse_config(["--run-dir", "x"]).run_dir == Path("x")


@pytest.mark.parametrize("args,flag,value", [
    (["--nodes", "0"], "--nodes", "0"),
    (["--procs-per-node", "0"], "--procs-per-node", "0"),
    (["--nodes", "2", "--min-nodes", "3"], "--min-nodes", "3"),
    (["--nodes", "2", "--min-nodes", "0"], "--min-nodes", "0"),
    (["--max-restarts", "-1"], "--max-restarts", "-1"),
    (["--rdzv-last-call-s", "-1"], "--rdzv-last-call-s", "-1"),
    (["--nodes", "two"], "--nodes", "'two'"),
])
def test_launch_main_usage_errors(tmp_path: Path, args: list[str], flag: str, value: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        launcher.main(["--run-dir", str(run_dir), *args, "--", "python", "train.py"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert _names_flag_and_value(lines[0], flag, value), lines[0]
    assert captured.out == ""
    assert not run_dir.exists()


def test_launch_main_needs_a_command(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    for tail in ([], ["--"]):
        with pytest.raises(SystemExit) as info:
            launcher.main(["--run-dir", str(tmp_path / "run"), *tail])
        assert info.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and "give the job's command after --" in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_bar_for_a_trainer_that_needs_its_own_launcher_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NVRx's RankMonitorClient fails under faultlab's launcher: --bar would print that failed
    set-up as a bar. Refused, located at the launch line, and the team's run does not start."""
    from faultlab.cli import main

    exp = Path(__file__).resolve().parents[2] / "examples/nvrx_ft/experiments/rank_kill.yaml"
    code = main(["run", "--bar", "--report-dir", str(tmp_path), str(exp)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert f"{exp}:17 target.launch: --bar cannot run 'nvrx_ft_rank_kill'" in err
    assert "RankMonitorClient" in err and "nothing was run." in err
    assert list(tmp_path.iterdir()) == []

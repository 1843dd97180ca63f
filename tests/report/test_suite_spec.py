"""The pre-launch suite document: loading, and every mistake located (file:line YAML path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlab.cli import EXIT_INVALID, EXIT_PASS, main
from faultlab.errors import InvalidExperimentError
from faultlab.faults import fault_types
from faultlab.spec import (
    PlannedSuite,
    load_document,
    load_experiment,
    load_experiments,
    parse_document,
)
from faultlab.spec.target import launcher_offers

REPO = Path(__file__).resolve().parents[2]
PRELAUNCH = REPO / "experiments" / "prelaunch.yaml"
MUST_PASS = ["rank_kill", "node_loss_elastic", "rank_hang", "ckpt_bitflip", "ckpt_torn_write",
             "nan_gradients", "collective_delay_straggler", "collective_partition",
             "spot_preemption_aws", "gpu_lost_sticky", "disk_full_during_save"]

EXPERIMENT = """\
name: {name}
faults:
  - type: rank_kill
    target: {{rank: 1}}
    trigger: {{at_step: 15}}
expect: {{completes: true}}
"""

SUITE = """\
suite:
  name: pre
  experiments:
    - a.yaml
    - b.yaml
  plan:
    num_gpus: 64
    gpus_per_node: 8
    mtbf_per_node_h: 5000
    step_time_s: 2.5
    checkpoint_size_gb: 100
    storage_bandwidth_gb_s: 10
"""


def problems(path: Path) -> list[tuple[Path | None, int | None, str, str]]:
    with pytest.raises(InvalidExperimentError) as info:
        load_experiments([path])
    return [(p.file, p.line, p.path, p.message) for p in info.value.problems]


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(EXPERIMENT.format(name=name))
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_shipped_prelaunch_suite_lists_every_experiment_that_must_pass() -> None:
    # every fault family that has landed is covered, and each member also runs in CI
    shipped = (REPO / "Makefile").read_text().split("SHIPPED :=")[1].split("\n\n")[0]
    # rank_hang and campaign_reference run (and must pass) as test_prelaunch_run.py's suite
    suite_run = (REPO / "tests" / "report" / "test_prelaunch_run.py").read_text()
    assert 'RANK_HANG = REPO / "experiments" / "rank_hang.yaml"' in suite_run
    assert 'CAMPAIGN = REPO / "experiments" / "campaign_reference.yaml"' in suite_run
    assert "experiments: [{RANK_HANG}, {CAMPAIGN}]" in suite_run
    assert "assert rc == 0" in suite_run and 'report["verdict"] == "pass"' in suite_run
    # rank_kill runs (and must pass, twice) as test_faultlab_run.py's --repeat 2 instead, its
    # text with one line added (the file channel)
    repeat = (REPO / "tests" / "integration" / "test_faultlab_run.py").read_text()
    assert 'text = (EXPERIMENTS / "rank_kill.yaml").read_text()' in repeat
    assert 'cli("run", exp, "--repeat", "2",' in repeat
    assert 'record["summary"]["verdicts"] == ["pass", "pass"]' in repeat
    # node_loss_elastic, ckpt_torn_write and ckpt_bitflip run (and must pass) in
    # test_trainer_recovery.py instead
    recovery = (REPO / "tests" / "integration" / "test_trainer_recovery.py").read_text()
    # collective_delay_straggler runs (and must pass) in test_detection.py instead, its text
    # with detection SLAs and declared signals appended
    detection = (REPO / "tests" / "integration" / "test_detection.py").read_text()
    assert 'SHIPPED = REPO / "experiments" / "collective_delay_straggler.yaml"' in detection
    assert 'exp.write_text(text.rstrip() + "\\n" + ADDED)' in detection
    assert 'assert journal["verdict"] == "pass", table' in detection
    elsewhere = {"rank_hang", "rank_kill", "node_loss_elastic", "ckpt_torn_write",
                 "ckpt_bitflip", "collective_delay_straggler"}
    for name in ("node_loss_elastic", "ckpt_torn_write", "ckpt_bitflip"):
        assert f'_shipped("{name}.yaml", golden_cache, tmp_path)' in recovery
    assert 'assert result.verdict == "pass"' in recovery
    assert all(f"experiments/{name}.yaml" in shipped or name in elsewhere for name in MUST_PASS)
    families = {spec.fault_class.family for _, exp in load_experiments([PRELAUNCH])
                for spec in exp.faults}
    # faultlab's own faults: a team's package in the venv (make installs examples/plugin) adds
    # families that no shipped suite of faultlab's covers
    builtin = [f for f in fault_types().values() if f.__module__.startswith("faultlab.")]
    local = {f.family for f in builtin if set(f.needs) <= launcher_offers("local")}
    assert families == local
    # The network family needs nodes with a network of their own (containers), the scheduler
    # family a Slurm job; the suite runs on local nodes, so their experiments run in CI instead
    # (the docker ones as shipped items, the slurm_*.yaml ones in tests/slurm).
    assert {f.family for f in builtin} - local == {"network", "scheduler"}
    assert all(f"experiments/{name}.yaml" in shipped
               for name in ("docker_node_loss", "network_partition", "network_throttle"))
    slurm = (REPO / "tests" / "slurm" / "test_slurm_experiments.py").read_text()
    assert 'glob("slurm_*.yaml")' in slurm and {"slurm_node_down", "slurm_preemption"} <= {
        p.stem for p in (REPO / "experiments").glob("slurm_*.yaml")}
    # slurm_preemption runs once, on the NFS cluster, with the same assertions
    assert "slurm_preemption.yaml" in (REPO / "tests" / "slurm" / "test_slurm_nfs.py").read_text()
    doc = load_document(PRELAUNCH)
    assert isinstance(doc, PlannedSuite) and doc.name == "prelaunch"
    assert [Path(p).stem for p in doc.suite.experiments] == MUST_PASS
    assert [exp.name for _, exp in load_experiments([PRELAUNCH])] == MUST_PASS
    plan = doc.suite.plan
    assert plan.num_gpus > 0 and (plan.mtbf_per_gpu_h or plan.mtbf_per_node_h)
    # one line per experiment: the list is a plain YAML sequence, one item per line
    text = PRELAUNCH.read_text()
    assert all(sum(f"- {p}" in line for line in text.splitlines()) == 1
               for p in doc.suite.experiments)


def test_a_suite_expands_in_order_relative_to_its_file(suite_dir: Path) -> None:
    suite = write(suite_dir / "s.yaml", SUITE)
    loaded = load_experiments([suite])
    assert [(p, e.name) for p, e in loaded] == [(suite_dir / "a.yaml", "a"),
                                               (suite_dir / "b.yaml", "b")]
    doc = load_document(suite)
    assert isinstance(doc, PlannedSuite)
    assert doc.suite.plan.num_nodes == 8 and doc.suite.plan.mtbf_per_gpu_h is None


def test_a_missing_experiment_is_located_at_its_line(suite_dir: Path) -> None:
    suite = write(suite_dir / "s.yaml", SUITE.replace("- b.yaml", "- nope/missing.yaml"))
    [(file, line, path, message)] = problems(suite)
    assert (file, line, path) == (suite, 5, "suite.experiments[1]")
    assert message.startswith("cannot read 'nope/missing.yaml' (looked for ")
    assert message.endswith("paths in a suite are relative to the suite file")


def test_an_invalid_member_is_located_at_its_entry_and_in_its_own_file(suite_dir: Path
                                                                        ) -> None:
    write(suite_dir / "b.yaml", EXPERIMENT.format(name="b").replace("at_step: 15",
                                                                     "at_step: ten"))
    suite = write(suite_dir / "s.yaml", SUITE)
    assert problems(suite) == [
        (suite, 5, "suite.experiments[1]", "'b.yaml' is invalid: 1 problem(s) in that file, "
         "listed next; fix them, or remove this entry to leave it out of the suite"),
        (suite_dir / "b.yaml", 5, "faults[0].trigger.at_step", "expected an integer, got 'ten'")]


# --- a campaign as a member of the suite ------------------------------------------------------

CAMPAIGN = """\
name: camp
seed: 3
topology: {nodes: 2, procs_per_node: 1}
run: {steps: 40, checkpoint_every: 10, timeout_s: 120}
campaign:
  mtbf_s: 5
  duration_s: 30
  start_after_s: 10
  mix:
    - {type: rank_kill, weight: 1}
expect: {completes: true, ettr: 0.2, detection_rate: 0.5}
"""


@pytest.fixture
def campaign_suite(suite_dir: Path) -> Path:
    write(suite_dir / "camp.yaml", CAMPAIGN)
    return write(suite_dir / "s.yaml", SUITE.replace("- b.yaml", "- camp.yaml"))


def test_a_campaign_member_validates_and_compiles_like_an_experiment(
        campaign_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [(_, a), (path, camp)] = load_experiments([campaign_suite])
    assert (a.name, path.name, camp.name) == ("a", "camp.yaml", "camp")
    assert camp.faults and all(f.type == "rank_kill" and f.trigger.at_time_s is not None
                               for f in camp.faults)  # the seeded schedule
    assert main(["validate", str(campaign_suite), "--golden-cache",
                 str(campaign_suite.parent / "golden")]) == EXIT_PASS
    out = " ".join(capsys.readouterr().out.split())
    assert f"ok {path} (campaign camp: {len(camp.faults)} arrival(s) from seed 3, 3 SLA(s); " \
        f"mtbf_s 5 s not checked against a step time yet: no golden run" in out
    assert "pre-launch suite pre: 2 experiment(s), 1 of them campaign(s); plan 64 GPUs" in out


def test_an_invalid_campaign_member_is_located_at_its_entry_and_in_its_own_file(
        campaign_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    camp = write(campaign_suite.parent / "camp.yaml",
                 CAMPAIGN.replace("rank_kill, weight: 1", "rank_kill, weight: 0"))
    assert problems(campaign_suite) == [
        (campaign_suite, 5, "suite.experiments[1]", "'camp.yaml' is invalid: 1 problem(s) in "
         "that file, listed next; fix them, or remove this entry to leave it out of the suite"),
        (camp, 10, "campaign.mix[0].weight", "a weight must be positive (the entry's share of "
         "the arrivals), got 0.0; remove the entry to leave this fault out")]
    for command in ("validate", "run"):
        assert main([command, str(campaign_suite)]) == EXIT_INVALID
        err = capsys.readouterr().err
        assert f"{campaign_suite}:5 suite.experiments[1]: 'camp.yaml' is invalid" in err
        assert f"{camp}:10 campaign.mix[0].weight: a weight must be positive" in err


def test_a_dry_run_of_the_suite_shows_the_campaign_its_arrivals_and_its_slas(
        campaign_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [_, (path, camp)] = load_experiments([campaign_suite])
    assert main(["run", "--dry-run", str(campaign_suite)]) == EXIT_PASS
    out = capsys.readouterr().out
    assert (f"camp ({path}): campaign, 2 node(s) x 1, 40 steps, timeout 120 s, seed 3, "
            f"{len(camp.faults)} arrival(s) scheduled") in out
    assert all(f"{f.id}: rank_kill" in out for f in camp.faults)
    assert "expect ettr: 0.2" in out and "expect detection_rate: 0.5" in out


def test_a_campaign_is_refused_with_repeat_before_anything_runs(
        campaign_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = campaign_suite.parent / "r"
    assert main(["run", str(campaign_suite), "--repeat", "3", "--report-dir",
                 str(reports)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"{campaign_suite.parent / 'camp.yaml'} campaign: a campaign cannot run with " \
           f"--repeat N" in err
    assert not reports.exists()


@pytest.mark.parametrize(("old", "new", "line", "path", "message"), [
    ("num_gpus: 64", "num_gpus: 0", 7, "suite.plan.num_gpus", "must be >= 1, got 0"),
    ("step_time_s: 2.5", "step_time_s: fast", 10, "suite.plan.step_time_s",
     "expected a number, got 'fast'"),
    ("mtbf_per_node_h: 5000", "mtbf_per_node_h: 5000\n    mtbf_per_gpu_h: 40000", 9,
     "suite.plan.mtbf_per_node_h",
     "give the failure rate once: either mtbf_per_gpu_h or mtbf_per_node_h, not both"),
    ("    mtbf_per_node_h: 5000\n", "", 6, "suite.plan",
     "the plan needs a failure rate: set mtbf_per_gpu_h (hours between failures of one GPU) "
     "or mtbf_per_node_h (of one node)"),
    ("    - b.yaml\n", "    - a.yaml\n", 5, "suite.experiments[1]",
     "'a.yaml' is listed twice (also experiments[0]); each experiment runs once per suite, "
     "so remove one"),
    ("name: pre", "name: Pre Launch", 2, "suite.name",
     "'Pre Launch' is not a valid suite name: use only lowercase letters, digits, '_' and "
     "'-' (e.g. 'pre_launch')"),
    ("  experiments:\n    - a.yaml\n    - b.yaml\n", "  experiments: []\n", 3,
     "suite.experiments", "must not be empty"),
])
def test_bad_suite_values_are_located(suite_dir: Path, old: str, new: str, line: int,
                                      path: str, message: str) -> None:
    assert old in SUITE
    suite = write(suite_dir / "s.yaml", SUITE.replace(old, new))
    assert problems(suite) == [(suite, line, path, message)]


def test_a_misspelt_plan_key_is_named_with_the_fix(suite_dir: Path) -> None:
    suite = write(suite_dir / "s.yaml", SUITE.replace("storage_bandwidth_gb_s: 10",
                                                      "storage_bandwith_gb_s: 10"))
    assert [(line, path, msg) for _f, line, path, msg in problems(suite)] == [
        (6, "suite.plan.storage_bandwidth_gb_s", "required key is missing"),
        (12, "suite.plan.storage_bandwith_gb_s",
         "unknown key 'storage_bandwith_gb_s'; did you mean 'storage_bandwidth_gb_s'?")]


def test_a_suite_missing_its_plan_or_with_extra_keys(suite_dir: Path) -> None:
    text = SUITE.split("  plan:")[0] + "faults: []\n"
    suite = write(suite_dir / "s.yaml", text)
    assert [(line, path, msg) for _f, line, path, msg in problems(suite)] == [
        (1, "suite.plan", "required key is missing"),
        (6, "faults", "unknown key 'faults'; valid keys: suite")]


def test_a_planned_suite_is_not_one_experiment(suite_dir: Path) -> None:
    suite = write(suite_dir / "s.yaml", SUITE)
    with pytest.raises(InvalidExperimentError) as info:
        load_experiment(suite)
    assert [(p.line, p.path) for p in info.value.problems] == [(1, "suite")]
    assert isinstance(parse_document(SUITE), PlannedSuite)


def test_validate_accepts_the_suite_and_names_its_plan(
        suite_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(PRELAUNCH)]) == EXIT_PASS
    out = capsys.readouterr().out
    assert all(f"{name}.yaml" in out for name in MUST_PASS)
    assert (f"pre-launch suite prelaunch: {len(MUST_PASS)} experiment(s); plan 1024 GPUs in 128 "
            f"node(s)") in out


def test_validate_and_run_reject_a_bad_suite_before_anything_runs(
        suite_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = write(suite_dir / "s.yaml", SUITE.replace("num_gpus: 64", "num_gpus: -1"))
    for command in ("validate", "run"):
        assert main([command, str(suite), "--report-dir", str(suite_dir / "r")]
                    if command == "run" else [command, str(suite)]) == EXIT_INVALID
        err = capsys.readouterr().err
        assert f"{suite}:7 suite.plan.num_gpus: must be >= 1, got -1" in err
    assert not (suite_dir / "r").exists()


def test_a_suite_runs_alone(suite_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = write(suite_dir / "s.yaml", SUITE)
    assert main(["run", str(suite), str(suite_dir / "a.yaml"), "--report-dir",
                 str(suite_dir / "r")]) == EXIT_INVALID
    assert "a pre-launch suite writes one report folder of its own" in capsys.readouterr().err
    assert not (suite_dir / "r").exists()

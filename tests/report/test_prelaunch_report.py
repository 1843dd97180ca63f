"""The pre-launch report built from synthetic suite folders: JSON, Markdown, HTML, re-render,
and the environment without a GPU."""

from __future__ import annotations

import json
import re
import sys
import types
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from synthetic import PLAN, write_campaign_run, write_run, write_suite

from faultlab.cli import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_PASS, main
from faultlab.faults import fault_types
from faultlab.observe.phases import PHASES
from faultlab.report import environment as env_module
from faultlab.report.html import render_html
from faultlab.report.markdown import render_suite_markdown
from faultlab.report.prelaunch import REPORT_FILES, SuiteRun, build_report
from faultlab.report.projection import project

MEMBERS = [("rank_kill", "rank_kill", True), ("ckpt_bitflip", "ckpt_bitflip", True),
           ("rank_hang", "rank_hang", False)]


@pytest.fixture(scope="module")
def suite_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("suite") / "prelaunch-20261121-120000"
    write_suite(folder, MEMBERS, not_run=("node_loss_elastic",))
    return folder


@pytest.fixture(scope="module")
def report(suite_folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((suite_folder / "report.json").read_text(),
                                      parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    return data


def test_the_folder_holds_the_three_renderings(suite_folder: Path) -> None:
    assert all((suite_folder / name).stat().st_size > 1000 for name in REPORT_FILES)
    assert (suite_folder / "suite.json").is_file()
    assert sorted(p.name.split("-")[0] for p in (suite_folder / "runs").iterdir()) == [
        "ckpt_bitflip", "rank_hang", "rank_kill"]


def test_scorecard_per_family_and_experiment(report: dict[str, Any]) -> None:
    assert report["kind"] == "faultlab_prelaunch_report" and report["verdict"] == "fail"
    rows = {r["experiment"]: r for r in report["scorecard"]}
    assert {n: r["verdict"] for n, r in rows.items()} == {
        "rank_kill": "pass", "ckpt_bitflip": "pass", "rank_hang": "fail",
        "node_loss_elastic": "not run"}
    assert rows["ckpt_bitflip"]["family"] == "storage"
    assert rows["node_loss_elastic"]["family"] == "process"  # known before it ran
    recovery = next(s for s in rows["rank_hang"]["slas"] if s["name"] == "recovery_time_s")
    assert recovery["bound"] == 1.0 and recovery["passed"] is False
    families = {f["family"]: f for f in report["families"]}
    assert families["storage"]["verdict"] == "pass"
    assert families["process"]["verdict"] == "fail"
    assert families["process"]["experiments"] == ["rank_kill", "rank_hang", "node_loss_elastic"]
    for family in set(cls.family for cls in fault_types().values()) - {"process", "storage"}:
        assert families[family]["verdict"] == "not covered"  # registered, in no experiment


def test_an_inconclusive_member_makes_its_family_and_the_suite_inconclusive(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing failed, but one experiment's bitwise check could not be measured: neither its
    family nor the suite passes (issue 53), in report.json, Markdown, HTML and the exit code."""
    folder = tmp_path / "prelaunch-20261201-120000"
    write_suite(folder, [("rank_kill", "rank_kill", True),
                         ("ckpt_bitflip", "ckpt_bitflip", "inconclusive")])
    report = json.loads((folder / "report.json").read_text())
    assert report["verdict"] == "inconclusive"
    families = {f["family"]: f["verdict"] for f in report["families"]}
    assert (families["process"], families["storage"]) == ("pass", "inconclusive")
    md = (folder / "report.md").read_text()
    assert md.startswith("# Pre-launch report: prelaunch: INCONCLUSIVE")
    assert "- 1 of 2 experiments passed, 1 inconclusive" in md
    assert "| storage | INCONCLUSIVE | ckpt_bitflip |" in md
    assert "bitwise_equal_to_golden not measured (= yes) ?" in md
    assert "| bitwise_equal_to_golden | = yes | not measured (not measured: two fault-free " \
           "runs differ from step 2) | **INCONCLUSIVE** |" in md
    html = (folder / "report.html").read_text()
    assert '<span class="badge inconclusive">INCONCLUSIVE</span>' in html
    assert '<li class="inconclusive">bitwise_equal_to_golden' in html
    assert '<td class="inconclusive">INCONCLUSIVE</td>' in html
    assert "1 inconclusive (a correctness SLA not measured)" in html
    assert main(["report", str(folder)]) == EXIT_INCONCLUSIVE
    assert "(verdict: inconclusive)" in capsys.readouterr().out


def test_each_experiment_has_its_timeline_loss_and_checkpoints(report: dict[str, Any]) -> None:
    exp = next(e for e in report["experiments"] if e["name"] == "rank_kill")
    kinds = [m["kind"] for m in exp["timeline"]["markers"]]
    for kind in ("injected", "detected", "resumed", "recovered", "restart",
                 "checkpoint_saved", "checkpoint_loaded"):
        assert kind in kinds, kind
    assert kinds.index("injected") < kinds.index("detected") < kinds.index("restart") \
        < kinds.index("resumed") < kinds.index("recovered")
    assert len(exp["timeline"]["series"]) == 2  # before and after the restart
    assert [p[1] for p in exp["timeline"]["series"][1]["points"]][:2] == [11, 12]
    assert exp["timeline"]["golden"][-1][1] == 40
    assert len(exp["loss"]["golden"]) == 40
    assert exp["loss"]["series"][0]["points"][0][0] == 1
    ckpt = exp["checkpoints"]
    assert ckpt["num_saves"] == 4  # step 10 before the kill; 20, 30 and 40 after it
    assert ckpt["on_disk_bytes"] == {f"step_{s:08d}": 17_000_000 for s in (20, 30, 40)}
    assert ckpt["stall_s"]["median"] == pytest.approx(0.25)
    no_golden = next(e for e in report["experiments"] if e["name"] == "ckpt_bitflip")
    assert no_golden["loss"]["golden"] is None and no_golden["timeline"]["golden"] is None
    not_run = next(e for e in report["experiments"] if e["name"] == "node_loss_elastic")
    assert not_run["timeline"] is None and "not run" in not_run["error"]


def test_recovery_rows_add_up(report: dict[str, Any]) -> None:
    assert report["recovery"]["phases"] == list(PHASES)
    rows = report["recovery"]["rows"]
    assert [r["experiment"] for r in rows] == ["rank_kill", "ckpt_bitflip", "rank_hang"]
    for r in rows:
        assert sum(r["phases"].values()) == pytest.approx(r["recovery_time_s"])
        assert r["restart_overhead_s"] == pytest.approx(r["recovery_time_s"]
                                                        - r["phases"]["replay"])


def test_the_projection_uses_the_measured_values(report: dict[str, Any]) -> None:
    inputs, results = report["projection"]["inputs"], dict(report["projection"]["results"])
    assert inputs["measured_checkpoint_stall_s"] == pytest.approx(0.25)
    assert inputs["measured_checkpoint_size_gb"] == pytest.approx(0.017)
    worst = max(r["restart_overhead_s"] for r in report["recovery"]["rows"])
    assert inputs["measured_restart_overhead_s"] == pytest.approx(worst)
    expected = project(PLAN, measured_stall_s=0.25, measured_size_gb=0.017,
                       restart_overhead_s=worst).to_dict()
    assert results.pop("notes") == expected.pop("notes") == []
    assert results == pytest.approx(expected)
    assert {k: inputs[k] for k in PLAN} == PLAN
    assert any("Young" in f["quantity"] for f in report["projection"]["formulas"])


def test_markdown_has_the_scorecard(suite_folder: Path) -> None:
    md = (suite_folder / "report.md").read_text()
    assert md.startswith("# Pre-launch report: prelaunch: FAIL")
    scorecard = md.split("## Scorecard")[1].split("\n## ")[0]
    assert re.search(r"^\| storage \| ckpt_bitflip \| PASS \| .*recovery_time_s \d+\.\d\d s "
                     r"\(≤ 40\.00 s\) ✓", scorecard, re.M)
    assert re.search(r"^\| process \| rank_hang \| FAIL \| .*recovery_time_s .* ✗", scorecard,
                     re.M)
    assert "| process | node_loss_elastic | NOT RUN |" in scorecard
    for heading in ("## Projection to the planned run", "## Recovery time, phase by phase",
                    "## Checkpoint cost", "## rank_kill: PASS", "## Environment"):
        assert heading in md


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: list[str] = []
        self.attrs: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            self.attrs.append((name, value or ""))
            if name == "id":
                self.ids.append(value or "")


def test_html_is_self_contained(suite_folder: Path) -> None:
    html = (suite_folder / "report.html").read_text()
    page = _Collector()
    page.feed(html)
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(page.tags)
    # nothing loads from anywhere: URLs appear only as XML namespace names of the SVGs
    assert [(n, v) for n, v in page.attrs if re.match(r"https?:", v) and
            not n.startswith("xmlns")] == []
    assert [(n, v) for n, v in page.attrs if n in ("src", "srcset", "data", "poster")] == []
    assert [v for n, v in page.attrs if n in ("href", "xlink:href")
            if not v.startswith("#")] == []
    assert re.findall(r"url\((?!#)", html) == [] and "@import" not in html
    assert "@font-face" not in html
    assert len(page.ids) == len(set(page.ids)), "ids of the inline SVGs collide"
    assert page.tags.count("svg") == 1 + 3 * 2  # recovery; timeline and loss of each run


def test_html_and_markdown_render_from_report_json_alone(suite_folder: Path,
                                                         report: dict[str, Any]) -> None:
    assert render_html(report) == (suite_folder / "report.html").read_text()
    assert render_suite_markdown(report) == (suite_folder / "report.md").read_text()


def test_faultlab_report_rebuilds_a_suite_folder(suite_folder: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for name in REPORT_FILES:
        (suite_folder / name).unlink()
    assert main(["report", str(suite_folder)]) == EXIT_FAIL
    assert "verdict: fail" in capsys.readouterr().out
    assert all((suite_folder / name).is_file() for name in REPORT_FILES)

    passing = tmp_path / "passing"
    write_suite(passing, MEMBERS[:1])
    assert main(["report", str(passing)]) == EXIT_PASS
    assert build_report(passing)["verdict"] == "pass"


def test_a_corrupt_suite_record_is_an_error_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "suite.json").write_text('{"schema_version": 99}')
    assert main(["report", str(tmp_path)]) == EXIT_FAIL
    assert "cannot rebuild the suite report" in capsys.readouterr().err


# --- the environment --------------------------------------------------------------------------

class _NVMLError(Exception):
    pass


class _LibraryNotFound(_NVMLError):
    pass


def test_a_campaign_member_gets_its_section_and_stays_out_of_the_projection(
        tmp_path: Path) -> None:
    from synthetic import ENVIRONMENT

    folder = tmp_path / "prelaunch-20261121-120000"
    listed = [("rank_kill", ["rank_kill"]), ("camp", ["rank_kill"]),
              ("refused", ["rank_kill"])]
    run = SuiteRun(folder, suite_file=Path("experiments/prelaunch.yaml"),
                   suite={"name": "prelaunch", "description": None,
                          "experiments": [f"{n}.yaml" for n, _ in listed], "plan": PLAN},
                   experiments=[(Path(f"experiments/{n}.yaml"), n, t) for n, t in listed],
                   environment=ENVIRONMENT,
                   campaigns=[Path("experiments/camp.yaml"), Path("experiments/refused.yaml")])
    write_run(run.runs_dir / "rank_kill-1", "rank_kill")
    run.ran(0, run.runs_dir / "rank_kill-1", "pass")
    journal = write_campaign_run(run.runs_dir / "camp-1", "camp")
    run.ran(1, run.runs_dir / "camp-1", "pass")
    run.ran(2, None, "fail", "refused.yaml:6 campaign.mtbf_s: 0.2 s between faults is not "
                             "longer than one training step")
    report = run.finish()
    assert report["verdict"] == "fail"  # the refused campaign counts like a failed experiment
    rows = {r["experiment"]: r for r in report["scorecard"]}
    assert (rows["camp"]["kind"], rows["camp"]["family"], rows["camp"]["verdict"]) == (
        "campaign", "campaign", "pass")
    assert rows["camp"]["report_html"] == "runs/camp-1/report.html"
    assert (folder / rows["camp"]["report_html"]).is_file()
    assert rows["rank_kill"]["report_html"] is None and rows["rank_kill"]["kind"] == "experiment"
    assert rows["refused"]["error"].startswith("refused.yaml:6 campaign.mtbf_s:")
    assert (rows["refused"]["kind"], rows["refused"]["verdict"]) == ("campaign", "fail")
    [camp] = [e for e in report["experiments"] if e["name"] == "camp"]
    assert camp["campaign"] == journal["campaign"]  # the journal's object, whole
    # the campaign's injection is not an isolated recovery: the projection's inputs are
    # rank_kill's alone, and the process family is judged by rank_kill alone
    assert [r["experiment"] for r in report["recovery"]["rows"]] == ["rank_kill"]
    assert [c["experiment"] for c in report["checkpoint_cost"]["per_experiment"]] == [
        "rank_kill"]
    process = next(f for f in report["families"] if f["family"] == "process")
    assert process["experiments"] == ["rank_kill"] and process["verdict"] == "pass"

    score = journal["campaign"]["score"]
    assert score["injected"] == 1 and score["scheduled"] == 2
    md = (folder / "report.md").read_text()
    section = md.split("## camp: PASS")[1].split("\n## ")[0]
    assert "### Campaign" in section and "#### Per fault type" in section
    assert f"| ETTR measured | {score['ettr']:.3f} |" in section
    assert "| gap (projected − measured) |" in section
    assert "| rank_kill | 1 | 1/1 (100%) |" in section
    assert "camp ([report.html](runs/camp-1/report.html))" in md
    page = (folder / "report.html").read_text()
    exp_section = page.split('id="exp-camp"')[1].split("</section>")[0]
    assert '<a href="runs/camp-1/report.html">' in page
    assert "<svg" in exp_section and "c000-rank_kill A" in exp_section  # marked, attributed
    assert f"<th>ETTR measured</th><td>{score['ettr']:.3f}</td>" in exp_section
    assert "per hour" in exp_section and "<h4>Per fault type</h4>" in exp_section
    # the campaign's own page and the suite's section render the same pieces
    own = (folder / "runs/camp-1/report.html").read_text()
    assert f"<th>ETTR measured</th><td>{score['ettr']:.3f}</td>" in own
    assert "<h2>Per fault type</h2>" in own
    # and the folder re-renders from its records
    assert main(["report", str(folder)]) == EXIT_FAIL
    assert (folder / "report.md").read_text().split("## Scorecard")[1] == \
        md.split("## Scorecard")[1]


def _fake_pynvml(init_error: type[Exception] | None) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError  # type: ignore[attr-defined]

    def init() -> None:
        if init_error is not None:
            raise init_error("NVML Shared Library Not Found")

    memory = types.SimpleNamespace(total=80 * 2**30)
    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: memory  # type: ignore[attr-defined]
    return m


def test_the_environment_without_a_gpu_says_not_available() -> None:
    env = env_module.suite_environment()  # the real pynvml, on a host without a GPU
    assert env["torch"] and env["host"] and "python" in env
    assert env["driver"].startswith("not available") and env["gpus"] == []
    assert env["nccl"].startswith("not available")


def test_nvml_failures_degrade_and_a_gpu_is_described(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(_LibraryNotFound))
    assert env_module.gpu_environment()["driver"] == \
        "not available (NVML: NVML Shared Library Not Found)"
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(None))
    gpu = env_module.gpu_environment()
    assert gpu["driver"] == "550.54.15" and gpu["cuda_driver"] == "12.4"
    assert gpu["gpus"] == [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_gib": 80.0}
                           for i in range(2)]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert "nvidia-ml-py is not installed" in env_module.gpu_environment()["driver"]


def test_a_members_detection_block_is_in_both_renderings(tmp_path: Path) -> None:
    section = {"onset": {"fault_id": "slow-1", "t": 1.0, "step": 10, "ranks": [1],
                         "nodes": ["node1"], "ground_truth": "slow-1 (gpu_slow) on rank 1 "
                         "from step 10"},
               "signals": [{"name": "slow_line", "detected": False, "t": None, "step": None,
                            "within_s": None, "within_steps": None, "ranks": None,
                            "nodes": None, "attribution": None, "false_alarms": 0,
                            "evidence": None}]}
    run = write_suite(tmp_path / "prelaunch-20261121-120000", [("rank_kill", "rank_kill", True)])
    (journal_path,) = run.runs_dir.glob("*/journal.json")
    journal = json.loads(journal_path.read_text())
    journal["detection"] = section
    journal_path.write_text(json.dumps(journal))
    data = build_report(run.folder)
    text, html = render_suite_markdown(data), render_html(data)
    assert "### Detection" in text
    assert "not detected by slow_line: slow-1 (gpu_slow) on rank 1 from step 10" in text
    assert "<h4>Detection</h4>" in html and "NOT DETECTED" in html

"""Loading from files: suites in order, relative paths, cycles, unreadable files, --seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlab.errors import InvalidExperimentError
from faultlab.spec import Experiment, Suite, load_document, load_experiment, load_experiments


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def experiment(name: str, seed: int = 0) -> str:
    return f"name: {name}\nseed: {seed}\n"


def where(info: pytest.ExceptionInfo[InvalidExperimentError]) -> list[tuple[Path | None,
                                                                              int | None, str]]:
    return [(p.file, p.line, p.path) for p in info.value.problems]


def test_load_document_tells_experiments_from_suites(tmp_path: Path) -> None:
    exp = write(tmp_path / "a.yaml", experiment("a"))
    suite = write(tmp_path / "s.yaml", "name: s\nsuite: [a.yaml]\n")
    assert isinstance(load_document(exp), Experiment)
    loaded = load_document(str(suite))
    assert isinstance(loaded, Suite) and loaded.suite == ("a.yaml",)
    with pytest.raises(InvalidExperimentError) as info:
        load_experiment(suite)
    assert where(info) == [(suite, 2, "suite")]


def test_suites_expand_in_order_relative_to_the_suite_file(tmp_path: Path) -> None:
    write(tmp_path / "exps/a.yaml", experiment("a"))
    write(tmp_path / "exps/deep/b.yaml", experiment("b"))
    write(tmp_path / "c.yaml", experiment("c"))
    write(tmp_path / "exps/deep/inner.yaml", "name: inner\nsuite: [b.yaml, ../a.yaml]\n")
    suite = write(tmp_path / "exps/suite.yaml", """\
# The pre-launch suite.
name: prelaunch
description: run in this order
suite:
  - a.yaml
  - deep/inner.yaml
  - ../c.yaml
  - a.yaml
""")
    loaded = load_experiments([suite, tmp_path / "c.yaml"])
    assert [exp.name for _, exp in loaded] == ["a", "b", "a", "c", "a", "c"]
    assert loaded[1][0] == tmp_path / "exps/deep/b.yaml"
    assert loaded[2][0] == tmp_path / "exps/deep/../a.yaml"


def test_a_suite_cycle_is_an_error_located_where_it_closes(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "name: a\nsuite:\n  - ok.yaml\n  - b.yaml\n")
    write(tmp_path / "b.yaml", "name: b\nsuite: [./a.yaml]\n")
    write(tmp_path / "ok.yaml", experiment("ok"))
    self_ref = write(tmp_path / "self.yaml", "name: self\nsuite: [self.yaml]\n")
    with pytest.raises(InvalidExperimentError) as info:
        load_experiments([tmp_path / "a.yaml", self_ref])
    assert where(info) == [(tmp_path / "b.yaml", 2, "suite[0]"),
                           (self_ref, 2, "suite[0]")]
    first = info.value.problems[0].message
    assert first.startswith("suite cycle: ") and first.count(" -> ") == 2
    assert first.endswith("a suite cannot include itself, directly or through another suite")


def test_problems_in_member_files_are_located_in_those_files(tmp_path: Path) -> None:
    good = write(tmp_path / "good.yaml", experiment("good"))
    bad = write(tmp_path / "sub/bad.yaml", "name: bad\nrun:\n  steps: ten\n")
    worse = write(tmp_path / "worse.yaml", "name: worse\nseed: x\n")
    suite = write(tmp_path / "s.yaml",
                  "name: s\nsuite:\n  - good.yaml\n  - sub/bad.yaml\n  - missing.yaml\n")
    with pytest.raises(InvalidExperimentError) as info:
        load_experiments([suite, worse, good])
    # the suite's entry first (which member is invalid, and where the suite lists it), then
    # the member's own problem, located in the member
    assert where(info) == [(suite, 4, "suite[1]"), (bad, 3, "run.steps"), (suite, 5, "suite[2]"),
                           (worse, 2, "seed")]
    assert str(info.value.problems[1]) == f"{bad}:3 run.steps: expected an integer, got 'ten'"
    missing = info.value.problems[2].message
    assert missing.startswith("cannot read 'missing.yaml' (looked for ")
    assert missing.endswith("No such file or directory; paths in a suite are relative to the "
                            "suite file")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidExperimentError) as info:
        load_document(tmp_path / "nope.yaml")
    (p,) = info.value.problems
    assert (p.file, p.line, p.path) == (tmp_path / "nope.yaml", None, "")
    assert p.message == "cannot read the file: No such file or directory"
    with pytest.raises(InvalidExperimentError, match="cannot read the file: Is a directory"):
        load_document(tmp_path)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: t\n\xff\xfe\n")
    with pytest.raises(InvalidExperimentError) as info:
        load_document(binary)
    (p,) = info.value.problems
    assert (p.line, p.message) == (2, "not UTF-8 text: byte b'\\xff' at offset 8 (invalid "
                                      "start byte)")


def test_seed_override_applies_to_every_experiment_of_a_suite(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", experiment("a", seed=1))
    write(tmp_path / "b.yaml", experiment("b", seed=2))
    suite = write(tmp_path / "s.yaml", "name: s\nsuite: [a.yaml, b.yaml]\n")
    assert [e.seed for _, e in load_experiments([suite])] == [1, 2]
    assert [e.seed for _, e in load_experiments([suite], seed=9)] == [9, 9]
    assert load_experiment(tmp_path / "a.yaml", seed=0).seed == 0
    with pytest.raises(InvalidExperimentError, match="must be an integer in"):
        load_experiments([suite], seed=2**63)

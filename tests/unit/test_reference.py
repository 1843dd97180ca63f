"""The generated reference cannot drift and leaves nothing out: every registered fault and SLA
is described, every YAML field is listed, and the editor schema (``faultlab schema``) accepts
every shipped experiment and refuses what ``faultlab validate`` would refuse for its shape."""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml

from faultlab import reference
from faultlab.cli import main
from faultlab.faults import Fault, fault_types
from faultlab.judge.slas import CAMPAIGN_SLAS, SLAS
from faultlab.sla import Sla
from faultlab.spec.schema import document_schema

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*REPO.glob("experiments/*.yaml"), *REPO.glob("examples/*/experiments/*.yaml")])


@pytest.mark.parametrize("name", list(fault_types()))
def test_every_fault_is_described(name: str) -> None:
    cls = fault_types()[name]
    assert cls.summary(), f"{name}: no docstring (the reference's first line)"
    assert cls.family
    undescribed = [f for f, info in cls.Params.model_fields.items() if not info.description]
    assert undescribed == [], f"{name}: params without a description"
    undo = inspect.getattr_static(cls, "undo")
    if cls.reversible:
        assert undo is not Fault.__dict__["undo"] and undo.__doc__, \
            f"{name} is reversible: its undo needs a docstring (what undoes it)"


def test_every_sla_is_described_and_its_metric_defined() -> None:
    definitions = reference.metric_definitions()
    for sla in [*SLAS.values(), *CAMPAIGN_SLAS.values()]:
        assert sla.description and sla.unit, sla.key
        if sla.metric is None and isinstance(sla, Sla):  # it measures the records itself
            assert type(sla).measure is not Sla.measure, f"{sla.key}: measures nothing"
            continue
        assert sla.metric in definitions, \
            f"{sla.key}: metric {sla.metric!r} has no definition in faultlab.observe"


def test_the_pages_list_every_fault_sla_field_and_command() -> None:
    faults, slas = reference.faults_page(), reference.slas_page()
    assert all(f"\n### {name}\n" in faults for name in fault_types())
    assert all(f"\n### {key}\n" in slas for key in [*SLAS, *CAMPAIGN_SLAS])
    yaml_page = reference.yaml_page()
    for model in reference.document_models():
        assert f"\n## {model.__name__}\n" in yaml_page
        if model.__name__ != "Selector":  # its YAML forms, not its fields
            assert all(f"| `{field}` |" in yaml_page for field in model.model_fields), model
    cli = reference.cli_page()
    for command in ("run", "init", "launch", "validate", "list", "schema", "report",
                    "campaign init", "metadata serve", "docker clean"):
        assert f"\n## faultlab {command}\n" in cli
    assert "`--bar`" in cli and "`--name` `NAME`" in cli  # init's own options, not campaign's


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = document_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_shipped_experiment_validates(validator: jsonschema.Draft202012Validator) -> None:
    assert len(SHIPPED) > 40
    failures = {str(p.relative_to(REPO)): jsonschema.exceptions.best_match(errors).message
                for p in SHIPPED if (errors := list(validator.iter_errors(
                    yaml.safe_load(p.read_text()))))}
    assert failures == {}


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d.update(topolgy=d.pop("topology")), "'topolgy' was unexpected"),
    (lambda d: d["faults"][0].update(type="rank_kil"), "'rank_kil' is not one of"),
    (lambda d: d["faults"][0].update(params={"signl": "KILL"}), "'signl' was unexpected"),
    (lambda d: d["faults"][0].update(params={"signal": "HUP"}), "'HUP' is not one of"),
    (lambda d: d["faults"][0].update(target={"rank": -1}), "less than the minimum of 0"),
    (lambda d: d["faults"][0].update(target="rank 1"), "'rank 1' is not valid"),
])
def test_the_schema_refuses_what_validate_refuses(validator: jsonschema.Draft202012Validator,
                                                 change, said: str) -> None:
    doc = copy.deepcopy(yaml.safe_load((REPO / "experiments/rank_kill.yaml").read_text()))
    change(doc)
    messages = list(_messages(validator.iter_errors(doc)))
    assert any(said in m for m in messages), messages


def _messages(errors) -> Iterator[str]:
    """Every message, those of the branches of an anyOf (``context``) included."""
    for error in errors:
        yield error.message
        yield from _messages(error.context or [])


def test_the_cli_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == document_schema()

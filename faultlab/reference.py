"""The reference pages of the documentation, rendered from the code so that they cannot drift.

Each function returns one Markdown page; ``docs/gen_reference.py`` writes them into the site at
build time (``make docs``), and ``tests/unit/test_reference.py`` checks that nothing registered
goes without a description:

- :func:`faults_page`: every registered fault type (the ``faultlab.faults`` entry points, a
  third party's included), its parameters with their types, defaults and bounds, the targets
  it takes, the context capabilities it needs (and the launchers that offer them), and what
  undoes it (its ``undo`` docstring);
- :func:`slas_page`: every SLA declared (``faultlab.sla``, a team's included), its unit and
  bound, and the metric's definition, read from the docstrings of ``faultlab.observe`` where
  each metric is defined once (when it is *not measured* is part of that definition);
- :func:`yaml_page`: every field of every document model (experiment, campaign, suite), from
  the pydantic models and their field docstrings;
- :func:`cli_page`: every command and option, from the argparse parsers.
"""

from __future__ import annotations

import argparse
import inspect
import re
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from faultlab.spec.schema import markdown as _md

__all__ = ["cli_page", "document_models", "faults_page", "metric_definitions", "slas_page",
           "yaml_page"]

GENERATED = ("<!-- Generated from the code by faultlab.reference at build time; edit the "
             "docstrings, not this page. -->\n\n")


# ----------------------------------------------------------------------------------- faults


def faults_page() -> str:
    from faultlab.faults import Fault, fault_types

    types_ = fault_types()
    out = [GENERATED, "# Faults\n\n",
           f"Every fault type faultlab knows: {len(types_)} registered under the "
           "`faultlab.faults` entry point (a plugin's faults appear here the same way). "
           "`faultlab list faults` prints the same from the command line. How to write one "
           "into an experiment: [Writing experiments](../guides/experiments.md).\n\n"]
    families: dict[str, list[str]] = {}
    for name, cls in types_.items():
        families.setdefault(cls.family, []).append(name)
    out.append("| family | faults |\n| --- | --- |\n")
    for family, names in sorted(families.items()):
        out.append(f"| {family} | {', '.join(f'[`{n}`](#{n})' for n in names)} |\n")
    for family, names in sorted(families.items()):
        out.append(f"\n## {family}\n")
        for name in names:
            out.append(_fault_section(name, types_[name], Fault))
    return "".join(out)


def _fault_section(name: str, cls: Any, base: Any) -> str:
    doc = _md(inspect.cleandoc(cls.__doc__ or ""))
    lines = [f"\n### {name}\n\n{doc}\n\n"]
    targets = ", ".join(_target_form(t) for t in cls.targets)
    if "rank" in cls.targets or "node" in cls.targets:
        targets += ", `random`"
    lines.append(f"- **targets:** {targets}\n")
    lines.append(_needs_line(cls))
    gate = "held at the step gate: lands after step N on every rank" if cls.step_gated \
        else "not held at a step gate (it waits for its own moment)"
    lines.append(f"- **`at_step` trigger:** {gate}\n")
    lines.append(f"- **undone:** {_undo_text(cls, base)}\n")
    if cls.capabilities():
        lines.append("- **capabilities** ([what faultlab does for each](../guides/extending.md"
                     "#capabilities))**:** "
                     f"{', '.join(f'`{c}`' for c in cls.capabilities())}\n")
    release = inspect.getattr_static(cls, "release")
    if release is not base.__dict__["release"] and release.__doc__:
        lines.append(f"- **when the experiment ends:** {_cell(release.__doc__)}\n")
    fields = cls.Params.model_fields
    if fields:
        lines.append("\n| param | type | default | what |\n| --- | --- | --- | --- |\n")
        for field, info in fields.items():
            lines.extend(_param_rows(field, info))
    else:
        lines.append("\nNo parameters.\n")
    return "".join(lines)


def _param_rows(field: str, info: Any) -> list[str]:
    """A parameter's row, then a row for each key of a model it nests (``episodes.on_s``)."""
    rows = [f"| `{field}` | {_type_cell(info)} | {_default_cell(info)} | "
            f"{_cell(info.description or '')}{_bounds(info)} |\n"]
    for model in _models_in(info.annotation):
        for sub, sub_info in model.model_fields.items():
            rows.extend(_param_rows(f"{field}.{sub}", sub_info))
    return rows


def _needs_line(cls: Any) -> str:
    """What the fault needs of its target (``needs``), and the registered launchers whose
    target offers all of it."""
    from faultlab.faults import CONTEXT_CAPABILITIES
    from faultlab.spec.target import launcher_names, launcher_offers

    hosts = [n for n in launcher_names()
             if not cls.needs or set(cls.needs) <= launcher_offers(n)]
    where = ", ".join(f"`{n}`" for n in hosts) or "no registered launcher"
    if not cls.needs:
        return f"- **needs:** nothing beyond the core: any launcher ({where})\n"
    needs = "; ".join(f"`{n}`, {_md(CONTEXT_CAPABILITIES[n].description)}" for n in cls.needs)
    return (f"- **needs** ([context capabilities](../guides/extending.md"
            f"#what-a-fault-needs-of-its-target))**:** {needs} (`topology.launcher`: "
            f"{where})\n")


def _undo_text(cls: Any, base: Any) -> str:
    undo = inspect.getattr_static(cls, "undo")
    own = undo is not base.__dict__["undo"] and undo.__doc__
    text = _cell(undo.__doc__) if own else ""
    if cls.reversible:
        return (f"reversible: give `duration_s`, `until: reaction` or both (whichever comes "
                f"first); the undo, also when the experiment ends early: {text}")
    if own:
        return f"not reversible; {text}"
    return "not reversible: what it did stays done, and the job must recover from it"


def _target_form(kind: str) -> str:
    return {"rank": "`{rank: N}`", "node": "`{node: N}`", "all": "`all`"}.get(kind, kind)


# ------------------------------------------------------------------------------------- SLAs


_METRIC_MODULES = ("faultlab.observe.metrics", "faultlab.observe.timeline",
                   "faultlab.observe.save_failures", "faultlab.observe.exclusion",
                   "faultlab.observe.healing", "faultlab.observe.campaign")
"""Where the metrics are defined, each once, in its module docstring's definition list."""

_TERM = re.compile(r"^([a-z_][a-z0-9_]*(?:,\s*[a-z_][a-z0-9_]*)*,?)(?:\s+\((.*)\))?\s*$")


def metric_definitions() -> dict[str, str]:
    """Metric name → its definition, from the definition lists (a term line, then lines
    indented by four) of the ``faultlab.observe`` module docstrings. A term may name several
    metrics (``came_back_t, resumed_from_step``) or continue on the next line."""
    import importlib

    out: dict[str, str] = {}
    for module in _METRIC_MODULES:
        doc = inspect.cleandoc(importlib.import_module(module).__doc__ or "")
        for names, body in _definition_list(doc):
            for name in names:
                out.setdefault(name, body)
    return out


def _definition_list(doc: str) -> Iterator[tuple[list[str], str]]:
    lines = doc.splitlines()
    terms: list[str] = []
    body: list[str] = []
    for line in [*lines, ""]:
        if line.startswith("    ") and terms:
            body.append(line.strip())
            continue
        if terms and body:
            yield terms, " ".join(body)
            terms, body = [], []
        m = _TERM.match(line)
        if m and line and not line.startswith(" "):
            words = [w.strip() for w in m[1].split(",") if w.strip()]
            terms = (terms + words) if terms and not body else words
        else:
            terms = []


def slas_page() -> str:
    from faultlab.judge.slas import CAMPAIGN_SLAS, SLAS
    from faultlab.observe.metrics import UNFINISHED_RUN

    defs = metric_definitions()
    bound = {"max": "upper bound: passes when measured ≤ the value you give",
             "min": "lower bound: passes when measured ≥ the value you give",
             "bool": "expected truth: passes when measured equals `true`/`false` as given"}
    out = [GENERATED, "# SLAs\n\n",
           "Every key an experiment may state under `expect`, with the metric it is judged "
           "against. A metric is *not measured* when the run left none of the evidence it "
           "needs; an SLA on a metric that was not measured fails, and its note says why "
           "(`not measured: ...`), never guessed. A *correctness* SLA not measured on a run "
           "that completed (no usable reference) makes the verdict `inconclusive` instead: "
           "never a pass, exit code 3; its note says what to add. A NaN never holds. The "
           "definitions below are the ones the code "
           "measures (the docstrings of `faultlab.observe`). `faultlab list slas` prints the "
           "short form. Each SLA is one declaration (`faultlab.sla`); those a team registers "
           "appear here beside the built-ins ([Adding an SLA](../guides/extending.md)). Every "
           "upper bound in seconds may also be written relative to the job's own fault-free "
           "timings (`resume_time_s: {cold_starts: 2.5}`), which each run measures again on its "
           "own target: such a bound holds on a slower machine as on a faster one; the verdict "
           "shows the seconds and the ratio.\n\n",
           "| key | unit | kind | what |\n| --- | --- | --- | --- |\n"]
    for key, sla in SLAS.items():
        out.append(f"| [`{key}`](#{key}) | {sla.unit} | {sla.kind} | {_cell(sla.description)} |\n")
    for title, table in (("Experiment SLAs", SLAS), ("Campaign SLAs", CAMPAIGN_SLAS)):
        out.append(f"\n## {title}\n")
        if table is CAMPAIGN_SLAS:
            out.append("\nA campaign's `expect` takes these besides the experiment SLAs above "
                       "([Campaigns](../guides/campaigns.md)).\n")
        for key, sla in table.items():
            out.append(f"\n### {key}\n\n{_md(sla.description)}.\n\n")
            out.append(f"- **unit:** {sla.unit}\n- **judged as:** {bound[sla.kind]}\n")
            if getattr(sla, "relative", False):
                out.append("- **relative:** also written in the job's own timings, "
                           "`{cold_starts: k}`, `{step_times: k}` or a sum with fixed `s` "
                           "([Time bounds that carry between machines]"
                           "(../concepts.md#time-bounds-that-carry-between-machines))\n")
            if sla.metric:
                out.append(f"- **metric:** `{sla.metric}`\n")
            else:  # a declaration that measures the run's records itself
                measure = type(sla).measure
                out.append(f"- **measured by:** `{measure.__module__}.{measure.__qualname__}`"
                           f"\n")
            definition = defs.get(sla.metric) if sla.metric else None
            if definition:
                out.append(f"- **measured:** {_cell(definition)}\n")
            if getattr(sla, "correctness", False):
                out.append("- **correctness:** not measured on a run that completed, the "
                           "verdict is `inconclusive` (exit code 3), not failed\n")
            if sla.metric in UNFINISHED_RUN:
                out.append(f"- **not measured when the run did not complete:** "
                           f"{_md(UNFINISHED_RUN[sla.metric])}\n")
    return "".join(out)


# ------------------------------------------------------------------------------------- YAML


def document_models() -> list[type[BaseModel]]:
    """Every model a YAML document is made of, the roots first, then in the order met."""
    from faultlab.faults import FaultParams
    from faultlab.spec import Campaign, Experiment, PlannedSuite, Suite

    seen: list[type[BaseModel]] = []

    def visit(model: type[BaseModel]) -> None:
        if model in seen or issubclass(model, FaultParams):
            return
        seen.append(model)
        for info in model.model_fields.values():
            for sub in _models_in(info.annotation):
                visit(sub)

    for root in (Experiment, Campaign, Suite, PlannedSuite):
        visit(root)
    return seen


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def yaml_page() -> str:
    models = document_models()
    out = [GENERATED, "# Experiment YAML\n\n",
           "Every field of the documents `faultlab run` and `faultlab validate` read: an "
           "experiment, a campaign (an experiment whose faults are drawn: `campaign:`) and a "
           "suite (`suite:`, a list of files or a planned pre-launch suite). Unknown keys are "
           "errors, values are not coerced (`\"10\"` is not a number), and every error names "
           "its file, line and YAML path. Editors can check these files as you type: "
           "[Editor schema](schema.md).\n\n",
           "| model | where |\n| --- | --- |\n"]
    for model in models:
        out.append(f"| [{model.__name__}](#{model.__name__.lower()}) | "
                   f"{_cell(_first_line(model.__doc__))} |\n")
    for model in models:
        out.append(f"\n## {model.__name__}\n\n{_md(inspect.cleandoc(model.__doc__ or ''))}\n\n")
        if model.__name__ == "Selector":
            out.append("In YAML: `{rank: N}`, `{node: N}`, `random` (a rank or node drawn from "
                       "the experiment's seed) or `all`.\n")
            continue
        out.append("| key | type | default | what |\n| --- | --- | --- | --- |\n")
        for field, info in model.model_fields.items():
            out.append(f"| `{field}` | {_type_cell(info)} | {_default_cell(info)} | "
                       f"{_cell(info.description or '')}{_bounds(info)} |\n")
    return "".join(out)


# -------------------------------------------------------------------------------------- CLI


def cli_page() -> str:
    import faultlab.cli
    from faultlab.cli import _parser
    from faultlab.engine.starter import init_parser
    from faultlab.targets.launcher import launch_parser

    main = _parser()
    exits = next(p for p in inspect.cleandoc(faultlab.cli.__doc__ or "").split("\n\n")
                 if p.startswith("Exit codes:"))
    out = [GENERATED, "# CLI\n\n", f"`faultlab`: {main.description}\n\n",
           f"{_cell(exits)}\n\n"]
    own = {"init": init_parser(), "launch": launch_parser()}
    for name, sub, help_ in _subcommands(main):
        parser = own.get(name, sub)  # init and launch parse their own options
        out.append(f"\n## faultlab {name}\n\n{_md(help_ or parser.description or '')}\n\n")
        out.append(f"```\n{parser.format_usage().strip()}\n```\n\n")
        rows = [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)
                and a.help != argparse.SUPPRESS and "-h" not in a.option_strings]
        if rows:
            out.append("| argument | what |\n| --- | --- |\n")
            for action in rows:
                out.append(f"| {_arg_name(action)} | {_cell(_arg_help(action))} |\n")
    return "".join(out)


def _subcommands(parser: argparse.ArgumentParser, prefix: str = ""
                 ) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {c.dest: c.help for c in action._choices_actions}
        for name, sub in action.choices.items():
            full = f"{prefix}{name}"
            yield full, sub, helps.get(name, "") or ""
            yield from _subcommands(sub, f"{full} ")


def _arg_name(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(f"`{o}`" for o in action.option_strings)
        takes = action.nargs != 0
        return names + (f" `{action.metavar or action.dest.upper()}`" if takes else "")
    return f"`{action.metavar or action.dest}`"


def _arg_help(action: argparse.Action) -> str:
    text = (action.help or "").replace("%%", "%")
    if action.choices and not isinstance(action.choices, dict):
        text += f" (one of: {', '.join(map(str, action.choices))})"
    if action.required and action.option_strings:
        text += " (required)"
    return text


# ------------------------------------------------------------------------------ formatting


def _cell(text: str) -> str:
    return _md(" ".join(text.split())).replace("|", "\\|")


def _first_line(doc: str | None) -> str:
    return inspect.cleandoc(doc or "").split("\n\n")[0]


def _type_cell(info: FieldInfo) -> str:
    return f"`{_type_name(info.annotation)}`".replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (tuple, list):
        inner = _type_name(args[0]) if args else "any"
        return f"list[{inner}]"
    if origin is dict:
        return f"mapping[{_type_name(args[0])}, {_type_name(args[1])}]" if args else "mapping"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
                "PosixPath": "path", "Path": "path"}.get(annotation.__name__,
                                                         annotation.__name__)
    return str(annotation).replace("typing.", "")


def _default_cell(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is PydanticUndefined:
        return "—"
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value!r}`".replace("|", "\\|")


def _bounds(info: FieldInfo) -> str:
    words = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "at least",
             "max_length": "at most"}
    found = []
    for meta in info.metadata:
        for attr, word in words.items():
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{word} {value}" + (" items" if "length" in attr else ""))
    return f" ({', '.join(found)})" if found else ""

"""The JSON Schema of faultlab's YAML documents, for editors: ``faultlab schema`` prints it.

Generated from the pydantic models (``Experiment``, ``Campaign``, ``Suite``, ``PlannedSuite``),
their field docstrings becoming ``description`` s, then reshaped where a model takes another
form in YAML than in Python:

- a fault's ``target`` is ``{rank: N}``, ``{node: N}``, ``random`` or ``all`` (``Selector``'s
  YAML forms, not its ``kind``/``value`` fields);
- a fault's ``type`` is one of the registered fault types, and its ``params`` are that type's
  own ``Params`` (one ``if``/``then`` per type), so an editor completes and checks them too;
- a command, a launch line and a service's line may be one string (split like a shell would)
  as well as a list;
- ``topology`` has the settings block of each registered target that declares one
  (``topology.slurm:``, the model ``Target.settings`` names).

The schema is what an editor can check as you type. ``faultlab validate`` stays the judge: the
rules that span sections (a rank inside the world size, a trigger inside the run, a trainer's
settings) are not expressible here and are checked only there.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from faultlab.fault_api import fault_types

__all__ = ["SCHEMA_ID", "document_schema", "markdown"]

SCHEMA_ID = "urn:faultlab:schema:document"
"""The schema's ``$id``: a name, not an address (editors read the file you point them at)."""

_ONE_STRING_OR_LIST = {
    "TargetSpec": ("command", "launch"),
}
"""Fields whose before-validator also splits one string into a list (``shlex``)."""


def document_schema() -> dict[str, Any]:
    """One schema for every faultlab document: an experiment, a campaign or a suite."""
    from faultlab.spec._suite import PlannedSuite
    from faultlab.spec.campaign import Campaign
    from faultlab.spec.model import Experiment, Suite

    models: list[type[BaseModel]] = [Experiment, Campaign, Suite, PlannedSuite]
    refs, schema = models_json_schema([(m, "validation") for m in models],
                                      ref_template="#/$defs/{model}")
    defs: dict[str, Any] = schema["$defs"]
    _yaml_selector(defs)
    _string_or_list(defs)
    _fault_types(defs)
    _target_settings(defs)
    out: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "faultlab document",
        "description": "A faultlab experiment, campaign or suite (faultlab schema; checked in "
                       "full by faultlab validate).",
        "anyOf": [refs[(m, "validation")] for m in models],
        "$defs": defs,
    }
    return _plain_text(out)


def _yaml_selector(defs: dict[str, Any]) -> None:
    selector = defs["Selector"]
    number = {"type": "integer", "minimum": 0}
    defs["Selector"] = {
        "title": "Selector",
        "description": selector.get("description", ""),
        "anyOf": [
            {"enum": ["random", "all"]},
            {"type": "object", "properties": {"rank": number}, "required": ["rank"],
             "additionalProperties": False},
            {"type": "object", "properties": {"node": number}, "required": ["node"],
             "additionalProperties": False},
        ],
    }


def _string_or_list(defs: dict[str, Any]) -> None:
    for model, fields in _ONE_STRING_OR_LIST.items():
        for name in fields:
            prop = defs[model]["properties"][name]
            keep = {k: prop.pop(k) for k in ("description", "default", "title") if k in prop}
            defs[model]["properties"][name] = {**keep, "anyOf": [{"type": "string"}, prop]}
    services = defs["TargetSpec"]["properties"]["services"]
    services["additionalProperties"] = {"anyOf": [{"type": "string"},
                                                  services["additionalProperties"]]}


def _fault_types(defs: dict[str, Any]) -> None:
    """``type`` is an enum of the registered faults; ``params`` follows the type's Params."""
    names = list(fault_types())
    branches = []
    for name, cls in fault_types().items():
        params = cls.Params.model_json_schema(ref_template="#/$defs/{model}")
        for sub, body in params.pop("$defs", {}).items():
            defs.setdefault(sub, body)
        params["description"] = f"{name}: {cls.summary()}"
        branches.append({"if": {"properties": {"type": {"const": name}},
                                "required": ["type"]},
                         "then": {"properties": {"params": params}}})
    for model in ("FaultSpec", "MixEntry"):
        if model not in defs:
            continue
        props = defs[model]["properties"]
        props["type"] = {**props["type"], "enum": names}
        props["type"].pop("type", None)
        props["params"] = {"description": props["params"].get("description", ""),
                           "type": "object"}
        defs[model]["allOf"] = copy.deepcopy(branches)
    defs.pop("FaultParams", None)


def _target_settings(defs: dict[str, Any]) -> None:
    """``topology.<launcher>:``, the settings block of each registered target that declares a
    model (``Target.settings``: ``slurm:``), by that model's schema."""
    from faultlab.spec.target import launcher_class, launcher_names

    props = defs["Topology"]["properties"]
    for name in launcher_names():
        model = getattr(launcher_class(name), "settings", None)
        if model is None or name in props:
            continue
        settings = model.model_json_schema(ref_template="#/$defs/{model}")
        for sub, body in settings.pop("$defs", {}).items():
            defs.setdefault(sub, body)
        settings["description"] = (f"The {name} target's own settings (launcher: {name} "
                                   f"only). " + settings.get("description", ""))
        props[name] = settings


def markdown(text: str) -> str:
    """A docstring's reST literals (````x````) and roles (``:mod:`x```) as Markdown."""
    text = re.sub(r":(?:mod|func|class|meth|attr):`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S)


def _plain_text(node: Any) -> Any:
    """Every description of the schema in Markdown (``markdown``), as editors show it."""
    if isinstance(node, dict):
        return {k: (markdown(v) if k == "description" and isinstance(v, str)
                    else _plain_text(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain_text(v) for v in node]
    return node

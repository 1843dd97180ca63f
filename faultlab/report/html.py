"""report.html of a pre-launch suite: report.json through a jinja2 template, plots inline.

A campaign's pieces (headline, step-against-time plot, per-type table, false positives,
injections) are the macros of ``templates/_campaign.html.j2`` over the rows of
``faultlab.report.campaign``: its own page and its section of the pre-launch report use the same.

The page is self-contained: its CSS is in a ``<style>`` element, its plots are inline SVG
(``faultlab.report.plots``), it has no script, and it loads nothing — no stylesheet, font,
image or script from anywhere — so it opens from a file, offline, and can be mailed around.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from faultlab.report import _format as fmt
from faultlab.report.campaign import (
    INJECTION_COLUMNS,
    TYPE_COLUMNS,
    injection_rows,
    summary_rows,
    type_rows,
)
from faultlab.report.detection import DETECTION_HEADER, detection_lines, detection_rows
from faultlab.report.markdown import PROJECTION_ROWS, sla_summary
from faultlab.report.plots import (
    PHASE_COLORS,
    campaign_svg,
    loss_svg,
    recovery_svg,
    timeline_svg,
)
from faultlab.report.repeats import METRIC_HEADER, SLA_HEADER, spread_rows

__all__ = ["CAMPAIGN_TEMPLATE", "TEMPLATE", "render_campaign_html", "render_html"]

CAMPAIGN_TEMPLATE = "campaign.html.j2"

TEMPLATE = "prelaunch.html.j2"


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("faultlab.report", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(seconds=fmt.seconds, number=fmt.number, percent=fmt.percent,
                       usd=fmt.usd, size=fmt.size, timestamp=fmt.timestamp,
                       verdict=fmt.verdict)
    env.globals.update(sla_bound=fmt.sla_bound, sla_measured=fmt.sla_measured,
                       measured=fmt.measured, sla_summary=sla_summary,
                       sla_result=fmt.sla_result, result_word=fmt.result_word,
                       result_mark=fmt.result_mark, detection_rows=detection_rows,
                       detection_lines=detection_lines, detection_header=DETECTION_HEADER,
                       repeat_rows=spread_rows, repeat_headers=(SLA_HEADER, METRIC_HEADER),
                       campaign_summary_rows=summary_rows, campaign_type_rows=type_rows,
                       campaign_injection_rows=injection_rows,
                       campaign_type_columns=TYPE_COLUMNS,
                       campaign_injection_columns=INJECTION_COLUMNS)
    return env


def render_html(report: dict[str, Any]) -> str:
    """The HTML page of ``report`` (a report.json document)."""
    plots: dict[str, Markup] = {}
    if report["recovery"]["rows"]:
        plots["recovery"] = Markup(recovery_svg(report["recovery"], "recovery"))  # noqa: S704
    for exp in report["experiments"]:
        if exp.get("timeline") and exp["timeline"]["series"]:
            plots[f"timeline-{exp['name']}"] = Markup(  # noqa: S704 - our own SVG
                timeline_svg(exp["timeline"], f"timeline-{exp['name']}"))
        if exp.get("campaign"):
            plots[f"campaign-{exp['name']}"] = _campaign_plot(exp["campaign"],
                                                              f"campaign-{exp['name']}")
        if exp.get("loss") and exp["loss"]["series"]:
            plots[f"loss-{exp['name']}"] = Markup(  # noqa: S704 - our own SVG
                loss_svg(exp["loss"], f"loss-{exp['name']}"))
    template = _environment().get_template(TEMPLATE)
    return template.render(report=report, plots=plots, projection_rows=PROJECTION_ROWS,
                           phase_colors=PHASE_COLORS)


def render_campaign_html(journal: dict[str, Any]) -> str:
    """The HTML page of a campaign run (its journal.json): step against time with every
    injection marked, the per-fault-type table, the false-positive rate, every injection."""
    campaign = journal["campaign"]
    template = _environment().get_template(CAMPAIGN_TEMPLATE)
    return template.render(journal=journal, score=campaign["score"],
                           plot=_campaign_plot(campaign, "campaign"))


def _campaign_plot(campaign: dict[str, Any], name: str) -> Markup:
    """Step against time with every injection marked, from the journal's ``campaign``."""
    return Markup(campaign_svg(campaign.get("series") or {},  # noqa: S704 - our own SVG
                               campaign.get("marked") or [], name))

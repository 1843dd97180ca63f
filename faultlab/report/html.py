"""report.html of a pre-launch suite: report.json through a jinja2 template, plots inline.

The page is self-contained: its CSS is in a ``<style>`` element, its plots are inline SVG
(``faultlab.report.plots``), it has no script, and it loads nothing — no stylesheet, font,
image or script from anywhere — so it opens from a file, offline, and can be mailed around.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from faultlab.report import _format as fmt
from faultlab.report.markdown import PROJECTION_ROWS, sla_summary
from faultlab.report.plots import PHASE_COLORS, loss_svg, recovery_svg, timeline_svg
from faultlab.report.repeats import METRIC_HEADER, SLA_HEADER, spread_rows

__all__ = ["TEMPLATE", "render_html"]

TEMPLATE = "prelaunch.html.j2"


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("faultlab.report", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(seconds=fmt.seconds, number=fmt.number, percent=fmt.percent,
                       usd=fmt.usd, size=fmt.size, timestamp=fmt.timestamp,
                       verdict=fmt.verdict)
    env.globals.update(sla_bound=fmt.sla_bound, measured=fmt.measured, sla_summary=sla_summary,
                       repeat_rows=spread_rows, repeat_headers=(SLA_HEADER, METRIC_HEADER))
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
        if exp.get("loss") and exp["loss"]["series"]:
            plots[f"loss-{exp['name']}"] = Markup(  # noqa: S704 - our own SVG
                loss_svg(exp["loss"], f"loss-{exp['name']}"))
    template = _environment().get_template(TEMPLATE)
    return template.render(report=report, plots=plots, projection_rows=PROJECTION_ROWS,
                           phase_colors=PHASE_COLORS)

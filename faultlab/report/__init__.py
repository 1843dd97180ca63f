"""Journal and reports of a run, and the pre-launch report of a suite run.

It may import ``faultlab.errors``, ``faultlab.spec``, ``faultlab.faults``, ``faultlab.observe``
and ``faultlab.judge``: it renders what they produced; never the engine (which calls it) nor the
targets.
"""

from faultlab.report.journal import SCHEMA_VERSION, read_journal, render_markdown, write_journal
from faultlab.report.prelaunch import SuiteRun, build_report, render_folder
from faultlab.report.projection import Projection, project

__all__ = ["SCHEMA_VERSION", "Projection", "SuiteRun", "build_report", "project", "read_journal",
           "render_folder", "render_markdown", "write_journal"]

"""Journal and reports of a run."""

from faultlab.report.journal import SCHEMA_VERSION, read_journal, render_markdown, write_journal

__all__ = ["SCHEMA_VERSION", "read_journal", "render_markdown", "write_journal"]

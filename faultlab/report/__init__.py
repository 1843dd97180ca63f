"""faultlab.report."""

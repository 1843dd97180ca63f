"""faultlab.engine."""

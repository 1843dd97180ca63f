"""faultlab.spec."""

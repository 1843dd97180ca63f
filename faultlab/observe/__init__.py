"""faultlab.observe."""

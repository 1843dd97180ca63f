"""faultlab.targets."""

"""Targets: how a job is launched and addressed (local nodes on this host for now)."""

"""Chaos Toolkit extension for faultlab (empty until the extension issue lands)."""

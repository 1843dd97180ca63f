"""pytest plugin for faultlab experiments (empty until the plugin issue lands)."""

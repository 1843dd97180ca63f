"""faultlab: chaos engineering for distributed PyTorch training.

The engine, experiment schema and faults arrive in later issues; today the package holds the
command-line entry point and the version.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]

"""`faultlab` command-line entry point."""

from __future__ import annotations

import argparse
import sys

from faultlab import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="faultlab",
        description="Chaos engineering for distributed PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"faultlab {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())

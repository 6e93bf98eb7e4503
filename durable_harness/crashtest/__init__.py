"""The crash matrix runner (``durable-harness crash-test``)."""

from __future__ import annotations

import argparse


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the crash-test options."""
    p.add_argument("--scenario", action="append", default=[])


def run_cli(args: argparse.Namespace) -> int:
    """Run the matrix from the command line."""
    return 1

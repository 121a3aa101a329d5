"""Reporting: text, files and pages made from what was measured, pulled at exit or read back.

Nothing here is called on the hot path, and nothing here reaches into the
measuring layers: the summary and the trace are handed the recorder's data
(or read a saved trace) and only word it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


def command_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The parser of the subcommand ``python -m chainer_autoprof NAME`` (argparse is imported
    here: the agent imports this package in every profiled process, never a parser)."""
    import argparse

    return argparse.ArgumentParser(prog=f"python -m chainer_autoprof {name}",
                                   description=description)

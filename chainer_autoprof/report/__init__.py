"""Reporting: text, files and pages made from what was measured, pulled at exit or read back.

Nothing here is called on the hot path, and nothing here reaches into the
measuring layers: the summary and the trace are handed the recorder's data
(or read a saved trace) and only word it.
"""

import argparse


def command_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The parser of the subcommand ``python -m chainer_autoprof NAME``."""
    return argparse.ArgumentParser(prog=f"python -m chainer_autoprof {name}",
                                   description=description)

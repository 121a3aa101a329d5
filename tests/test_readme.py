"""README.md stays true: generated tables, first commands, every setting and flag it names."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import pytest

from chainer_autoprof import cli
from chainer_autoprof.common.settings import BY_ENV

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
CI_RUN = (REPO / ".ci" / "run").read_text(encoding="utf-8")
SH_BLOCKS = re.findall(r"```sh\n(.*?)```", README, re.S)


def test_generated_tables_are_current():
    tool = runpy.run_path(str(REPO / ".ci" / "readme.py"))
    assert tool["render"](README) == README, "run: python .ci/readme.py"
    assert tool["settings_table"]() in README
    assert tool["colour_table"]() in README


def test_readme_starts_with_the_main_job_and_the_test_command():
    first, second = (block.strip() for block in SH_BLOCKS[:2])
    assert first == "./.ci/setup && .venv/bin/chainer-autoprof examples/train_mnist_synthetic.py"
    setup, _, tests = second.partition(" && ")
    assert setup == "./.ci/setup"
    # CI runs the very same test command after the same setup.
    ci_lines = [line.strip() for line in CI_RUN.splitlines()]
    assert "./.ci/setup" in ci_lines
    assert tests in ci_lines and tests.startswith(".venv/bin/python -m pytest")
    assert (REPO / "examples" / "train_mnist_synthetic.py").is_file()


def test_every_variable_named_is_a_setting():
    named = set(re.findall(r"CHAINER_PROF_[A-Z_]*[A-Z]", README))
    assert named, "the README names settings"
    assert named - set(BY_ENV) == set()
    assert set(BY_ENV) <= named, "each setting appears (at least in the table)"


def _launcher_command_lines() -> list[list[str]]:
    lines = []
    for block in SH_BLOCKS:
        for line in block.splitlines():
            words = shlex.split(line.split("  #")[0])
            for i, word in enumerate(words):
                if word.endswith("chainer-autoprof") or (
                        word == "chainer_autoprof" and words[i - 1] == "-m"):
                    argv = words[i + 1:]
                    if "[options]" not in argv:  # the synopsis lines
                        lines.append(argv)
                    break
    return lines


@pytest.mark.parametrize("argv", _launcher_command_lines(), ids=" ".join)
def test_every_launcher_command_shown_parses(argv):
    args = cli.parse_args(argv)
    assert args.action == "run" and args.target
    cli.settings_environ(args.flags, {})


def test_links_point_to_files():
    for target in re.findall(r"\]\(([^)#:]+)\)", README):
        assert (REPO / target).exists(), target

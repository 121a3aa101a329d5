"""Traps: what looks like training but is not, and ranges still open when the program ends."""

from __future__ import annotations

from pathlib import Path

from streams import check_stream, prune
from support import program, run_with_agent

CLASSIFIER = """
L Classifier
  L predictor (MLP)
    L predictor/l1 (Linear)
"""
PREDICTOR = """
L predictor (MLP)
  L predictor/l1 (Linear)
"""
ITERATION = """
I iteration
  P data
  P data
  P forward
    L Classifier
      L predictor (MLP)
        L predictor/l1 (Linear)
  P backward
    L Classifier backward
    L predictor/l1 (Linear) backward
  P update
"""


def indent(block: str, by: int = 1) -> str:
    return "".join("  " * by + line + "\n" for line in block.splitlines() if line.strip())


def test_evaluation_and_extensions_are_not_training(tmp_path: Path):
    """Inference by hand is ``inference``; extensions calling the model are extension ranges:
    an Evaluator (overridden), an Extension and a function made by ``make_extension``.

    The program ends with ``sys.exit`` inside an extension: every range is closed.
    """
    source = program("traps_evaluation_and_extensions")
    run = run_with_agent(tmp_path, source, {"CHAINER_PROF_GRANULARITY": "link"})
    assert run.returncode == 3, run.stderr
    assert run.stdout == "evaluated 2 batches\n"
    assert run.stderr == ""  # StopIteration ended the loop; nothing for the agent to report
    check_stream(run.events)
    inference = "P inference\n" + indent(CLASSIFIER)
    # the Evaluator first (its priority), then in the order of extend()
    extensions = ("P extension:validation (MyEvaluator)\n" + indent(CLASSIFIER) * 2
                  + "P extension:ImageGen\n" + indent(PREDICTOR) + "P extension:sample\n"
                  + indent(PREDICTOR) + "P extension:Stop\n")
    expected = inference * 4 + (ITERATION + extensions) * 2
    assert run.tree() == prune(expected, "link")


def test_open_iteration_closed_at_exit_after_uncaught_exception(tmp_path: Path):
    """An exception escaping a custom loop between forward and backward."""
    source = program("traps_exception_after_forward")
    run = run_with_agent(tmp_path, source, {"CHAINER_PROF_GRANULARITY": "phase"})
    assert run.returncode == 1
    assert "\nRuntimeError: stopped after forward\n" in run.stderr
    check_stream(run.events)
    assert run.tree() == ["iteration", "  forward"]


def test_sys_exit_inside_annotate_block(tmp_path: Path):
    source = program("traps_sys_exit_inside_annotate")
    run = run_with_agent(tmp_path, source, {"CHAINER_PROF_GRANULARITY": "phase"})
    assert run.returncode == 4, run.stderr
    check_stream(run.events, user=("step",))
    assert run.tree() == ["step", "  iteration", "    forward"]


def test_exception_escaping_trainer(tmp_path: Path):
    """The exception reaches the user unchanged; ranges end balanced."""
    source = program("traps_exception_escaping_trainer")
    run = run_with_agent(tmp_path, source, {"CHAINER_PROF_GRANULARITY": "link"})
    assert run.returncode == 1
    tail = run.stderr.rstrip().splitlines()
    assert tail[-1] == "KeyError: 'bad batch at update 2'"
    assert tail[-3].strip().startswith(f'File "{tmp_path / "script.py"}"')
    assert tail[-3].strip().endswith("in lossfun")
    check_stream(run.events)
    failed = """
I iteration
  P data
  P data
  P forward
"""
    assert run.tree() == prune(ITERATION + failed, "link")

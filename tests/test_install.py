"""install()/uninstall(), annotate(), import-time safety, version check and the status report."""

from __future__ import annotations

import re
from pathlib import Path

from streams import check_stream, prune, segments, tree_of
from support import program, run_python, run_with_agent, write_script

LIFECYCLE_PROGRAM = program("install_lifecycle")

ONCE = """
I iteration
  P forward
    L Classifier
      L predictor ({cls})
        L predictor/l1 (Linear)
          F LinearFunction.forward
      F SoftmaxCrossEntropy.forward
      F Accuracy.forward
  P backward
    L Classifier backward
      F SoftmaxCrossEntropy.backward
        F _SoftmaxCrossEntropyGrad_NoDoubleBackprop.forward
    L predictor/l1 (Linear) backward
      F LinearFunction.backward
        F LinearGradWeight.forward
        F Sum.forward
  P update
"""


def test_install_uninstall_reinstall(tmp_path: Path):
    """After ``import chainer``: applies at once, never twice, and uninstall restores exactly."""
    script = write_script(tmp_path, "lifecycle.py", LIFECYCLE_PROGRAM)
    run = run_python(tmp_path, [str(script)], check=True)
    assert run.stdout.splitlines() == [
        "second install returns the same agent: True",
        "class defined later wrapped: True",
        "next alias shares the wrapper: True True",
        "restored after uninstall: []",
        "class defined later restored: True",
        "__init_subclass__ hook removed: True",
        "Iterator.next untouched: True",
        "restored after the second uninstall: []",
    ]
    check_stream(run.events)
    parts = segments(run.events)
    # one range per call: the first install's settings (function granularity) hold
    assert tree_of(parts["installed"]) == \
        prune(ONCE.format(cls="Old") + ONCE.format(cls="OldAfter"), "function")
    assert parts["uninstalled"] == []
    assert tree_of(parts["reinstalled"]) == prune(ONCE.format(cls="Old"), "link")
    assert parts["end"] == []


def test_annotate_and_install_before_import(tmp_path: Path):
    """User ranges in the agent's (custom) domain; the agent installed before ``import chainer``."""
    source = program("install_annotate_before_import")
    run = run_with_agent(tmp_path, source, {"CHAINER_PROF_DOMAIN": "mine"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["chainer imported at start: False",
                                       "Link.__call__ wrapped at import: True",
                                       "done"]
    check_stream(run.events, domain="mine", user=("train_step", "eval", "fwd"))
    assert not [ev for ev in run.events if ev.domain == "chainer"]
    assert run.tree(domain="mine") == [
        "train_step",
        "  iteration",
        "    forward",
        "    backward",
        "    update",
        "eval",
        "  inference",
        "fwd",
        "  iteration",
        "    forward",
        "iteration",
        "  backward",
        "  update",
    ]


def test_failing_hook_never_breaks_import(tmp_path: Path):
    """An internal error while instrumenting: ``import chainer`` works, training runs plainly."""
    source = program("install_failing_hook")
    run = run_with_agent(tmp_path, source)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "Link.__call__ untouched: function\n"
    assert run.stderr == ("chainer_autoprof: could not instrument Chainer (RuntimeError: "
                          "instrumenting failed); running uninstrumented\n")
    assert [ev for ev in run.events if ev.event == "push"] == []


def test_unknown_chainer_version_runs_uninstrumented(tmp_path: Path):
    source = program("install_unknown_chainer_version")
    script = write_script(tmp_path, "version.py", source)
    run = run_python(tmp_path, [str(script)], env={"CHAINER_PROF_SUMMARY": "0"})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "Link.__call__ untouched: function\n"
    assert run.stderr == ("chainer_autoprof: Chainer 99.0.0 is not a version the agent knows "
                          "(6.x, 7.x); running uninstrumented\n")
    assert [ev for ev in run.events if ev.event == "push"] == []


def test_missing_chainer_warns_once_and_the_program_runs(tmp_path: Path):
    """Where Chainer cannot be imported, one warning, and the script runs unchanged."""
    source = program("install_missing_chainer")
    script = write_script(tmp_path, "nochainer.py", source)
    run = run_python(tmp_path, [str(script)])
    assert run.returncode == 0, run.stderr
    assert run.stdout == "script goes on: ModuleNotFoundError\n"
    assert run.stderr == ("chainer_autoprof: Chainer is not installed in this Python; "
                          "the program runs uninstrumented\n")


def test_status_report(tmp_path: Path):
    """CHAINER_PROF_LOG=debug: every target with owners and state at start, hits at exit."""
    source = program("install_status_report")
    script = write_script(tmp_path, "status.py", source)
    # Settings through install(), not the environment: an installed .pth would start
    # the agent at interpreter start-up, before the script removes its target.
    run = run_python(tmp_path, [str(script)])
    assert run.returncode == 0, run.stderr
    err = run.stderr
    start = err.split("patch status at start:\n")[1].split("chainer_autoprof:")[0]
    end = err.split("patch status at exit:\n")[1]

    def line(report: str, label: str) -> str:
        (found,) = [ln for ln in report.splitlines() if ln.split()[0] == label]
        return found

    assert re.search(r"patched +chainer\.link\.Link$", line(start, "Link.__call__"))
    assert line(start, "convert._call_converter").endswith(
        "skipped (chainer.dataset.convert has no _call_converter) ")
    assert "failed (RuntimeError: refused)" in line(start, "Variable.backward")
    assert line(start, "chainer.grad").endswith("patched    chainer.function_node")
    assert "could not instrument Variable.backward: RuntimeError: refused" in err
    # 3 steps: Classifier, predictor, l1 per step
    # the old-style model, defined after the start, joined the owners
    assert line(end, "Link.__call__").endswith("chainer.link.Link, __main__.Old  hits=9")
    assert line(end, "Optimizer.update").endswith("hits=3")
    # a loop by hand never calls an Updater: not a miss (only the core targets are flagged)
    assert line(end, "Updater.update").endswith("hits=0")
    assert "never hit" not in line(end, "Variable.backward")  # failed, not silently missed
    check_stream(run.events)
    assert run.tree() == ["iteration", "  forward", "  update"] * 3

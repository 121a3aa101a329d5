"""The exact NVTX stream per granularity: nesting, names, colours, balance, registered strings.

Real Chainer on the CPU, real NVTX through the injection library, one
subprocess per program.  The scenario program re-installs the agent once per
granularity and marks each scenario in a domain of its own, so one process
covers every granularity.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nvtx_tool import ranges_by_thread
from streams import GRANULARITIES, check_stream, prune, segments, tree_of
from support import (
    EXAMPLES,
    TRAINER_ARGS,
    program,
    run_python,
    run_with_agent,
    twin_env,
    twins,
    write_script,
)

from chainer_autoprof.common import names

# -- expected trees (tagged: see streams.py) ---------------------------------------

CLASSIFIER_MLP = """
I iteration
  P forward
    L Classifier
      L predictor (MLP)
        L predictor/l1 (Linear)
          F LinearFunction.forward
        F ReLU.forward
        L predictor/l2 (Linear)
          F LinearFunction.forward
      F SoftmaxCrossEntropy.forward
      F Accuracy.forward
  P backward
    L Classifier backward
      F SoftmaxCrossEntropy.backward
        F _SoftmaxCrossEntropyGrad_NoDoubleBackprop.forward
    L predictor/l2 (Linear) backward
      F LinearFunction.backward
        F LinearGradData.forward
        F LinearGradWeight.forward
        F Sum.forward
    F predictor (MLP) backward
      F ReLU.backward
        F ReLUGrad2.forward
    L predictor/l1 (Linear) backward
      F LinearFunction.backward
        F LinearGradWeight.forward
        F Sum.forward
  P update
"""
# ``predictor (MLP) backward`` is tagged F: at link granularity only the node a
# link returns is attributed to it, and the ReLU between l1 and l2 stays in
# l2's backward range; at function granularity every node knows its link.

OLD_BEFORE = """
I iteration
  P forward
    L Classifier
      L predictor (OldBefore)
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

OLD_AFTER = """
I iteration
  P forward
    L OldAfter
      L l1 (Linear)
        F LinearFunction.forward
  F Sum.forward
  P backward
    F Sum.backward
      F BroadcastTo.forward
    L l1 (Linear) backward
      F LinearFunction.backward
        F LinearGradWeight.forward
        F Sum.forward
  P update
"""

ERROR = """
I iteration
  P forward
    L Boom
      L l1 (Linear)
        F LinearFunction.forward
"""

# One Updater.update, two optimizers (dis, then gen), each with a loss function:
# one iteration.  Function lines are left out (checked separately).
GAN = """
I iteration
  P data
  P data
  P forward
    L Gen
      L l1 (Linear)
  P forward
    L Dis
      L l1 (Linear)
  P forward
    L Dis
      L l1 (Linear)
  P forward
  P backward
    L l1 (Linear) backward
    L l1 (Linear) backward
    L l1 (Linear) backward
  P update
  P forward
  P backward
    L l1 (Linear) backward
    L l1 (Linear) backward
  P update
"""

SCENARIOS = {"lossfun": CLASSIFIER_MLP, "custom": CLASSIFIER_MLP * 2, "old_before": OLD_BEFORE,
             "old_after": OLD_AFTER, "grad": CLASSIFIER_MLP, "error": ERROR}

# Link ranges limited to depth 2: l1/l2 inside predictor are not shown, and
# their backward is attributed to predictor.
CLASSIFIER_MLP_DEPTH2 = [
    "iteration",
    "  forward",
    "    Classifier",
    "      predictor (MLP)",
    "  backward",
    "    Classifier backward",
    "    predictor (MLP) backward",
    "  update",
]

SCENARIO_PROGRAM = program("ranges_scenarios")


@pytest.fixture(scope="module", params=twins())
def scenarios(request: pytest.FixtureRequest, tmp_path_factory) -> tuple:
    """The scenario program's run, on each hot path in turn (conftest.py)."""
    tmp = tmp_path_factory.mktemp("scenarios")
    script = write_script(tmp, "scenarios.py", SCENARIO_PROGRAM)
    run = run_python(tmp, [str(script), ",".join(GRANULARITIES), "2"], check=True,
                     env=twin_env(request.param))
    return run, segments(run.events)


def test_scenario_stream_is_balanced_coloured_and_registered(scenarios):
    run, parts = scenarios
    check_stream(run.events)
    assert {ev.domain for ev in run.events if ev.event == "push"} == {"chainer"}
    expected_tags = {f"{g}:{s}" for g in (*GRANULARITIES, "link2")
                     for s in (*SCENARIOS, "gan", "end")}
    assert set(parts) == expected_tags


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_tree(scenarios, scenario, granularity):
    """Exact tree of each training style at each granularity (iteration ⊃ its phases)."""
    _, parts = scenarios
    assert tree_of(parts[f"{granularity}:{scenario}"]) == prune(SCENARIOS[scenario], granularity)
    assert parts[f"{granularity}:end"] == []  # nothing left open, nothing emitted after


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_two_optimizer_updater_is_one_iteration(scenarios, granularity):
    _, parts = scenarios
    events = parts[f"{granularity}:gan"]
    if granularity == "function":  # its function lines follow Chainer's graph; prune them
        ranges = next(iter(ranges_by_thread(events, "chainer").values()))
        tagged = "\n".join("  " * d + ("F " if c == names.CATEGORIES[names.FUNCTION][1] else
                                       "L ") + text for d, text, c in ranges)
        assert prune(tagged, "link") == prune(GAN, "link")
    else:
        assert tree_of(events) == prune(GAN, granularity)


def test_link_depth_limit(scenarios):
    _, parts = scenarios
    assert tree_of(parts["link2:lossfun"]) == CLASSIFIER_MLP_DEPTH2
    assert tree_of(parts["link2:custom"]) == CLASSIFIER_MLP_DEPTH2 * 2
    assert tree_of(parts["link2:grad"]) == CLASSIFIER_MLP_DEPTH2
    # links within the limit are unchanged
    assert tree_of(parts["link2:old_after"]) == prune(OLD_AFTER, "link")


def test_exception_mid_forward_reaches_user_unchanged(scenarios):
    run, _ = scenarios
    lines = run.stdout.splitlines()
    assert lines == [f"{g} ValueError boom in forward True forward "
                     'raise ValueError("boom in forward")' for g in (*GRANULARITIES, "link2")]


# -- the Trainer -------------------------------------------------------------------

def trainer_iteration(granularity: str) -> list[str]:
    return prune("""
I iteration
  P data
  P data
  P forward
    L Classifier
      L predictor (MLP)
        L predictor/l1 (Linear)
        L predictor/l2 (Linear)
        L predictor/l3 (Linear)
  P backward
    L Classifier backward
    L predictor/l3 (Linear) backward
    L predictor/l2 (Linear) backward
    L predictor/l1 (Linear) backward
  P update
""", granularity)


def evaluator(granularity: str) -> list[str]:
    """The Evaluator calls the model: an extension range, no phase, no iteration."""
    return prune("""
P extension:validation (Evaluator)
  L Classifier
    L predictor (MLP)
      L predictor/l1 (Linear)
      L predictor/l2 (Linear)
      L predictor/l3 (Linear)
""", granularity)


@pytest.mark.parametrize("granularity", [None, "link"], ids=["default", "link"])
def test_trainer_script(tmp_path: Path, granularity: str | None):
    settings = {"CHAINER_PROF_GRANULARITY": granularity} if granularity else {}
    source = (EXAMPLES / "train_mnist_synthetic.py").read_text()
    run = run_with_agent(tmp_path, source, settings, script_args=tuple(TRAINER_ARGS))
    assert run.returncode == 0, run.stderr
    check_stream(run.events)
    gran = granularity or "phase"  # the default
    reports = ["extension:LogReport", "extension:PrintReport"]
    assert run.tree() == (trainer_iteration(gran) + reports + trainer_iteration(gran)
                          + evaluator(gran) + reports)


def test_iteration_granularity_and_domain(tmp_path: Path):
    """Iteration granularity emits iterations only; CHAINER_PROF_DOMAIN names the domain."""
    source = (EXAMPLES / "train_mnist_synthetic.py").read_text()
    run = run_with_agent(tmp_path, source, {"CHAINER_PROF_GRANULARITY": "iteration",
                                            "CHAINER_PROF_DOMAIN": "my-train"},
                         script_args=tuple(TRAINER_ARGS))
    assert run.returncode == 0, run.stderr
    check_stream(run.events, domain="my-train")
    assert run.tree(domain="my-train") == ["iteration", "iteration"]
    assert not [ev for ev in run.events if ev.domain == "chainer"]


"""Configuration advice: each check has a run that triggers it and one that does not.

Runs are real Chainer trainings under the agent (tests/verdict_workloads.py).
Checks that need a GPU (cuDNN, autotune, float64 parameters, copies between
host and GPU) or another NumPy build (BLAS) cannot be triggered by a CPU run
here: their rules are checked on a real CPU run's statistics whose recorded
facts are changed to what the probes record on such a machine, and the
``gpu``-marked test runs the real thing where CuPy and a GPU exist.
"""

from __future__ import annotations

import copy

import pytest
from support import program, run_with_agent
from verdict_workloads import run_workload

from chainer_autoprof.analysis import advice
from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.report.tracefile import read_trace

_RUNS: dict[str, object] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("advice")

    def get(name: str, *args: str, env: dict[str, str] | None = None):
        if name not in _RUNS:
            _RUNS[name] = run_workload(base / name, *args, env=env)
        return _RUNS[name]

    return get


#: A sound setup: layers big enough that type checks are noise, a standard Evaluator.
CLEAN = ("mlp", "--width", "256", "--batch", "128", "--evaluator", "standard",
         "--iterations", "25")
INPUT_BOUND = ("mlp", "--delay", "0.002", "--iterations", "15")


def keys(stats) -> list[str]:
    return [f.key for f in advice.check(stats)]


def test_clean_configuration_gets_no_advice(runs):
    w = runs("clean", *CLEAN)
    assert keys(w.stats) == []
    assert "Advice" not in w.stderr
    assert "Verdict:" in w.stderr


def test_type_check_on_with_many_cheap_calls(runs):
    w = runs("cheap", "cheap", "--batch", "2", "--iterations", "12")
    facts = vd.facts_of(w.stats)
    assert facts["config"]["type_check"] is True
    assert facts["functions_per_iteration"] >= 300  # 60 where + scale, forward and backward
    assert facts["type_checks_timed"] > 0 and facts["type_check_us"] > 0
    found = {f.key: f for f in advice.check(w.stats)}
    assert "type_check" in found
    finding = found["type_check"]
    assert f"{facts['functions_per_iteration']} function calls per iteration" in finding.seen
    assert "ms per iteration" in finding.cost
    assert finding.link.endswith("performance.html#fine-tune-configuration")
    assert "[type_check]" in w.stderr


def test_type_check_off_gives_no_type_check_advice(runs):
    w = runs("cheap_off", "cheap", "--batch", "2", "--iterations", "12", "--type-check", "0")
    assert vd.facts_of(w.stats)["config"]["type_check"] is False
    assert "type_check" not in keys(w.stats)


def test_type_check_on_with_costly_calls_says_nothing(runs):
    """Type checks cost microseconds: next to large layers they are not worth a line."""
    w = runs("big", "big", "--batch", "128", "--iterations", "10")
    assert vd.facts_of(w.stats)["config"]["type_check"] is True
    assert "type_check" not in keys(w.stats)


def test_evaluation_that_keeps_the_graph(runs):
    w = runs("keeps_graph", "mlp", "--evaluator", "keeps-graph", "--iterations", "25")
    evaluation = vd.facts_of(w.stats)["evaluation"]
    assert evaluation[0]["graph_functions"] > 0
    found = {f.key: f for f in advice.check(w.stats)}
    assert "eval_backprop" in found
    assert "KeepsGraphEvaluator" in found["eval_backprop"].seen
    assert "no_backprop_mode" in found["eval_backprop"].fix


def test_standard_evaluator_gives_no_backprop_advice(runs):
    w = runs("clean", *CLEAN)
    evaluation = vd.facts_of(w.stats)["evaluation"]
    assert evaluation and evaluation[0]["functions"] > 0  # it did evaluate...
    assert evaluation[0]["graph_functions"] == 0          # ...without building a graph
    assert "eval_backprop" not in keys(w.stats)


def test_serial_iterator_while_input_bound(runs):
    w = runs("input", *INPUT_BOUND)
    found = {f.key: f for f in advice.check(w.stats)}
    assert "serial_iterator" in found
    assert "MultiprocessIterator" in found["serial_iterator"].fix
    assert f"{100 * w.stats.phase_share('data'):.1f}%" in found["serial_iterator"].cost


def test_parallel_iterator_gets_no_serial_iterator_advice(runs):
    w = runs("input_thread", *INPUT_BOUND, "--iterator", "thread")
    assert vd.facts_of(w.stats)["iterator"] == "MultithreadIterator"
    assert "serial_iterator" not in keys(w.stats)


def test_serial_iterator_not_input_bound_says_nothing(runs):
    w = runs("clean", *CLEAN)
    assert vd.facts_of(w.stats)["iterator"] == "SerialIterator"
    assert "serial_iterator" not in keys(w.stats)


def test_slow_first_iterations(runs):
    w = runs("warm", "mlp", "--first-call-sleep", "0.4", "--iterations", "20")
    found = {f.key: f for f in advice.check(w.stats)}
    assert "warmup" in found
    warm = w.stats.outside_ms["warm-up"]
    assert warm >= 400
    assert f"the first {w.stats.warmup} iteration(s)" in found["warmup"].seen


def test_blas_of_this_numpy_is_recorded_and_optimized(runs):
    w = runs("clean", *CLEAN)
    import numpy

    blas = vd.facts_of(w.stats)["blas"]
    from chainer_autoprof.patches.probes import blas_facts

    assert blas["name"] == blas_facts()["name"]
    assert blas["gflops"] > 0
    if blas["optimized"]:
        assert "blas" not in keys(w.stats), numpy.__version__


HAND_WRITTEN = program("advice_hand_written_loop")


def test_facts_of_a_hand_written_loop(tmp_path):
    """Without a Trainer the probes still see the training updates and count iteration 1."""
    trace = tmp_path / "trace.json"
    run = run_with_agent(tmp_path, HAND_WRITTEN, {"CHAINER_PROF_TRACE": str(trace)},
                         nvtx=False)
    assert run.returncode == 0, run.stderr
    facts = vd.facts_of(read_trace(str(trace)).stats())
    assert facts["config"]["type_check"] is True and facts["config"]["train"] is True
    assert facts["params"] == {"count": 2, "size": 36, "dtypes": {"float32": 2}, "gpu": 0}
    # Linear, softmax cross entropy, accuracy; then the backward pass's functions
    assert facts["functions_per_iteration"] >= 3 and facts["functions_counted_in"] == 1


# -- rules that need another machine: a real run's stats, its facts changed -----------------

def with_facts(stats, **changes):
    """A copy of ``stats`` whose recorded facts have ``changes`` (None deletes a key)."""
    out = copy.deepcopy(stats)
    facts = out.meta.setdefault("facts", {})
    for key, value in changes.items():
        if value is None:
            facts.pop(key, None)
        else:
            facts[key] = value
    return out


GPU_PARAMS = {"count": 6, "size": 1000, "dtypes": {"float32": 6}, "gpu": 6}


def test_cudnn_missing_rule(runs):
    stats = runs("clean", *CLEAN).stats
    cfg = dict(vd.facts_of(stats)["config"])
    missing = with_facts(stats, params=GPU_PARAMS, conv_links={"count": 2, "gpu": 2},
                         cuda={"available": True, "cudnn_enabled": False}, config=cfg)
    assert "cudnn" in keys(missing)
    present = with_facts(missing, cuda={"available": True, "cudnn_enabled": True})
    assert "cudnn" not in keys(present)
    never = with_facts(present, config=dict(cfg, use_cudnn="never"))
    assert "cudnn" in keys(never)
    no_conv = with_facts(missing, conv_links={"count": 0, "gpu": 0})
    assert "cudnn" not in keys(no_conv)  # an MLP loses little without cuDNN


def test_autotune_rule(runs):
    stats = runs("clean", *CLEAN).stats
    cfg = dict(vd.facts_of(stats)["config"], autotune=False)
    off = with_facts(stats, params=GPU_PARAMS, conv_links={"count": 3, "gpu": 3},
                     cuda={"available": True, "cudnn_enabled": True}, config=cfg)
    found = {f.key: f for f in advice.check(off)}
    assert "autotune" in found and "3 convolution link(s)" in found["autotune"].seen
    assert "autotune" not in keys(with_facts(off, config=dict(cfg, autotune=True)))
    assert "autotune" not in keys(with_facts(off, conv_links={"count": 3, "gpu": 0}))


def test_float64_on_gpu_rule(runs):
    stats = runs("clean", *CLEAN).stats
    params = dict(GPU_PARAMS, dtypes={"float64": 2, "float32": 4},
                  float64_gpu_examples=["/predictor/l1/W", "/predictor/l1/b"])
    found = {f.key: f for f in advice.check(with_facts(stats, params=params))}
    assert "float64_gpu" in found and "/predictor/l1/W" in found["float64_gpu"].seen
    assert "float64_gpu" not in keys(with_facts(stats, params=GPU_PARAMS))


def test_transfers_rule(runs):
    stats = runs("clean", *CLEAN).stats
    total = stats.iterations + stats.warmup
    every = with_facts(stats, params=GPU_PARAMS,
                       transfers={"calls": total, "by": {"to_cpu": total},
                                  "phases": {"forward": total}, "iterations": total})
    found = {f.key: f for f in advice.check(every)}
    assert "transfers" in found and f"in {total} of {total}" in found["transfers"].seen
    once = with_facts(every, transfers={"calls": 1, "by": {"to_cpu": 1},
                                        "phases": {"update": 1}, "iterations": 1})
    assert "transfers" not in keys(once)


def test_blas_rule(runs):
    stats = runs("big", "big", "--batch", "128", "--iterations", "10").stats
    reference = with_facts(stats, blas={"name": "blas", "optimized": False, "gflops": 1.5})
    found = {f.key: f for f in advice.check(reference)}
    assert "blas" in found and "1.5 GFLOP/s" in found["blas"].cost
    unknown_slow = with_facts(stats, blas={"name": None, "optimized": None, "gflops": 1.0})
    assert "blas" in keys(unknown_slow)
    unknown_fast = with_facts(stats, blas={"name": None, "optimized": None, "gflops": 80.0})
    assert "blas" not in keys(unknown_fast)
    on_gpu = with_facts(reference, params=GPU_PARAMS)
    assert "blas" not in keys(on_gpu)


def test_advice_survives_the_trace(runs):
    """The facts reach the trace: the report of the saved trace gives the same advice."""
    w = runs("input", *INPUT_BOUND)
    again = read_trace(str(w.trace_path)).stats()
    assert keys(again) == keys(w.stats) == ["serial_iterator"]


# -- the real thing on a GPU -------------------------------------------------------------------

GPU_SCRIPT = program("advice_gpu_training")


@pytest.mark.gpu
def test_gpu_advice_on_a_gpu(tmp_path):
    pytest.importorskip("cupy")
    import cupy

    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:
        pytest.skip(f"no CUDA device ({exc})")
    run = run_with_agent(tmp_path, GPU_SCRIPT, {"CHAINER_PROF_SUMMARY": "1",
                                                "CHAINER_PROF_TRACE": str(tmp_path / "t.json"),
                                                "CHAINER_PROF_WARMUP": "1"},
                         nvtx=False, count_device=False)
    assert run.returncode == 0, run.stderr
    stats = read_trace(str(tmp_path / "t.json")).stats()
    found = keys(stats)
    assert "transfers" in found
    assert "float64_gpu" in found
    facts = vd.facts_of(stats)
    if facts["cuda"]["cudnn_enabled"]:
        assert "autotune" in found
    else:
        assert "cudnn" in found

"""Iterations counted as the user counts steps, in the script shapes users write.

Each script is real Chainer training run under the launcher in a subprocess,
with NVTX recorded through the injection library and a trace written; the
number of iterations is checked in the trace, in the summary and, where the
stream can know it when it pushes, in NVTX (balanced, iterations at depth 0).
The rule (README, "What an iteration is"): an updater's ``update`` is one
iteration; without one, a step runs from its first training event to its
last optimizer update; what reaches no update is no iteration; only what
runs between two iterations is between iterations.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from nvtx_tool import ranges_by_thread
from support import program, run_python, write_script

from chainer_autoprof.analysis import verdict as vd
from chainer_autoprof.common import names
from chainer_autoprof.report.tracefile import stats_from_trace

HEADER = "chainer_autoprof summary"

#: A model, its data and its optimizer: the start of every script here.
COMMON = program("loops_common")


def run_script(tmp: Path, body: str, *flags: str) -> tuple:
    """Run COMMON + ``body`` under the launcher with a trace; (run, trace data, stats)."""
    script = write_script(tmp, "train.py", COMMON + body)
    trace = tmp / "run.json"
    run = run_python(tmp, ["-m", "chainer_autoprof", "--trace", str(trace), *flags,
                           str(script)])
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    return run, json.loads(trace.read_text()), stats_from_trace(str(trace))


def spans(data: dict, name: str) -> list[dict]:
    return sorted((e for e in data["traceEvents"] if e["ph"] == "X" and e["name"] == name),
                  key=lambda e: e["ts"])


def inside(data: dict, outer: dict, name: str) -> list[dict]:
    """The ``name`` ranges of ``data`` within ``outer`` (same thread)."""
    return [e for e in spans(data, name) if e["tid"] == outer["tid"]
            and outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]]


def nvtx_iterations(run) -> list[int]:
    """The depth of every NVTX ``iteration`` range (the stream balanced, or this raises)."""
    ranges = ranges_by_thread(run.events, "chainer")
    return [depth for thread in ranges.values() for depth, text, _ in thread
            if text == "iteration"]


def counted(stderr: str) -> tuple[int, int]:
    m = re.search(r"iterations\s+(\d+) counted, (\d+) warm-up", stderr)
    assert m, stderr
    return int(m.group(1)), int(m.group(2))


def summary_verdict(stderr: str) -> str:
    m = re.search(r"^Verdict: ([a-z-]+)", stderr, re.M)
    assert m, stderr
    return m.group(1)


# -- item 5: the Trainer, then the test set by hand -----------------------------------------

TRAINER_THEN_EVALUATION = program("loops_trainer_then_evaluation")

EVALUATIONS = {
    "test-mode": "with chainer.using_config('train', False):\n    model(x, t)",
    "no-backprop": "with chainer.no_backprop_mode():\n    model(x, t)",
    "train-mode": "model(x, t)",
    "with-backward": "model.cleargrads()\nmodel(x, t).backward()  # gradients by hand, no update",
    "batches": ("for batch in chainer.iterators.SerialIterator(test, 64, repeat=False, "
                "shuffle=False):\n    model(*concat_examples(batch))"),
}


@pytest.mark.parametrize("evaluation", sorted(EVALUATIONS))
def test_evaluation_after_trainer_run_is_no_iteration(tmp_path, evaluation):
    run, data, stats = run_script(
        tmp_path, TRAINER_THEN_EVALUATION.format(evaluate=EVALUATIONS[evaluation]))
    assert len(spans(data, "iteration")) == 20
    assert nvtx_iterations(run) == [0] * 20
    assert counted(run.stderr) == (17, 3)
    assert (stats.iterations, stats.warmup) == (17, 3)
    assert "iteration 20" not in run.stderr  # no 21st iteration among the slowest
    # what ran after the Trainer is after the last iteration, not between iterations
    last = spans(data, "iteration")[-1]
    assert all(e["ts"] >= last["ts"] + last["dur"] for e in spans(data, "inference"))
    assert set(stats.outside_ms) <= {"startup", "warm-up", "idle", "shutdown",
                                     "extension:LogReport", "agent"}  # (its own checks)
    assert vd.decide(stats).kind != "extension-bound"


# -- item 6: loops of the program's own --------------------------------------------------------

GAN = program("loops_gan")

GAN_STEPS = {
    # the discriminator, then the generator, with backward and update by hand
    "iterator": """
    x = concat_examples(next(it))
    fake = gen(z())
    loss_dis = F.sum(F.softplus(dis(fake))) + F.sum(F.softplus(-dis(x)))
    dis.cleargrads()
    loss_dis.backward()
    opt_dis.update()
    loss_gen = F.sum(F.softplus(-dis(fake)))
    gen.cleargrads()
    loss_gen.backward()
    opt_gen.update()
""",
    # no iterator; each optimizer with a loss function; the fake batch made without backprop
    "lossfun": """
    x = real[step * 32:(step + 1) * 32]
    with chainer.no_backprop_mode():
        fake = gen(z())
    opt_dis.update(lambda: F.sum(F.softplus(dis(fake))) + F.sum(F.softplus(-dis(x))))
    opt_gen.update(lambda: F.sum(F.softplus(-dis(gen(z())))))
""",
    # the generator first, then the discriminator, one loss function each
    "generator-first": """
    x = concat_examples(it.next())
    opt_gen.update(lambda: F.sum(F.softplus(-dis(gen(z())))))
    fake = gen(z())
    fake.unchain_backward()
    opt_dis.update(lambda: F.sum(F.softplus(dis(fake))) + F.sum(F.softplus(-dis(x))))
""",
}


@pytest.mark.parametrize("shape", sorted(GAN_STEPS))
def test_two_optimizers_per_step_are_one_iteration(tmp_path, shape):
    run, data, _ = run_script(tmp_path, GAN.format(step=GAN_STEPS[shape]))
    iterations = spans(data, "iteration")
    assert len(iterations) == 12
    assert [len(inside(data, it, "update")) for it in iterations] == [2] * 12
    assert nvtx_iterations(run) == [0] * 12
    assert counted(run.stderr) == (9, 3)


THREE_OPTIMIZERS = program("loops_three_optimizers")


def test_one_optimizer_per_part_of_a_model_is_one_iteration_a_step(tmp_path):
    run, data, _ = run_script(tmp_path, THREE_OPTIMIZERS)
    iterations = spans(data, "iteration")
    assert [len(inside(data, it, "update")) for it in iterations] == [3] * 10
    assert nvtx_iterations(run) == [0] * 10


MANUAL_THEN_ONE_CALL = program("loops_manual_then_one_call")

UPDATES = {
    "backward": "    loss = model(x, t)\n    model.cleargrads()\n    loss.backward()\n"
                "    optimizer.update()",
    "lossfun": "    optimizer.update(model, x, t)",
}
AFTER = {
    "train-mode call": "x, t = concat_examples(test)\nmodel(x, t)",
    "test-mode call": ("with chainer.using_config('train', False):\n"
                       "    model(*concat_examples(test))"),
    "epoch of batches": ("for batch in chainer.iterators.SerialIterator(test, 64, repeat=False):"
                         "\n    model(*concat_examples(batch))"),
}


@pytest.mark.parametrize("after", sorted(AFTER))
@pytest.mark.parametrize("update", sorted(UPDATES))
def test_a_manual_loop_then_a_model_call_counts_the_steps(tmp_path, update, after):
    run, data, stats = run_script(
        tmp_path, MANUAL_THEN_ONE_CALL.format(update=UPDATES[update], after=AFTER[after]))
    assert len(spans(data, "iteration")) == 12
    assert counted(run.stderr) == (9, 3)
    assert (stats.iterations, stats.warmup) == (9, 3)
    nvtx_iterations(run)  # balanced
    # the call after the loop: outside every iteration, after the last one
    assert "inference" not in stats.outside_ms and names.NO_UPDATE not in stats.outside_ms
    last = spans(data, "iteration")[-1]
    after_loop = spans(data, names.NO_UPDATE) + spans(data, "inference")
    assert after_loop and all(e["ts"] >= last["ts"] + last["dur"] for e in after_loop)


def test_a_step_cut_short_by_the_end_still_counts(tmp_path):
    """As an updater's: the program's end inside a step's data loading (an exception here)."""
    body = program("loops_step_cut_short")
    run, data, _ = run_script(tmp_path, body)
    assert len(spans(data, "iteration")) == 6  # 5 steps done, the 6th stopped in data
    assert counted(run.stderr) == (3, 3)


EVALUATION_BETWEEN_EPOCHS = program("loops_evaluation_between_epochs")


def test_evaluation_between_epochs_stays_out_of_the_next_step(tmp_path):
    run, data, stats = run_script(tmp_path, EVALUATION_BETWEEN_EPOCHS)
    iterations = spans(data, "iteration")
    assert len(iterations) == 24
    assert all(not inside(data, it, "inference") for it in iterations)
    assert max(it["dur"] for it in iterations) < 90_000  # none holds a 100 ms evaluation
    assert stats.outside_ms["inference"] >= 200  # the two between epochs; the third after
    assert "inference took" not in run.stderr


# -- item 7: F.forget: the forward runs again inside the backward -------------------------------

FORGET = program("loops_forget")

FORGET_STEPS = {
    "lossfun": "    optimizer.update(model, x, t)",
    "backward": ("    loss = model(x, t)\n    model.cleargrads()\n    loss.backward()\n"
                 "    optimizer.update()"),
    "chainer.backward": ("    loss = model(x, t)\n    model.cleargrads()\n"
                         "    loss.grad = np.ones_like(loss.array)\n"
                         "    chainer.backward([loss])\n    optimizer.update()"),
}


@pytest.mark.parametrize("granularity", ["link", "function"])
@pytest.mark.parametrize("step", sorted(FORGET_STEPS))
def test_forget_recomputing_in_backward_opens_no_iteration(tmp_path, step, granularity):
    run, data, stats = run_script(tmp_path, FORGET.format(step=FORGET_STEPS[step]),
                                  "--granularity", granularity)
    assert nvtx_iterations(run) == [0] * 12  # balanced, each iteration at depth 0
    iterations = spans(data, "iteration")
    assert len(iterations) == 12
    for it in iterations:
        backward = inside(data, it, "backward")
        assert len(backward) == 1
        # the recomputation's backward stays inside the backward of its link
        recomputed = inside(data, backward[0], "l1 (Linear) backward")
        owner = inside(data, backward[0], "predictor (Forgetful) backward") if granularity \
            == "function" else inside(data, backward[0], "predictor/l2 (Linear) backward")
        assert recomputed and owner
        assert all(any(o["ts"] <= r["ts"] and r["ts"] + r["dur"] <= o["ts"] + o["dur"]
                       for o in owner) for r in recomputed)
    assert counted(run.stderr) == (9, 3)
    assert 0 < stats.phase_share("backward") < 1
    share = re.search(r"^\s+backward\s+\S+ \S+\s+([\d.]+)%\s+([\d.]+)%", run.stderr, re.M)
    assert share and float(share.group(1)) < 100 and float(share.group(2)) < 100


# -- item 8: time after the last iteration is not between iterations ---------------------------

SLOW_EVALUATION = program("loops_slow_evaluation")

TRAININGS = {
    "manual": ("it = chainer.iterators.SerialIterator(train, 16)\nfor step in range(20):\n"
               "    optimizer.update(model, *concat_examples(next(it)))"),
    "trainer": ("it = chainer.iterators.SerialIterator(train, 16)\n"
                "training.Trainer(training.updaters.StandardUpdater(it, optimizer), "
                "(20, 'iteration')).run()"),
}


@pytest.mark.parametrize("training", sorted(TRAININGS))
def test_evaluation_after_the_last_iteration_is_not_extension_bound(tmp_path, training):
    before = ("with chainer.using_config('train', False):\n"
              "    model(X[320:384], Y[320:384])  # an evaluation before training, too")
    run, data, stats = run_script(tmp_path, SLOW_EVALUATION.format(
        before=before, train=TRAININGS[training]))
    assert len(spans(data, "inference")) == 6
    assert counted(run.stderr) == (17, 3)
    assert "inference" not in stats.outside_ms  # nothing ran between iterations
    assert stats.outside_ms["shutdown"] >= 250  # the five slow batches after the last one
    assert stats.outside_ms["startup"] >= 50  # the one before the first
    # between iterations there is at most the loop's own code (idle), whatever the verdict
    assert set(vd.extension_ms(stats)) <= {"idle"}
    verdict = run.stderr.split("Verdict:")[1]
    assert "inference" not in verdict and "less often" not in verdict


def test_evaluation_between_iterations_still_counts_as_between(tmp_path):
    body = """
it = chainer.iterators.SerialIterator(train, 16)
for step in range(20):
    optimizer.update(model, *concat_examples(next(it)))
    with chainer.using_config("train", False):
        time.sleep(0.01)
        model(X[320:384], Y[320:384])
"""
    run, _, stats = run_script(tmp_path, body)
    assert stats.outside_ms["inference"] > 0  # 19 between; the 20th after the last one
    assert summary_verdict(run.stderr) == "extension-bound"


@pytest.mark.parametrize("annotated", [False, True])
def test_time_between_iterations_with_no_range_is_not_blamed_on_extensions(tmp_path, annotated):
    """A manual loop's own code between iterations (here a wait) makes the run extension-bound;
    with no extension, the advice points at that code, not at running extensions less often;
    a range of the user's own around it is named and advised like an extension."""
    wait = ('    with chainer_autoprof.annotate("log"):\n        time.sleep(0.02)\n'
            if annotated else "    time.sleep(0.02)\n")
    body = ("import chainer_autoprof\n"
            "it = chainer.iterators.SerialIterator(train, 16)\nfor step in range(20):\n"
            "    optimizer.update(model, *concat_examples(next(it)))\n" + wait)
    run, _, stats = run_script(tmp_path, body)
    assert summary_verdict(run.stderr) == "extension-bound"
    verdict = run.stderr.split("Verdict:")[1].split("\n\n")[0]
    if annotated:
        assert set(vd.extension_ms(stats)) >= {"user:log"}
        assert "run user:log less often" in verdict, verdict
    else:
        assert set(vd.extension_ms(stats)) == {"idle"}
        assert "less often" not in verdict
        assert "the loop's own code" in verdict and "annotate" in verdict


# -- item 9: a capture window the run never reached ----------------------------------------------

def test_a_window_never_reached_says_how_far_the_run_got(tmp_path):
    body = """
it = chainer.iterators.SerialIterator(train, 16)
for step in range(20):
    optimizer.update(model, *concat_examples(next(it)))
"""
    run, _, _ = run_script(tmp_path, body, "--iterations", "100:200")
    lines = run.stderr[run.stderr.index(HEADER):]
    assert "no Chainer training" not in lines
    assert "capture window  100:200 never reached: the run ended after 20 iterations (0-19)" \
        in lines
    assert "=> nothing was recorded: the capture window 100:200 was never reached; the run " \
           "ended after 20 iterations (0-19)." in lines
    # the same from the trace
    report = run_python(tmp_path, ["-m", "chainer_autoprof", "report",
                                   str(tmp_path / "run.json")], nvtx=False)
    assert report.returncode == 0, report.stderr
    assert "the capture window 100:200 was never reached; the run ended after 20 iterations" \
        in report.stdout + report.stderr

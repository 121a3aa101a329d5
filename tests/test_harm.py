"""Never harm the training: same results, serializable models, nothing kept, errors contained."""

from __future__ import annotations

import itertools
from pathlib import Path

from streams import GRANULARITIES, check_stream
from support import EXAMPLES, TRAINER_ARGS, program, run_python, run_with_agent, write_script

LEVELS = (0, 1, 2, 3)

LOSSES_PROGRAM = program("harm_losses")


def test_same_losses_at_every_sync_level_and_granularity(tmp_path: Path):
    configs = [f"{level}:{g}" for level, g in itertools.product(LEVELS, GRANULARITIES)]
    script = write_script(tmp_path, "losses.py", LOSSES_PROGRAM)
    run = run_python(tmp_path, [str(script), *configs], check=True)
    lines = run.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["none", *configs]
    baseline = lines[0].split(" ", 1)[1]
    assert len(baseline.split()) == 6 + 4  # the program did train
    for line in lines[1:]:
        assert line.split(" ", 1)[1] == baseline, line
    check_stream(run.events)
    assert run.stderr == ""


def test_trainer_output_unchanged(tmp_path: Path):
    """The example's printed report, byte for byte, with the agent at its busiest."""
    args = [str(EXAMPLES / "train_mnist_synthetic.py"), *TRAINER_ARGS, "--out", "r"]
    plain = run_python(tmp_path / "plain", args, nvtx=False, count_device=False,
                       cwd=_mkdir(tmp_path / "plain"))
    source = (EXAMPLES / "train_mnist_synthetic.py").read_text()
    profiled = run_with_agent(_mkdir(tmp_path / "agent"), source,
                              {"CHAINER_PROF_GRANULARITY": "function",
                               "CHAINER_PROF_SYNC_LEVEL": "3"},
                              script_args=(*TRAINER_ARGS, "--out", "r"))
    assert plain.returncode == profiled.returncode == 0, profiled.stderr
    assert "main/loss" in plain.stdout
    assert profiled.stdout == plain.stdout
    assert profiled.stderr == plain.stderr == ""


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


SERIALIZE_PROGRAM = program("harm_serialize")


def test_models_stay_serializable_and_nothing_is_kept(tmp_path: Path):
    run = run_with_agent(tmp_path, SERIALIZE_PROGRAM, {"CHAINER_PROF_GRANULARITY": "function"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "alive after iteration: 0",
        "pickle mentions agent: False",
        "pickle round trip: True",
        "pickled optimizer mentions agent: False",
        "deepcopy: True Old",
        "deepcopy predicts the same: True",
        "Link.copy shares: True",
        "npz keys: predictor/bn/N predictor/bn/avg_mean predictor/bn/avg_var predictor/bn/beta "
        "predictor/bn/gamma predictor/l1/W predictor/l1/b predictor/l2/W predictor/l2/b",
        "load_npz: True",
        "snapshot keys mention agent: False",
        "snapshot has the model: True",
        "model freed: True",
        "link entries left: 0",
    ]
    check_stream(run.events)
    assert run.tree()[:2] == ["iteration", "  data"]  # the agent was on


ERRORS_PROGRAM = program("harm_errors")


def test_agent_errors_are_contained(tmp_path: Path):
    """An error in a hook: reported once on stderr, that hook off, training unchanged."""
    baseline = run_with_agent(_mkdir(tmp_path / "off"), ERRORS_PROGRAM,
                              {"CHAINER_PROF_ENABLE": "0"}, script_args=("tracer",))
    assert baseline.returncode == 0, baseline.stderr
    assert len(baseline.stdout.splitlines()) == 8 and baseline.stderr == ""

    # every hook that opens a phase fails on its first call after the injection
    run = run_with_agent(_mkdir(tmp_path / "tracer"), ERRORS_PROGRAM, script_args=("tracer",))
    assert run.returncode == 0, run.stderr
    assert run.stdout == baseline.stdout
    errors = [line for line in run.stderr.splitlines() if "internal error" in line]
    assert sorted(e.split(" hook")[0].rsplit(" ", 1)[1] for e in errors) == \
        ["Link.__call__", "Optimizer.update", "Variable.backward"]
    assert all("RuntimeError: injected" in e for e in errors)
    status = dict(line.split(" ", 1) for line in run.stderr.splitlines()
                  if not line.startswith("chainer_autoprof:"))
    for label in ("Link.__call__", "Optimizer.update", "Variable.backward"):
        assert status[label] == "failed False"
    assert status["Updater.update"] == "patched True"
    check_stream(run.events)
    assert run.tree()[:4] == ["iteration", "  forward", "  backward", "  update"]

    # one hook only
    run = run_with_agent(_mkdir(tmp_path / "entry"), ERRORS_PROGRAM, script_args=("entry",))
    assert run.returncode == 0, run.stderr
    assert run.stdout == baseline.stdout
    errors = [line for line in run.stderr.splitlines() if line.startswith("chainer_autoprof:")]
    assert errors == ["chainer_autoprof: internal error in the Link.__call__ hook "
                      "(RuntimeError: injected); that hook is now off, training goes on"]
    check_stream(run.events)
    # the other hooks go on: no forward phase from link calls, but still the one that
    # Optimizer.update(lossfun) opens around the loss function
    assert run.tree() == ["iteration", "  backward", "  update",
                          "iteration", "  forward", "  backward", "  update"] * 4


def test_failing_sink_in_an_extension_range(tmp_path: Path):
    """A sink failing to begin a range: nothing left open, and training stays training."""
    source = program("harm_failing_sink_in_an_extension")
    run = run_with_agent(tmp_path, source)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "3\n"
    assert run.stderr == ("chainer_autoprof: internal error in the Extension.__call__ hook "
                          "(RuntimeError: sink failed); that hook is now off, training goes on\n")
    check_stream(run.events)
    iteration = ["iteration", "  data", "  data", "  forward", "  backward", "  update"]
    # NVTX had begun the first extension range when the sink failed: it ends at once
    assert run.tree() == iteration + ["extension:Every"] + iteration * 2

"""Never harm the training: same results, serializable models, nothing kept, errors contained."""

from __future__ import annotations

import itertools
from pathlib import Path

from support import EXAMPLES, run_python, run_with_agent, write_script
from test_ranges import GRANULARITIES, TRAINER_ARGS, check_stream

LEVELS = (0, 1, 2, 3)

LOSSES_PROGRAM = r'''
import sys

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L

import chainer_autoprof


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 5)
            self.l2 = L.Linear(5, 2)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def train():
    """Losses and final weights of a custom loop and of optimizer.update(lossfun)."""
    np.random.seed(0)
    x = np.random.rand(8, 3).astype(np.float32)
    t = np.random.randint(0, 2, 8).astype(np.int32)
    model = L.Classifier(MLP())
    opt = chainer.optimizers.Adam()
    opt.setup(model)
    out = []
    for i in range(3):
        loss = model(x[i::2], t[i::2])
        model.cleargrads()
        loss.backward()
        opt.update()
        out.append(repr(float(loss.array)))
        opt.update(model, x, t)
        out.append(repr(float(model.loss.array)))
    out += [repr(float(p.array.sum())) for _, p in sorted(model.namedparams())]
    return " ".join(out)


print("none", train())
for config in sys.argv[1:]:
    level, granularity = config.split(":")
    chainer_autoprof.install(sync_level=int(level), granularity=granularity, summary=False)
    print(config, train())
    chainer_autoprof.uninstall()
'''


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


SERIALIZE_PROGRAM = r'''
import copy
import gc
import pickle
import sys
import weakref
import zipfile

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.training import extensions


class Old(chainer.Chain):
    """Old style: its own __call__ is wrapped by the agent."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 4)
            self.bn = L.BatchNormalization(4)
            self.l2 = L.Linear(4, 2)

    def __call__(self, x):
        return self.l2(F.relu(self.bn(self.l1(x))))


def weights(link):
    return [(name, p.array.copy()) for name, p in sorted(link.namedparams())]


def same(a, b):
    return [n for n, _ in a] == [n for n, _ in b] and all(
        np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))


x = np.arange(24, dtype=np.float32).reshape(8, 3) / 10
t = np.array([0, 1] * 4, np.int32)
model = L.Classifier(Old())
optimizer = chainer.optimizers.MomentumSGD()
optimizer.setup(model)
it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 4)
trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer), (2, "iteration"))
trainer.extend(extensions.snapshot(), trigger=(2, "iteration"))
trainer.run()

# no reference to arrays or Variables kept: they die with the iteration
xa = x.copy()
xv = chainer.Variable(xa)
loss = F.softmax_cross_entropy(model.predictor(xv), t)  # (Classifier would keep it)
model.cleargrads()
loss.backward()
optimizer.update()
refs = [weakref.ref(o) for o in (xa, xv, loss, loss.creator_node)]
del xa, xv, loss
gc.collect()
print("alive after iteration:", sum(r() is not None for r in refs))

data = pickle.dumps(model)
print("pickle mentions agent:", b"chainer_autoprof" in data)
print("pickle round trip:", same(weights(pickle.loads(data)), weights(model)))
print("pickled optimizer mentions agent:", b"chainer_autoprof" in pickle.dumps(optimizer))
clone = copy.deepcopy(model)
print("deepcopy:", same(weights(clone), weights(model)), type(clone.predictor).__name__)
with chainer.using_config("train", False):
    print("deepcopy predicts the same:",
          np.array_equal(clone.predictor(x).array, model.predictor(x).array))
shared = model.copy()
print("Link.copy shares:", shared.predictor.l1.W.array is model.predictor.l1.W.array)
chainer.serializers.save_npz("model.npz", model)
keys = sorted(np.load("model.npz").files)
print("npz keys:", " ".join(keys))
fresh = L.Classifier(Old())
fresh(x, t)  # the same shapes
chainer.serializers.load_npz("model.npz", fresh)
print("load_npz:", same(weights(fresh), weights(model)))
snapshot = np.load("result/snapshot_iter_2")
print("snapshot keys mention agent:", any("autoprof" in k for k in snapshot.files))
print("snapshot has the model:", "updater/model:main/predictor/l1/W" in snapshot.files)
gone = weakref.ref(model)
del model, clone, shared, fresh, optimizer, trainer, it
gc.collect()
print("model freed:", gone() is None)
import chainer_autoprof.agent as agent_module

link_entries = agent_module.current().patches.entries
for _ in range(50):  # links made on the fly: nothing of them piles up
    L.Linear(3, 2)(x)
gc.collect()
print("link entries left:", len(link_entries))
'''


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


ERRORS_PROGRAM = r'''
import sys

import numpy as np

import chainer_autoprof.agent as agent_module
import chainer_autoprof.patches.chainer as chainer_patches


def broken(*args, **kwargs):
    raise RuntimeError("injected")


if sys.argv[1] == "entry" and agent_module.current() is not None:
    chainer_patches.ChainerPatches._entry = broken  # before Chainer is instrumented

import chainer  # noqa: E402
import chainer.links as L  # noqa: E402

np.random.seed(0)
x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)
model = L.Classifier(L.Linear(3, 2))
opt = chainer.optimizers.SGD()
opt.setup(model)
for i in range(4):
    if i == 1 and sys.argv[1] == "tracer" and agent_module.current() is not None:
        agent_module.current().tracer.begin_phase = broken
    loss = model(x, t)
    model.cleargrads()
    loss.backward()
    opt.update()
    print(repr(float(loss.array)))
    opt.update(model, x, t)
    print(repr(float(model.loss.array)))
agent = agent_module.current()
if agent is not None:
    for patch in agent.patches.patches:
        print(patch.label, patch.status, patch.on, file=sys.stderr)
'''


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
    source = r'''
import numpy as np
import chainer
import chainer.links as L
from chainer import training

import chainer_autoprof.agent as agent_module


class FailingSink:
    def prepare(self, info):
        pass

    def begin(self, info, ts):
        if info.category == "extension":
            raise RuntimeError("sink failed")

    def end(self, info, t0, t1, ts):
        pass

    def close(self, tracer):
        pass


agent_module.current().tracer.add_sink(FailingSink())  # after NVTX: NVTX has pushed


class Every(training.Extension):
    trigger = (1, "iteration")

    def __call__(self, trainer):
        pass


x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)
model = L.Classifier(L.Linear(3, 2))
opt = chainer.optimizers.SGD()
opt.setup(model)
it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 2)
trainer = training.Trainer(training.updaters.StandardUpdater(it, opt), (3, "iteration"))
trainer.extend(Every())
trainer.run()
print(trainer.updater.iteration)
'''
    run = run_with_agent(tmp_path, source)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "3\n"
    assert run.stderr == ("chainer_autoprof: internal error in the Extension.__call__ hook "
                          "(RuntimeError: sink failed); that hook is now off, training goes on\n")
    check_stream(run.events)
    iteration = ["iteration", "  data", "  data", "  forward", "  backward", "  update"]
    # NVTX had begun the first extension range when the sink failed: it ends at once
    assert run.tree() == iteration + ["extension:Every"] + iteration * 2

"""Run generated programs against real Chainer, one after another, in one process.

Used by ``test_state_machine.py``: ``python state_machine_driver.py PROGRAMS.json
MODE`` with MODE ``plain`` (no agent) or ``agent`` (installed from here, with
the originals of every patched attribute noted first).  Each program is a
list of operations (see the test for their meaning); for each, one line of
results goes to stdout (losses, outputs and parameter sums, exceptions by
type), and in ``agent`` mode an NVTX mark ``program N`` in the ``driver``
domain on the main thread marks where it ended.  Whatever goes wrong in the
agent's bookkeeping must show as an unbalanced NVTX stream, a changed result
or a line on stderr.
"""

from __future__ import annotations

import json
import sys
import threading

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training

import chainer_autoprof


class PlannedError(Exception):
    """The exception a program raises on purpose."""


RAISE_AT: set[str] = set()  # where the current operation raises: "forward", "loss", "lossfun"


class Block(chainer.Chain):
    """New style: ``forward``, nested links, an optional raise inside."""

    def __init__(self, depth: int):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 3)
            self.inner = Block(depth - 1) if depth > 1 else L.Linear(3, 3)

    def forward(self, x):
        if "forward" in RAISE_AT:
            raise PlannedError("forward")
        return self.inner(F.relu(self.l1(x)))


class OldStyle(chainer.Chain):
    """Old style: its own ``__call__``, calling a link twice and itself once."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.fc = L.Linear(3, 3)

    def __call__(self, x, again=True):
        h = self.fc(F.tanh(self.fc(x)))
        return self(h, again=False) if again else h


class Net(chainer.Chain):
    def __init__(self, kind: str, depth: int):
        super().__init__()
        with self.init_scope():
            self.body = OldStyle() if kind == "old" else Block(depth)
            self.head = L.Linear(3, 2)

    def forward(self, x):
        return self.head(self.body(x))


def make(kind: str, depth: int):
    model = L.Classifier(Net(kind, depth))
    optimizer = chainer.optimizers.MomentumSGD(lr=0.01)
    optimizer.setup(model)
    return model, optimizer


def data(seed: int):
    rng = np.random.RandomState(seed)
    return rng.randn(4, 3).astype(np.float32), rng.randint(0, 2, 4).astype(np.int32)


def params(model) -> str:
    return " ".join(f"{float(p.array.sum()):.9g}" for _, p in sorted(model.namedparams()))


def run_op(op: list, model, optimizer, out: list, seed: int) -> None:
    kind, *rest = op
    x, t = data(seed)
    RAISE_AT.clear()
    if kind in ("manual", "lossfun", "grad", "updater") and rest and rest[-1]:
        RAISE_AT.add(rest[-1])
    try:
        if kind == "manual":
            loss = model(x, t)
            model.cleargrads()
            if "loss" in RAISE_AT:
                raise PlannedError("loss")
            loss.backward()
            optimizer.update()
            out.append(f"{float(loss.array):.9g}")
        elif kind == "lossfun":
            def lossfun(a, b):
                if "lossfun" in RAISE_AT:
                    raise PlannedError("lossfun")
                return model(a, b)
            optimizer.update(lossfun, x, t)
            out.append(f"{float(model.loss.array):.9g}")
        elif kind == "grad":
            loss = model(x, t)
            grads = chainer.grad([loss], [model.predictor.head.W])
            out.append(f"{float(grads[0].array.sum()):.9g}")
        elif kind == "updater":
            it = chainer.iterators.SerialIterator(
                chainer.datasets.TupleDataset(x, t), 2, shuffle=False)
            updater = training.updaters.StandardUpdater(it, optimizer)
            for _ in range(rest[0]):
                updater.update()
            out.append(f"{float(model.loss.array):.9g}")
        elif kind == "eval":
            mode = rest[0]
            if mode == "test":
                with chainer.using_config("train", False):
                    y = model.predictor(x)
            elif mode == "nobackprop":
                with chainer.no_backprop_mode():
                    y = model.predictor(x)
            else:  # a forward in training mode that is never backpropagated
                y = model.predictor(x)
            out.append(f"{float(y.array.sum()):.9g}")
        elif kind == "annotate":
            name, body = rest
            with chainer_autoprof.annotate(name):
                for sub in body:
                    run_op(sub, model, optimizer, out, seed + 1)
        elif kind == "thread":
            errors: list = []

            def work():
                try:
                    np.random.seed(seed)  # the initial weights
                    sub_model, sub_opt = make("new", 1)
                    sub_out: list = []
                    for sub in rest[0]:
                        run_op(sub, sub_model, sub_opt, sub_out, seed + 2)
                    out.append("thread[" + " ".join(sub_out) + "]")
                except BaseException as exc:  # reported in the results
                    errors.append(exc)

            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
            if errors:
                raise errors[0]
        elif kind == "trainer":
            steps, fail = rest
            it = chainer.iterators.SerialIterator(
                chainer.datasets.TupleDataset(x, t), 2, shuffle=False)
            updater = training.updaters.StandardUpdater(it, optimizer)
            trainer = training.Trainer(updater, (steps, "iteration"), out="/tmp")

            @training.make_extension(trigger=(1, "iteration"))
            def look(trainer):  # evaluation by hand inside an extension
                with chainer.using_config("train", False):
                    out.append(f"{float(model.predictor(x).array.sum()):.9g}")
                if fail:
                    raise PlannedError("extension")

            trainer.extend(look)
            trainer.run(show_loop_exception_msg=False)  # the same stderr either way
            out.append(f"{float(model.loss.array):.9g}")
        elif kind == "left open":  # entered by hand and never exited (ends with its thread)
            chainer_autoprof.annotate("left open").__enter__()
            loss = model(x, t)
            out.append(f"{float(loss.array):.9g}")
        elif kind == "raise":
            with chainer_autoprof.annotate("about to fail"):
                raise PlannedError("raise")
        else:
            raise AssertionError(f"unknown operation {kind}")
    except PlannedError as exc:
        out.append(f"PlannedError({exc})")
    finally:
        RAISE_AT.clear()


# -- the agent: install, exact unwrap ----------------------------------------------------
TARGETS = [
    (chainer.Link, "__call__"), (chainer.Optimizer, "update"),
    (chainer.optimizer.GradientMethod, "update"), (chainer.Variable, "backward"),
    (chainer.function_node.FunctionNode, "apply"), (training.Updater, "update"),
    (training.updaters.StandardUpdater, "update"), (OldStyle, "__call__"),
    (chainer.function_node, "grad"), (chainer, "grad"),
    (chainer.dataset.iterator.Iterator, "__next__"),
    (chainer.iterators.SerialIterator, "__next__"), (chainer.iterators.SerialIterator, "next"),
]


def attributes() -> list:
    return [(owner, name, getattr(owner, "__dict__", {}).get(name)) for owner, name in TARGETS]


def install(settings: dict) -> None:
    chainer_autoprof.install(summary=False, **settings)


def uninstall_exactly(originals: list) -> str:
    chainer_autoprof.uninstall()
    changed = [f"{getattr(owner, '__name__', owner)}.{name}"
               for owner, name, value in originals
               if getattr(owner, "__dict__", {}).get(name) is not value]
    return "unwrap ok" if not changed else "unwrap changed " + ",".join(changed)


def main() -> None:
    programs = json.loads(open(sys.argv[1]).read())
    agent = sys.argv[2] == "agent"
    originals = attributes()
    domain = None
    if agent:
        import nvtx

        domain = nvtx.get_domain("driver")
    for n, program in enumerate(programs):
        settings, ops = program["settings"], program["ops"]
        if agent:
            install(settings)
        np.random.seed(n)  # the initial weights
        model, optimizer = make(program["model"], program["depth"])
        out: list = []
        for k, op in enumerate(ops):
            if op == ["reinstall"]:
                if agent:
                    out.append(uninstall_exactly(originals))
                    install(settings)
                else:
                    out.append("unwrap ok")
                continue
            run_op(op, model, optimizer, out, seed=1000 * n + k)
        out.append(params(model))
        if agent:
            out.append(uninstall_exactly(originals))
            domain.mark(domain.get_event_attributes(message=f"program {n}"))
        else:
            out.append("unwrap ok")
        print(f"{n}: " + " | ".join(out), flush=True)


if __name__ == "__main__":
    main()

"""The three CPU workloads, each timed per step.

* ``mlp`` -- an MNIST-sized MLP (784-1000-1000-10, batch 100) under
  ``L.Classifier``: one ``optimizer.update(model, x, t)`` training step.
* ``deep`` -- 50 small ``Linear`` layers (16 wide, batch 1): one training step,
  the worst case for a per-link cost.
* ``link`` -- one Link call: an outer Chain calls a ``Linear(4, 4)`` on a
  batch of 1 ``LINK_CALLS`` times; the time per Link call is the outer call's
  time over ``LINK_CALLS + 1`` (the outer link is a Link call too).

Import this module only after the configuration is applied (it imports
Chainer, and the agent instruments Chainer when it is imported).
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any, Callable

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

LINK_CALLS = 100


class MLP(chainer.Chain):
    def __init__(self, n_in: int = 784, n_units: int = 1000, n_out: int = 10) -> None:
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


class DeepNarrow(chainer.ChainList):
    def __init__(self, depth: int = 50, width: int = 16) -> None:
        super().__init__(*[L.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        for layer in self:
            x = F.relu(layer(x))
        return x


class DeepLoss(chainer.Chain):
    """The deep network and a scalar loss, so that ``optimizer.update(model, x)`` trains it."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.net = DeepNarrow()

    def forward(self, x):
        return F.sum(self.net(x))


class Repeat(chainer.Chain):
    """Calls one small ``Linear`` ``LINK_CALLS`` times."""

    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.inner = L.Linear(4, 4)

    def forward(self, x):
        inner = self.inner
        for _ in range(LINK_CALLS):
            y = inner(x)
        return y


def _seeded() -> np.random.RandomState:
    np.random.seed(0)
    return np.random.RandomState(0)


def build(name: str, make_optimizer: Callable[[Any, Any], Any] | None) -> Callable[[], Any]:
    """A zero-argument step function for workload ``name``."""
    rng = _seeded()
    opt = chainer.optimizers.SGD(lr=1e-3)
    if name == "mlp":
        model = L.Classifier(MLP())
        x = rng.rand(100, 784).astype(np.float32)
        t = rng.randint(0, 10, size=100).astype(np.int32)
        args: tuple = (x, t)
    elif name == "deep":
        model = DeepLoss()
        args = (rng.rand(1, 16).astype(np.float32),)
    elif name == "link":
        model = Repeat()
        x = rng.rand(1, 4).astype(np.float32)
        if make_optimizer is not None:
            make_optimizer(opt, model)
        return lambda: model(x)
    else:
        raise ValueError(f"unknown workload {name!r}")
    if make_optimizer is not None:
        opt = make_optimizer(opt, model)
    else:
        opt.setup(model)
    update = opt.update
    return lambda: update(model, *args)


def timed(step: Callable[[], Any], n: int) -> list[int]:
    """Wall time (ns) of each of ``n`` calls of ``step``."""
    samples = []
    for _ in range(n):
        t0 = perf_counter_ns()
        step()
        samples.append(perf_counter_ns() - t0)
    return samples


def unit(name: str) -> int:
    """How many units one step of ``name`` is (Link calls for ``link``)."""
    return LINK_CALLS + 1 if name == "link" else 1




#: Link calls in one step of ``train50``: the ChainList and its 50 layers.
TRAIN50_LINK_CALLS = 51


def build_train50() -> Callable[[], Any]:
    """One training step of 50 ``Linear(16, 16)`` + ReLU, batch 1, written out by hand.

    Forward, ``F.sum`` loss, ``cleargrads``, backward, SGD update: 51 Link
    calls (the ChainList and its 50 layers).
    """
    rng = _seeded()
    net = DeepNarrow()
    opt = chainer.optimizers.SGD(lr=1e-3)
    opt.setup(net)
    x = rng.rand(1, 16).astype(np.float32)

    def step() -> None:
        loss = F.sum(net(x))
        net.cleargrads()
        loss.backward()
        opt.update()

    return step

"""Links whose ``__call__`` is no plain function: defined after the agent wrapped Link (under
the launcher), or before it (``install TRACE``: the program installs the agent itself once its
classes exist)."""

import functools
import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np


class Scaled(chainer.Chain):
    """``__call__`` a functools.partialmethod."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(4, 4)

    def _forward(self, x, scale):
        return self.l(x) * scale

    __call__ = functools.partialmethod(_forward, scale=2.0)


class _Apply:
    """A callable object: Python calls it without the instance."""

    def __call__(self, x):
        return F.tanh(x)


class Plain(chainer.Link):
    """``__call__`` a callable object."""

    __call__ = _Apply()


class Static(chainer.Link):
    """``__call__`` a staticmethod."""

    @staticmethod
    def __call__(x):
        return F.relu(x)


class ByClass(chainer.Link):
    """``__call__`` a classmethod."""

    @classmethod
    def __call__(cls, x):
        return F.sigmoid(x)


class _Bind:
    """A descriptor of its own: binds the instance's ``run``."""

    def __get__(self, instance, owner):
        return owner.run.__get__(instance, owner) if instance is not None else self


class Described(chainer.Chain):
    """``__call__`` a descriptor of the program's own."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(4, 4)

    def run(self, x):
        return self.l(x)

    __call__ = _Bind()


class Proper(chainer.Chain):
    """``__call__`` a property returning a bound method."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(4, 3)

    def _run(self, x):
        return self.l(x)

    @property
    def __call__(self):
        return self._run


class Partial(chainer.Link):
    """``__call__`` a functools.partial (no ``__get__``: called without the instance)."""

    __call__ = functools.partial(F.clip, x_min=-5.0, x_max=5.0)


class NotCallable(chainer.Link):
    """``__call__ = None``: instances cannot be called (none is)."""

    __call__ = None


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.scaled = Scaled()
            self.plain = Plain()
            self.static = Static()
            self.by_class = ByClass()
            self.described = Described()
            self.partial = Partial()
            self.proper = Proper()
        self.not_callable = NotCallable()

    def forward(self, x):
        h = self.scaled(x)
        h = self.plain(h)
        h = self.static(h)
        h = self.by_class(h)
        h = self.described(h)
        h = self.partial(h)
        return self.proper(h)


if sys.argv[1:2] == ["install"]:
    import chainer_autoprof

    chainer_autoprof.install(granularity="link", trace=sys.argv[2], summary=False)

np.random.seed(0)  # the links' initial weights
rng = np.random.RandomState(0)
model = L.Classifier(Net())
optimizer = chainer.optimizers.SGD(lr=0.1)
optimizer.setup(model)
x = rng.rand(16, 4).astype(np.float32)
t = rng.randint(0, 3, 16).astype(np.int32)
for step in range(8):
    model.cleargrads()
    loss = model(x, t)
    loss.backward()
    optimizer.update()
    print(f"step {step} loss {float(loss.array):.8f}")
print("callable:", callable(model.predictor.not_callable))

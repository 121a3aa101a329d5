
import copy
import multiprocessing
import pickle
import sys

import numpy as np
import chainer
import chainer.links as L

import chainer_autoprof


class Model(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def forward(self, x):
        return self.l1(x).array


class Old(chainer.Chain):
    """Old style: its own __call__ is wrapped."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def __call__(self, x):
        return self.l1(x).array


def same(a, b):
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


x = np.arange(6, dtype=np.float32).reshape(2, 3)
for granularity in sys.argv[1:]:
    chainer_autoprof.install(granularity=granularity, summary=False)
    checks = []
    for model in (Model(), Old()):
        opt = chainer.optimizers.SGD()
        opt.setup(model)
        want = model(x)
        checks.append(same(pickle.loads(pickle.dumps(model.__call__))(x), want))
        checks.append(same(copy.deepcopy(model.__call__)(x), want))
        checks.append(same(copy.deepcopy(model.l1.__call__)(x).array, model.l1(x).array))
        checks.append(pickle.loads(pickle.dumps(opt.update)).__self__.target is not None)
        checks.append(copy.deepcopy(opt.update).__self__ is not opt)
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map(model.__call__, [x, x + 1])
        checks.append(same(got[0], want) and same(got[1], model(x + 1)))
    print(granularity, checks.count(True), "of", len(checks))
    chainer_autoprof.uninstall()

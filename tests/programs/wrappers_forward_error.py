
import sys

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training


class Broken(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def forward(self, x, t=None):
        h = self.l1(x)
        return explode(h)


def explode(h):
    raise ValueError("bad forward")


model = L.Classifier(Broken())
x = np.ones((4, 3), np.float32)
t = np.zeros(4, np.int32)
opt = chainer.optimizers.SGD()
opt.setup(model)
how = sys.argv[1]
if how == "call":
    model(x, t)
elif how == "lossfun":
    opt.update(model, x, t)
else:
    it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 2)
    trainer = training.Trainer(training.updaters.StandardUpdater(it, opt), (2, "iteration"))
    trainer.run()

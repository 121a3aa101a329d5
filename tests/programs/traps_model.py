import sys

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.dataset import concat_examples
from chainer.training import extensions

import chainer_autoprof


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def forward(self, x):
        return self.l1(x)


x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)
dataset = chainer.datasets.TupleDataset(x, t)
model = L.Classifier(MLP())
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)

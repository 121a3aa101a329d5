
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training
from chainer.dataset import concat_examples


class MLP(chainer.Chain):
    def __init__(self, n_out=4):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, 16)
            self.l2 = L.Linear(None, n_out)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


rng = np.random.RandomState(0)
X = rng.randn(640, 8).astype(np.float32)
Y = rng.randint(0, 4, 640).astype(np.int32)
train = chainer.datasets.TupleDataset(X[:320], Y[:320])
test = chainer.datasets.TupleDataset(X[320:], Y[320:])
model = L.Classifier(MLP())
optimizer = chainer.optimizers.SGD(lr=0.01)
optimizer.setup(model)

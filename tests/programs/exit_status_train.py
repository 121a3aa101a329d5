import sys

import numpy as np
import chainer
import chainer.links as L

model = L.Classifier(L.Linear(4, 3))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.random.RandomState(0).randn(8, 4).astype(np.float32)
t = (np.arange(8) % 3).astype(np.int32)


def step():
    optimizer.update(model, x, t)

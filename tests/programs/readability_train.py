"""A small Classifier trained by hand, 150 steps; one pause in module-level code between two
steps, long enough for a stall report (the launcher's own frames lie under this one)."""

import sys
import time

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(4, 5)
            self.l2 = L.Linear(5, 3)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


model = L.Classifier(MLP())
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((4, 4), np.float32)
t = np.zeros(4, np.int32)
pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
for i in range(150):
    optimizer.update(model, x, t)
    if i == 20 and pause:
        time.sleep(pause)

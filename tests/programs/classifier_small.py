"""A small Classifier (two Linear links) with its SGD optimizer and one fixed batch, for the
programs that train it by hand (``# include: classifier_small``)."""

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


import numpy as np

import chainer
import chainer.functions as F
import chainer.links as L


class TwoDevices(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(32, 64)
            self.l2 = L.Linear(64, 10)
        self.l1.to_device("@cupy:0")
        self.l2.to_device("@cupy:1")

    def forward(self, x, t):
        h = F.copy(F.relu(self.l1(x)), 1)
        return F.softmax_cross_entropy(self.l2(h), t)


rng = np.random.RandomState(0)
model = TwoDevices()
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = chainer.get_device("@cupy:0").send(rng.randn(16, 32).astype(np.float32))
t = chainer.get_device("@cupy:1").send(rng.randint(0, 10, size=16).astype(np.int32))
for _ in range(3):
    optimizer.update(model, x, t)
print("ok")

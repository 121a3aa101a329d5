
import sys
import threading

import numpy as np

import chainer
import chainer.functions as F
import chainer.links as L

STEPS = 5
sys.setswitchinterval(1e-6)  # switch threads as often as possible: stress the bookkeeping


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(256, 256)
            self.l2 = L.Linear(256, 10)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def train(seed, barrier):
    rng = np.random.RandomState(seed)
    model = L.Classifier(MLP())
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    x = rng.randn(256, 256).astype(np.float32)
    t = rng.randint(0, 10, size=256).astype(np.int32)
    if barrier is not None:
        barrier.wait()
    for _ in range(STEPS):
        optimizer.update(model, x, t)


# First one thread alone: the reference tree.  Then two threads at once.
alone = threading.Thread(target=train, args=(0, None), name="alone")
alone.start()
alone.join()
barrier = threading.Barrier(2)
pair = [threading.Thread(target=train, args=(i + 1, barrier), name=f"trainer-{i}")
        for i in range(2)]
for thread in pair:
    thread.start()
for thread in pair:
    thread.join()
print("ok")

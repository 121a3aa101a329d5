"""A loop with nothing between its iterations: whatever runs there on its thread is the
agent's.  ``loop``: a loop of the program's own; ``trainer``: a Trainer and its updater (the
iteration is the updater's, the optimizer's update inside it)."""

import sys

import chainer
import chainer.links as L
import numpy as np
from chainer import training

np.random.seed(0)
model = L.Classifier(L.Linear(8, 4))
optimizer = chainer.optimizers.SGD(lr=0.1)
optimizer.setup(model)
x = np.random.rand(16, 8).astype(np.float32)
t = np.random.randint(0, 4, 16).astype(np.int32)
if sys.argv[1] == "trainer":
    data = chainer.datasets.TupleDataset(x, t)
    it = chainer.iterators.SerialIterator(data, 16)
    trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer),
                               (12, "iteration"))
    trainer.run()
else:
    for step in range(12):
        model.cleargrads()
        loss = model(x, t)
        loss.backward()
        optimizer.update()
print("done")

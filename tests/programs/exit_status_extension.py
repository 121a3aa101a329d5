
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

from chainer import training

it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 4)
updater = training.updaters.StandardUpdater(it, optimizer)
trainer = training.Trainer(updater, (20, "iteration"), out="result")


@training.make_extension(trigger=(5, "iteration"))
def interrupt(trainer):
    raise KeyboardInterrupt


trainer.extend(interrupt)
trainer.run()

"""Steps that train on other than one whole batch: ``MODE`` is one of

* ``accumulate``: a loop of the program's own, four batches of 16 per update (gradient
  accumulation) through the iterator and the converter: 64 samples a step;
* ``updater``: the same in an updater of its own under a Trainer, with an Evaluator whose
  batches of 50 are not training;
* ``partial``: a Trainer for one epoch of 100 samples in batches of 32: 32, 32, 32, 4;
* ``converter``: no iterator, slices of the data set converted, two of 8 per update: 16.
"""

import sys

import chainer
import chainer.links as L
import numpy as np
from chainer import training
from chainer.dataset import concat_examples
from chainer.training import extensions

MODE = sys.argv[1]
np.random.seed(0)
rng = np.random.RandomState(0)
data = chainer.datasets.TupleDataset(rng.rand(100, 4).astype(np.float32),
                                     rng.randint(0, 3, 100).astype(np.int32))
model = L.Classifier(L.Linear(4, 3))
optimizer = chainer.optimizers.SGD(lr=0.01)
optimizer.setup(model)


class Accumulating(training.updaters.StandardUpdater):
    """Four forward/backward passes per update."""

    def update_core(self):
        iterator = self.get_iterator("main")
        model.cleargrads()
        for _ in range(4):
            x, t = self.converter(iterator.next(), self.device)
            model(x, t).backward()
        optimizer.update()


if MODE == "accumulate":
    it = chainer.iterators.SerialIterator(data, 16)
    for step in range(20):
        model.cleargrads()
        for _ in range(4):
            x, t = concat_examples(it.next())
            model(x, t).backward()
        optimizer.update()
elif MODE == "updater":
    it = chainer.iterators.SerialIterator(data, 16)
    trainer = training.Trainer(Accumulating(it, optimizer), (12, "iteration"))
    test = chainer.iterators.SerialIterator(data, 50, repeat=False, shuffle=False)
    trainer.extend(extensions.Evaluator(test, model), trigger=(4, "iteration"))
    trainer.run()
elif MODE == "partial":
    it = chainer.iterators.SerialIterator(data, 32, repeat=False)
    trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer), (1, "epoch"))
    trainer.run()
elif MODE == "converter":
    for step in range(10):
        model.cleargrads()
        for half in range(2):
            start = (step * 16 + half * 8) % 96
            x, t = concat_examples(data[start:start + 8])
            model(x, t).backward()
        optimizer.update()
print("done", MODE)

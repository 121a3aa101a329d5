
import numpy as np

import chainer
import chainer.links as L
from chainer import training

rng = np.random.RandomState(0)
data = chainer.datasets.TupleDataset(rng.randn(128, 32).astype(np.float32),
                                     rng.randint(0, 10, size=128).astype(np.int32))
model = L.Classifier(L.Linear(32, 10))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
it = chainer.iterators.SerialIterator(data, 32)
updater = training.updaters.ParallelUpdater(it, optimizer, devices={"main": 0, "second": 1})
trainer = training.Trainer(updater, (3, "iteration"), out="result")
trainer.run()
print("ok")

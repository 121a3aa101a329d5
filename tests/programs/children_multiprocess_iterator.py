
import numpy as np

import chainer
import chainer.links as L
from chainer import training

if __name__ == "__main__":
    np.random.seed(0)  # the weights' initialization
    rng = np.random.RandomState(0)
    data = chainer.datasets.TupleDataset(rng.randn(64, 20).astype(np.float32),
                                         rng.randint(0, 5, size=64).astype(np.int32))
    it = chainer.iterators.MultiprocessIterator(data, 8, shuffle=False, n_processes=2)
    model = L.Classifier(L.Linear(20, 5))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    updater = training.updaters.StandardUpdater(it, optimizer)
    trainer = training.Trainer(updater, (12, "iteration"), out="result")
    trainer.run()
    it.finalize()
    print(float(model.predictor.W.array.sum()))

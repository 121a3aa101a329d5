import numpy as np
import chainer
import chainer.links as L
from chainer import training

np.random.seed(0)
model = L.Classifier(L.Linear(4, 3))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.random.RandomState(0).randn(12, 4).astype(np.float32)
t = (np.arange(12) % 3).astype(np.int32)
it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 4, shuffle=False)
updater = training.updaters.StandardUpdater(it, optimizer)
for _ in range(3):
    updater.update()
print("loss", repr(float(model.loss.array)))
import chainer_autoprof, chainer_autoprof.agent as agent
print(chainer_autoprof.__file__, agent.current() is not None)

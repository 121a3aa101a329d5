
import sys, time
import numpy as np
import chainer, chainer.functions as F, chainer.links as L
from chainer import training

KIND, DATA_MS, MODEL_MS = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])

class Slow(chainer.dataset.DatasetMixin):
    def __len__(self):
        return 256
    def get_example(self, i):
        time.sleep(DATA_MS / 1000)
        return np.full(4, i % 3, np.float32), np.int32(i % 2)

class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l = L.Linear(4, 2)
    def forward(self, x):
        time.sleep(MODEL_MS / 1000)
        return self.l(x)

if KIND == "process":
    it = chainer.iterators.MultiprocessIterator(Slow(), 4, n_processes=1, n_prefetch=1)
else:
    it = chainer.iterators.MultithreadIterator(Slow(), 4, n_threads=2)
model = L.Classifier(Net())
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer), (30, "iteration"))
trainer.run()
it.finalize()
print("done")

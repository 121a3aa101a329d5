
import os, sys, time
import numpy as np
import chainer, chainer.links as L
from chainer import training

RELEASE = int(os.environ["RELEASE_FD"])
BLOCK_AT = [int(n) for n in os.environ["BLOCK_AT"].split(",")]

class Waiting(chainer.iterators.SerialIterator):
    fetches = 0
    def __next__(self):
        self.fetches += 1
        if self.fetches in BLOCK_AT:
            with open("blocked_at", "a") as f:
                f.write(f"{time.time()}\n")
            os.read(RELEASE, 1)
        elif self.fetches > BLOCK_AT[0]:
            time.sleep(0.05)  # slow enough for the watch to see the iterations go on
        return super().__next__()
    next = __next__

x = np.random.RandomState(0).rand(64, 4).astype(np.float32)
t = (x.sum(axis=1) > 2).astype(np.int32)
model = L.Classifier(L.Linear(4, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
updater = training.updaters.StandardUpdater(Waiting(chainer.datasets.TupleDataset(x, t), 8),
                                            optimizer)
training.Trainer(updater, (int(os.environ["ITERATIONS"]), "iteration"), out="result").run()
print("finished", flush=True)

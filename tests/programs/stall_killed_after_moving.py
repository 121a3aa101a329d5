
import os, threading
os.makedirs("elsewhere", exist_ok=True)

def warm_up():
    import numpy as np, chainer, chainer.links as L
    m = L.Classifier(L.Linear(4, 2))
    o = chainer.optimizers.SGD()
    o.setup(m)
    for _ in range(3):
        o.update(m, np.ones((2, 4), np.float32), np.zeros(2, np.int32))

w = threading.Thread(target=warm_up, name="warm-up-thread")
w.start()
w.join()
os.chdir("elsewhere")

import os, sys, time
import numpy as np
import chainer, chainer.links as L

model = L.Classifier(L.Linear(4, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.random.RandomState(0).rand(64, 4).astype(np.float32)
t = (x.sum(axis=1) > 2).astype(np.int32)

class Slow(chainer.iterators.SerialIterator):
    def __next__(self):
        time.sleep(0.02)   # a data phase that dominates
        return super().__next__()
    next = __next__

it = Slow(chainer.datasets.TupleDataset(x, t), 8)
n = 0
while True:
    batch = it.next()
    xs, ts = chainer.dataset.concat_examples(batch)
    optimizer.update(model, xs, ts)
    print(n, flush=True)
    n += 1

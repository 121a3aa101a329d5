
import gc
import numpy as np
import chainer, chainer.functions as F, chainer.links as L

model = L.Classifier(chainer.Sequential(L.Linear(6, 6), F.relu, L.Linear(6, 3)))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.random.RandomState(0).rand(5, 6).astype(np.float32)
t = np.array([0, 1, 2, 0, 1], np.int32)
gc.set_threshold(1, 1_000_000, 1_000_000)
for _ in range(12):
    optimizer.update(model, x, t)
gc.set_threshold(700, 10, 10)
print("done")


import numpy as np, chainer, chainer.links as L
model = L.Classifier(L.Linear(3, 2))
opt = chainer.optimizers.SGD()
opt.setup(model)
x = np.ones((4, 3), np.float32); t = np.zeros(4, np.int32)
for _ in range(6):
    opt.update(model, x, t)

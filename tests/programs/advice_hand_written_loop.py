
import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L

model = L.Classifier(L.Linear(8, 4))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.random.rand(16, 8).astype(np.float32)
t = np.random.randint(0, 4, size=16).astype(np.int32)
for i in range(6):
    model.cleargrads()
    loss = model(x, t)
    loss.backward()
    optimizer.update()
for i in range(2):
    optimizer.update(model, x, t)

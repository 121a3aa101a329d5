"""A loop of the program's own with nothing between its iterations: whatever runs there on
its thread is the agent's."""

import chainer
import chainer.links as L
import numpy as np

np.random.seed(0)
model = L.Classifier(L.Linear(8, 4))
optimizer = chainer.optimizers.SGD(lr=0.1)
optimizer.setup(model)
x = np.random.rand(16, 8).astype(np.float32)
t = np.random.randint(0, 4, 16).astype(np.int32)
for step in range(12):
    model.cleargrads()
    loss = model(x, t)
    loss.backward()
    optimizer.update()
print(f"loss {float(loss.array):.6f}")

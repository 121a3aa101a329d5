
import os, time
import numpy as np
import chainer
import chainer.links as L

model = L.Classifier(L.Linear(4, 3))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((4, 4), np.float32)
t = np.zeros(4, np.int32)
end = time.monotonic() + 1.0  # several background writes of the trace so far
while time.monotonic() < end:
    optimizer.update(model, x, t)
print("trained", flush=True)

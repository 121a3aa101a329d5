
import sys

import numpy as np
import chainer
import chainer.links as L

x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)
model = L.Classifier(L.Linear(3, 2))
opt = chainer.optimizers.SGD()
opt.setup(model)
for _ in range(3):
    opt.update(model, x, t)
import chainer_autoprof.agent as agent
tracer = agent.current().tracer
print(type(tracer.sync.backend).__name__, tracer.sync.calls, "cupy" in sys.modules)

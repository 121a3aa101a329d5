
import os, sys, time
import numpy as np
import chainer, chainer.links as L
model = L.Classifier(L.Linear(8, 3))
opt = chainer.optimizers.SGD(); opt.setup(model)
x = np.ones((4, 8), np.float32); t = np.zeros(4, np.int32)
for i in range(12):
    opt.update(model, x, t)
if sys.argv[1:] == ["kill"]:
    time.sleep(1.0)  # the background writer writes the trace so far
    os.kill(os.getpid(), 9)

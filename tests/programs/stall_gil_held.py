
import ctypes, os, sys, time
import numpy as np
import chainer, chainer.links as L

RELEASE = int(os.environ["RELEASE_FD"])
libc = ctypes.PyDLL(None)            # calls keep the GIL, as some C extensions do
buf = ctypes.create_string_buffer(1)
model = L.Classifier(L.Linear(4, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((8, 4), np.float32)
t = np.zeros(8, np.int32)
for step in range(24):
    if step == 20:
        print("holding", flush=True)
        libc.read(RELEASE, buf, 1)   # blocked in C, the GIL held
    optimizer.update(model, x, t)
    time.sleep(0.05)                 # the watchdog sees the training before the hang
print("finished", flush=True)


import os, time
import numpy as np
import chainer
import chainer.links as L

model = L.Classifier(L.Linear(4, 3))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((4, 4), np.float32)
t = np.zeros(4, np.int32)
for _ in range(20):
    optimizer.update(model, x, t)
time.sleep(0.3)  # a background write of the trace so far or two
os.closerange(3, 256)  # as a daemonizing library does
files = [open(f"user{i}.csv", "w") for i in range(6)]
print("closed", flush=True)
lines = 0
while not os.path.exists("go") or lines < 200:
    optimizer.update(model, x, t)
    for f in files:
        f.write(f"{lines},{lines * 2}\n")
    lines += 1
    time.sleep(0.002)
for f in files:
    f.close()
print(lines, flush=True)

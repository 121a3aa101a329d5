
import os, time
import numpy as np
import chainer
import chainer.links as L
import chainer_autoprof

def free():
    st = os.statvfs(".")
    return st.f_bavail * st.f_frsize

model = L.Classifier(L.Linear(4, 3))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((4, 4), np.float32)
t = np.zeros(4, np.int32)
seen = False
end = time.monotonic() + 20
while time.monotonic() < end and free() > 2 << 20:
    optimizer.update(model, x, t)
    for _ in range(500):
        with chainer_autoprof.annotate("augment"):
            pass
    there = os.path.exists("run.json.partial")
    if seen and not there:
        break  # the agent gave it up
    seen = seen or there
checkpoint = L.Linear(750, 1000)  # 3 MB of float32
chainer.serializers.save_npz("checkpoint.npz", checkpoint)
print("saved", flush=True)


import errno, time
import numpy as np
import chainer
import chainer.links as L

model = L.Classifier(L.Linear(4, 3))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((4, 4), np.float32)
t = np.zeros(4, np.int32)
end = time.monotonic() + 0.5
while time.monotonic() < end:
    optimizer.update(model, x, t)
with open("data.bin", "wb", buffering=0) as f:
    try:
        while True:
            f.write(b"x" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
print("full", flush=True)

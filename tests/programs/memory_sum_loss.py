"""A hand-written training loop that sums its losses: ``sum_loss += loss`` keeps every
iteration's graph (its activations) alive, the leak Chainer users write once; with ``fixed``,
its twin sums the loss's value, ``sum_loss += float(loss.array)``, and keeps nothing.

With ``pool`` too, the stand-in ``cupy`` on the path (no GPU) reports a memory pool that
fills in the first iterations and then holds, as CuPy's does when it caches freed blocks."""

import sys

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

fixed = "fixed" in sys.argv[1:]
pool = None
if "pool" in sys.argv[1:]:
    import cupy

    pool = cupy.get_default_memory_pool()
rng = np.random.RandomState(0)
model = L.Classifier(chainer.Sequential(L.Linear(256, 512), F.relu, L.Linear(512, 512), F.relu,
                                        L.Linear(512, 10)))
optimizer = chainer.optimizers.SGD(lr=0.01)
optimizer.setup(model)
x = rng.rand(256, 256).astype(np.float32)
t = rng.randint(0, 10, size=256).astype(np.int32)

sum_loss = 0.0
for i in range(40):
    loss = model(x, t)
    if pool is not None:  # what CuPy's pool would show: the same arrays each step, cached
        pool.used = 48 << 20
        pool.held = min(i + 1, 4) * (32 << 20)
    model.cleargrads()
    loss.backward()
    optimizer.update()
    if fixed:
        sum_loss += float(loss.array)
    else:
        sum_loss += loss  # a Variable: this iteration's graph stays reachable
print("mean loss", float(getattr(sum_loss, "array", sum_loss)) / 40)


import sys, time
import numpy as np
import chainer, chainer.links as L
from chainer import training

rng = np.random.RandomState(0)
x = rng.rand(64, 256).astype(np.float32)
t = rng.randint(0, 2, 64).astype(np.int32)
model = L.Classifier(L.Linear(256, 256))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
if sys.argv[1] == "trainer":
    it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 16)
    updater = training.updaters.StandardUpdater(it, optimizer)
    training.Trainer(updater, (20, "iteration"), out="result").run()
else:
    for _ in range(20):
        optimizer.update(model, x[:16], t[:16])
end = time.time() + 3
calls = 0
with chainer.using_config("train", False), chainer.no_backprop_mode():
    while time.time() < end:
        model.predictor(x)
        calls += 1
if sys.argv[1] == "trainer":
    time.sleep(2.5)   # the trainer has returned: training is over
print("inference calls", calls, flush=True)

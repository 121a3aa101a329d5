
import time
import numpy as np
import chainer, chainer.links as L
from chainer import training

rng = np.random.RandomState(0)
x = rng.rand(64, 8).astype(np.float32)
t = rng.randint(0, 2, 64).astype(np.int32)
model = L.Classifier(L.Linear(8, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 16)
trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer), (24, "iteration"),
                           out="result")

@training.make_extension(trigger=(12, "iteration"))
def evaluate(trainer):
    end = time.time() + 63
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        while time.time() < end:
            model.predictor(x)
            time.sleep(0.01)

trainer.extend(evaluate)
trainer.run()
print("finished", flush=True)


import sys

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.dataset import concat_examples
from chainer.training import extensions

import chainer_autoprof


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def forward(self, x):
        return self.l1(x)


x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)
dataset = chainer.datasets.TupleDataset(x, t)
model = L.Classifier(MLP())
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)

with chainer.using_config("train", False):
    model(x, t)
with chainer.no_backprop_mode():
    model(x, t)
test_iter = chainer.iterators.SerialIterator(dataset, 2, repeat=False, shuffle=False)
batches = 0
with chainer.using_config("train", False), chainer.no_backprop_mode():
    for batch in test_iter:  # ends with StopIteration, untouched
        model(*concat_examples(batch))
        batches += 1
print("evaluated", batches, "batches")


class ImageGen(training.Extension):
    trigger = (1, "iteration")

    def __call__(self, trainer):
        with chainer.using_config("train", False):
            model.predictor(x)


@training.make_extension(trigger=(1, "iteration"))
def sample(trainer):
    model.predictor(x)  # train mode, no using_config: still not training


class MyEvaluator(extensions.Evaluator):
    def __call__(self, trainer=None):  # an override calling its base: still one range
        return super().__call__(trainer)


class Stop(training.Extension):
    trigger = (1, "iteration")

    def __call__(self, trainer):
        if trainer.updater.iteration == 2:
            sys.exit(3)


train_iter = chainer.iterators.SerialIterator(dataset, 2, shuffle=False)
updater = training.updaters.StandardUpdater(train_iter, optimizer)
trainer = training.Trainer(updater, (5, "iteration"))
trainer.extend(ImageGen())
trainer.extend(sample)
trainer.extend(MyEvaluator(test_iter, model), trigger=(1, "iteration"))
trainer.extend(Stop())
trainer.run()

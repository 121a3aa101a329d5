
import copy
import gc
import pickle
import sys
import weakref
import zipfile

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.training import extensions


class Old(chainer.Chain):
    """Old style: its own __call__ is wrapped by the agent."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 4)
            self.bn = L.BatchNormalization(4)
            self.l2 = L.Linear(4, 2)

    def __call__(self, x):
        return self.l2(F.relu(self.bn(self.l1(x))))


def weights(link):
    return [(name, p.array.copy()) for name, p in sorted(link.namedparams())]


def same(a, b):
    return [n for n, _ in a] == [n for n, _ in b] and all(
        np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))


x = np.arange(24, dtype=np.float32).reshape(8, 3) / 10
t = np.array([0, 1] * 4, np.int32)
model = L.Classifier(Old())
optimizer = chainer.optimizers.MomentumSGD()
optimizer.setup(model)
it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 4)
trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer), (2, "iteration"))
trainer.extend(extensions.snapshot(), trigger=(2, "iteration"))
trainer.run()

# no reference to arrays or Variables kept: they die with the iteration
xa = x.copy()
xv = chainer.Variable(xa)
loss = F.softmax_cross_entropy(model.predictor(xv), t)  # (Classifier would keep it)
model.cleargrads()
loss.backward()
optimizer.update()
refs = [weakref.ref(o) for o in (xa, xv, loss, loss.creator_node)]
del xa, xv, loss
gc.collect()
print("alive after iteration:", sum(r() is not None for r in refs))

data = pickle.dumps(model)
print("pickle mentions agent:", b"chainer_autoprof" in data)
print("pickle round trip:", same(weights(pickle.loads(data)), weights(model)))
print("pickled optimizer mentions agent:", b"chainer_autoprof" in pickle.dumps(optimizer))
clone = copy.deepcopy(model)
print("deepcopy:", same(weights(clone), weights(model)), type(clone.predictor).__name__)
with chainer.using_config("train", False):
    print("deepcopy predicts the same:",
          np.array_equal(clone.predictor(x).array, model.predictor(x).array))
shared = model.copy()
print("Link.copy shares:", shared.predictor.l1.W.array is model.predictor.l1.W.array)
chainer.serializers.save_npz("model.npz", model)
keys = sorted(np.load("model.npz").files)
print("npz keys:", " ".join(keys))
fresh = L.Classifier(Old())
fresh(x, t)  # the same shapes
chainer.serializers.load_npz("model.npz", fresh)
print("load_npz:", same(weights(fresh), weights(model)))
snapshot = np.load("result/snapshot_iter_2")
print("snapshot keys mention agent:", any("autoprof" in k for k in snapshot.files))
print("snapshot has the model:", "updater/model:main/predictor/l1/W" in snapshot.files)
gone = weakref.ref(model)
del model, clone, shared, fresh, optimizer, trainer, it
gc.collect()
print("model freed:", gone() is None)
import chainer_autoprof.agent as agent_module

link_entries = agent_module.current().patches.entries
for _ in range(50):  # links made on the fly: nothing of them piles up
    L.Linear(3, 2)(x)
gc.collect()
print("link entries left:", len(link_entries))

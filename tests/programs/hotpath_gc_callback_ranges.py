
import gc
import sys

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L

import chainer_autoprof

agent = chainer_autoprof.install(granularity=sys.argv[1], summary=True, log="error")
tracer = agent.tracer
info = tracer.info("gc", "user")
open_ranges = {}


def on_gc(phase, details):
    """A range per collection on the collecting thread, as a gc profiler would add."""
    if phase == "start":
        open_ranges[id(tracer.state())] = tracer.begin(info)
    else:
        tracer.end(open_ranges.pop(id(tracer.state()), None))


gc.callbacks.append(on_gc)
gc.set_threshold(1, 1, 1)  # a collection at nearly every allocation, inside our bookkeeping


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 4)
            self.l2 = L.Linear(4, 2)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


np.random.seed(0)
x = np.random.rand(4, 3).astype(np.float32)
t = np.array([0, 1, 0, 1], np.int32)
model = L.Classifier(MLP())
opt = chainer.optimizers.SGD()
opt.setup(model)
for _ in range(3):
    opt.update(model, x, t)
gc.callbacks.remove(on_gc)
gc.set_threshold(700, 10, 10)
recorder = agent.recorder
recorder.flush_all()
print(repr(float(model.loss.array)), agent.implementation,
      recorder.agg.ranges > 0, tracer.state().stack == [])

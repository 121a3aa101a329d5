
import numpy as np
import chainer
import chainer.links as L
from chainer import training

import chainer_autoprof.agent as agent_module


class FailingSink:
    def prepare(self, info):
        pass

    def begin(self, info, ts):
        if info.category == "extension":
            raise RuntimeError("sink failed")

    def end(self, info, t0, t1, ts):
        pass

    def close(self, tracer):
        pass


agent_module.current().tracer.add_sink(FailingSink())  # after NVTX: NVTX has pushed


class Every(training.Extension):
    trigger = (1, "iteration")

    def __call__(self, trainer):
        pass


x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)
model = L.Classifier(L.Linear(3, 2))
opt = chainer.optimizers.SGD()
opt.setup(model)
it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 2)
trainer = training.Trainer(training.updaters.StandardUpdater(it, opt), (3, "iteration"))
trainer.extend(Every())
trainer.run()
print(trainer.updater.iteration)


import sys

import numpy as np

import chainer_autoprof.agent as agent_module
import chainer_autoprof.patches.chainer as chainer_patches


def broken(*args, **kwargs):
    raise RuntimeError("injected")


if sys.argv[1] == "entry" and agent_module.current() is not None:
    chainer_patches.ChainerPatches._entry = broken  # before Chainer is instrumented

import chainer  # noqa: E402
import chainer.links as L  # noqa: E402

np.random.seed(0)
x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)
model = L.Classifier(L.Linear(3, 2))
opt = chainer.optimizers.SGD()
opt.setup(model)
for i in range(4):
    if i == 1 and sys.argv[1] == "tracer" and agent_module.current() is not None:
        agent_module.current().tracer.begin_phase = broken
    loss = model(x, t)
    model.cleargrads()
    loss.backward()
    opt.update()
    print(repr(float(loss.array)))
    opt.update(model, x, t)
    print(repr(float(model.loss.array)))
agent = agent_module.current()
if agent is not None:
    for patch in agent.patches.patches:
        print(patch.label, patch.status, patch.on, file=sys.stderr)

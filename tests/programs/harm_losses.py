
import sys

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L

import chainer_autoprof


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 5)
            self.l2 = L.Linear(5, 2)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def train():
    """Losses and final weights of a custom loop and of optimizer.update(lossfun)."""
    np.random.seed(0)
    x = np.random.rand(8, 3).astype(np.float32)
    t = np.random.randint(0, 2, 8).astype(np.int32)
    model = L.Classifier(MLP())
    opt = chainer.optimizers.Adam()
    opt.setup(model)
    out = []
    for i in range(3):
        loss = model(x[i::2], t[i::2])
        model.cleargrads()
        loss.backward()
        opt.update()
        out.append(repr(float(loss.array)))
        opt.update(model, x, t)
        out.append(repr(float(model.loss.array)))
    out += [repr(float(p.array.sum())) for _, p in sorted(model.namedparams())]
    return " ".join(out)


print("none", train())
for config in sys.argv[1:]:
    level, granularity = config.split(":")
    chainer_autoprof.install(sync_level=int(level), granularity=granularity, summary=False)
    print(config, train())
    chainer_autoprof.uninstall()

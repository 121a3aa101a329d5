
import sys
import traceback

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L
import nvtx

import chainer_autoprof


def mark(name):
    nvtx.mark(message=name, domain="scenario")


class MLP(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 4)
            self.l2 = L.Linear(4, 2)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


class OldBefore(chainer.Chain):
    """Old style (__call__, no forward), defined before the agent starts."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def __call__(self, x):
        return self.l1(x)


def define_old_after():
    class OldAfter(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(3, 2)

        def __call__(self, x):
            return self.l1(x)
    return OldAfter


class Gen(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(2, 3)

    def forward(self, z):
        return self.l1(z)


class Dis(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 1)

    def forward(self, x):
        return self.l1(x)


class GANUpdater(chainer.training.updaters.StandardUpdater):
    def update_core(self):
        gen = self.get_optimizer("gen").target
        dis = self.get_optimizer("dis").target
        x_real = self.converter(self.get_iterator("main").next(), self.device)
        x_fake = gen(np.ones((len(x_real), 2), np.float32))
        y_fake, y_real = dis(x_fake), dis(x_real)
        self.get_optimizer("dis").update(
            lambda a, b: F.sum(F.softplus(a)) + F.sum(F.softplus(-b)), y_fake, y_real)
        self.get_optimizer("gen").update(lambda a: F.sum(F.softplus(-a)), y_fake)
        x_fake.unchain_backward()


class Boom(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def forward(self, x):
        self.l1(x)
        raise ValueError("boom in forward")


x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)


def sgd(model):
    opt = chainer.optimizers.SGD()
    opt.setup(model)
    return opt


configs = [{"granularity": g} for g in sys.argv[1].split(",")]
configs.append({"granularity": "link", "link_depth": int(sys.argv[2])})
for cfg in configs:
    chainer_autoprof.install(summary=False, **cfg)
    tag = cfg["granularity"] + str(cfg.get("link_depth", ""))
    OldAfter = define_old_after()

    mark(tag + ":lossfun")
    model = L.Classifier(MLP())
    sgd(model).update(model, x, t)

    mark(tag + ":custom")
    model = L.Classifier(MLP())
    opt = sgd(model)
    for _ in range(2):
        loss = model(x, t)
        model.cleargrads()
        loss.backward()
        opt.update()

    mark(tag + ":old_before")
    model = L.Classifier(OldBefore())
    sgd(model).update(model, x, t)

    mark(tag + ":old_after")
    model = OldAfter()
    opt = sgd(model)
    loss = F.sum(model(x))
    model.cleargrads()
    loss.backward()
    opt.update()

    mark(tag + ":grad")
    model = L.Classifier(MLP())
    opt = sgd(model)
    loss = model(x, t)
    params = [p for _, p in sorted(model.namedparams())]
    for p, g in zip(params, chainer.grad([loss], params)):
        p.grad = g.array
    opt.update()

    mark(tag + ":gan")
    gen, dis = Gen(), Dis()
    it = chainer.iterators.SerialIterator(x, 2, shuffle=False)
    GANUpdater(it, {"gen": sgd(gen), "dis": sgd(dis)}).update()

    mark(tag + ":error")
    model = Boom()
    try:
        sgd(model).update(lambda v: F.sum(model(v)), x)
    except ValueError as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        print(tag, type(exc).__name__, exc, last.filename == __file__, last.name, last.line)
    mark(tag + ":end")
    chainer_autoprof.uninstall()

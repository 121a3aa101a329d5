import numpy as np
import chainer
import chainer.links as L


class Old(chainer.Chain):
    """Old style (__call__, no forward)."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 2)

    def __call__(self, x):
        return self.l1(x)


x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)


def step(model, opt):
    loss = model(x, t)
    model.cleargrads()
    loss.backward()
    opt.update()


def new_model():
    model = L.Classifier(Old())
    opt = chainer.optimizers.SGD()
    opt.setup(model)
    return model, opt

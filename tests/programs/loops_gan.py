
class Gen(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(4, 8)

    def forward(self, z):
        return self.l1(z)


class Dis(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(8, 1)

    def forward(self, x):
        return self.l1(x)


gen, dis = Gen(), Dis()
opt_gen, opt_dis = chainer.optimizers.Adam(), chainer.optimizers.Adam()
opt_gen.setup(gen)
opt_dis.setup(dis)
real = rng.randn(384, 8).astype(np.float32)
it = chainer.iterators.SerialIterator(real, 32)


def z():
    return rng.randn(32, 4).astype(np.float32)


for step in range(12):
{step}
print("done")

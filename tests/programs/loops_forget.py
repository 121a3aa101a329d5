
class Forgetful(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(8, 8)
            self.l2 = L.Linear(8, 4)

    def forward(self, x):
        return self.l2(F.forget(lambda h: F.relu(self.l1(h)), x))


model = L.Classifier(Forgetful())
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
for step in range(12):
    x, t = X[step * 16:(step + 1) * 16], Y[step * 16:(step + 1) * 16]
{step}
print("done")


class SlowToTest(MLP):
    def forward(self, x):
        if not chainer.config.train:
            time.sleep(0.05)  # a large test set
        return super().forward(x)


model = L.Classifier(SlowToTest())
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
{before}
{train}
with chainer.using_config("train", False), chainer.no_backprop_mode():
    for start in range(0, 320, 64):
        model(X[320 + start:384 + start], Y[320 + start:384 + start])
print("done")

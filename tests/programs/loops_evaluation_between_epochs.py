
class SlowToTest(MLP):
    def forward(self, x):
        if not chainer.config.train:
            time.sleep(0.1)  # a large test set
        return super().forward(x)


model = L.Classifier(SlowToTest())
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
it = chainer.iterators.SerialIterator(train, 16)
for epoch in range(3):
    for step in range(8):
        optimizer.update(model, *concat_examples(next(it)))
    x, t = concat_examples(test)  # converted in training mode, evaluated in test mode
    with chainer.using_config("train", False):
        model(x, t)
print("done")

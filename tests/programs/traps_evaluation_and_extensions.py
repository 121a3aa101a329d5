
# include: traps_model

with chainer.using_config("train", False):
    model(x, t)
with chainer.no_backprop_mode():
    model(x, t)
test_iter = chainer.iterators.SerialIterator(dataset, 2, repeat=False, shuffle=False)
batches = 0
with chainer.using_config("train", False), chainer.no_backprop_mode():
    for batch in test_iter:  # ends with StopIteration, untouched
        model(*concat_examples(batch))
        batches += 1
print("evaluated", batches, "batches")


class ImageGen(training.Extension):
    trigger = (1, "iteration")

    def __call__(self, trainer):
        with chainer.using_config("train", False):
            model.predictor(x)


@training.make_extension(trigger=(1, "iteration"))
def sample(trainer):
    model.predictor(x)  # train mode, no using_config: still not training


class MyEvaluator(extensions.Evaluator):
    def __call__(self, trainer=None):  # an override calling its base: still one range
        return super().__call__(trainer)


class Stop(training.Extension):
    trigger = (1, "iteration")

    def __call__(self, trainer):
        if trainer.updater.iteration == 2:
            sys.exit(3)


train_iter = chainer.iterators.SerialIterator(dataset, 2, shuffle=False)
updater = training.updaters.StandardUpdater(train_iter, optimizer)
trainer = training.Trainer(updater, (5, "iteration"))
trainer.extend(ImageGen())
trainer.extend(sample)
trainer.extend(MyEvaluator(test_iter, model), trigger=(1, "iteration"))
trainer.extend(Stop())
trainer.run()


# include: exit_status_train

from chainer import training

it = chainer.iterators.SerialIterator(chainer.datasets.TupleDataset(x, t), 4)
updater = training.updaters.StandardUpdater(it, optimizer)
trainer = training.Trainer(updater, (20, "iteration"), out="result")


@training.make_extension(trigger=(5, "iteration"))
def interrupt(trainer):
    raise KeyboardInterrupt


trainer.extend(interrupt)
trainer.run()

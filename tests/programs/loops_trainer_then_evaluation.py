
it = chainer.iterators.SerialIterator(train, 16)
trainer = training.Trainer(training.updaters.StandardUpdater(it, optimizer), (20, "iteration"))
trainer.run()
x, t = concat_examples(test)  # the whole test set, converted by hand
{evaluate}
print("accuracy", float(model.accuracy.array))

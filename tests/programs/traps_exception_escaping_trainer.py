
# include: traps_model

def lossfun(*args):
    if optimizer.t == 1:
        raise KeyError("bad batch at update 2")
    return model(*args)


train_iter = chainer.iterators.SerialIterator(dataset, 2, shuffle=False)
updater = training.updaters.StandardUpdater(train_iter, optimizer, loss_func=lossfun)
training.Trainer(updater, (5, "iteration")).run()

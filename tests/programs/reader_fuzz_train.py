import chainer_autoprof

# include: classifier_small
for i in range(40):
    with chainer_autoprof.annotate("step"):
        optimizer.update(model, x, t)


it = chainer.iterators.SerialIterator(train, 16)
for step in range(12):
    x, t = concat_examples(next(it))
{update}
{after}
print("done")

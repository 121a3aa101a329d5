
class Failing(chainer.dataset.DatasetMixin):
    def __len__(self):
        return 320

    def get_example(self, i):
        if reads.append(i) or len(reads) > 16 * 5:
            raise RuntimeError("the disk went away")
        return X[i], Y[i]


reads = []
it = chainer.iterators.SerialIterator(Failing(), 16)
try:
    for step in range(12):
        optimizer.update(model, *concat_examples(next(it)))
except RuntimeError:
    pass

"""Train an MLP on synthetic MNIST-shaped data with Chainer's Trainer (CPU, seconds).

Run it plainly (``python examples/train_mnist_synthetic.py``) or under the
agent (``python -m chainer_autoprof examples/train_mnist_synthetic.py``).
"""

import argparse

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training
from chainer.training import extensions


class MLP(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_units)
            self.l3 = L.Linear(None, n_out)

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def synthetic_mnist(n, seed):
    """MNIST-shaped data: 784 float features, 10 classes, learnable."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, size=n).astype(np.int32)
    centers = np.random.RandomState(0).randn(10, 784).astype(np.float32)
    images = centers[labels] + rng.randn(n, 784).astype(np.float32)
    return chainer.datasets.TupleDataset(images, labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epoch", "-e", type=int, default=2)
    parser.add_argument("--batchsize", "-b", type=int, default=100)
    parser.add_argument("--unit", "-u", type=int, default=200)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--out", "-o", default="result")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    np.random.seed(args.seed)
    model = L.Classifier(MLP(args.unit, 10))
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    train = synthetic_mnist(args.samples, seed=1)
    test = synthetic_mnist(args.samples // 5, seed=2)
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)

    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (args.epoch, "epoch"), out=args.out)
    trainer.extend(extensions.Evaluator(test_iter, model))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport(
        ["epoch", "main/loss", "validation/main/loss", "main/accuracy",
         "validation/main/accuracy"]))
    trainer.run()


if __name__ == "__main__":
    main()

"""The proof CNN of tests/data/gpu (conv1 3->64, conv2 64->128, pool, conv3 128->128, pool,
fc1 8192->2048, fc2 2048->2048, fc3 2048->10; ReLU; MomentumSGD) trained with Trainer and
StandardUpdater on synthetic 3x32x32 inputs, on GPU 0: what tests/gpu/run.sh measures."""

from __future__ import annotations

import argparse
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training


class CNN(chainer.Chain):
    def __init__(self) -> None:
        super().__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 64, 3, pad=1)
            self.conv2 = L.Convolution2D(64, 128, 3, pad=1)
            self.conv3 = L.Convolution2D(128, 128, 3, pad=1)
            self.fc1 = L.Linear(8192, 2048)
            self.fc2 = L.Linear(2048, 2048)
            self.fc3 = L.Linear(2048, 10)

    def forward(self, x):
        h = F.relu(self.conv1(x))
        h = F.max_pooling_2d(F.relu(self.conv2(h)), 2)
        h = F.max_pooling_2d(F.relu(self.conv3(h)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(h)))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--iterations", type=int, default=40)
    args = p.parse_args()
    rng = np.random.RandomState(0)
    n = args.batch * 4
    data = chainer.datasets.TupleDataset(rng.rand(n, 3, 32, 32).astype(np.float32),
                                         rng.randint(0, 10, n).astype(np.int32))
    model = L.Classifier(CNN())
    model.to_device("@cupy:0")
    opt = chainer.optimizers.MomentumSGD(lr=0.01)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(data, args.batch)
    updater = training.updaters.StandardUpdater(it, opt, device="@cupy:0")
    trainer = training.Trainer(updater, (args.iterations, "iteration"))
    t0 = time.perf_counter()
    trainer.run()
    print(f"trained {args.iterations} iterations in {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()

"""A hand-written Chainer training loop (no Trainer) on synthetic data, CPU, seconds.

Used by the recorder's tests and handy to try the summary, the trace and the
capture window on::

    python -m chainer_autoprof --trace loop.json examples/recorder_custom_loop.py
    python -m chainer_autoprof report loop.json

``--data-delay`` makes data loading slow (a sleep per batch), ``--evaluate-every``
runs an evaluation pass between iterations, and ``--end`` chooses how the program
ends: normally, ``sys.exit(3)``, an exception, Ctrl-C or SIGTERM (sent to itself),
after the loop or while loading the batch of iteration ``--end-at``.
"""

import argparse
import os
import signal
import sys
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np


class MLP(chainer.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_out)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


class SlowDataset(chainer.dataset.DatasetMixin):
    """Synthetic 64-feature, 4-class examples; ``delay`` seconds per batch of reads."""

    def __init__(self, n, delay, batchsize, seed):
        rng = np.random.RandomState(seed)
        self.labels = rng.randint(0, 4, size=n).astype(np.int32)
        centers = np.random.RandomState(0).randn(4, 64).astype(np.float32)
        self.x = centers[self.labels] + rng.randn(n, 64).astype(np.float32)
        self.delay = delay
        self.batchsize = batchsize
        self.reads = 0
        self.on_read = None

    def __len__(self):
        return len(self.labels)

    def get_example(self, i):
        self.reads += 1
        if self.on_read is not None:
            on_read, self.on_read = self.on_read, None
            on_read()
        if self.delay and self.reads % self.batchsize == 0:
            time.sleep(self.delay)
        return self.x[i], self.labels[i]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--batchsize", type=int, default=32)
    parser.add_argument("--unit", type=int, default=32)
    parser.add_argument("--data-delay", type=float, default=0.0,
                        help="seconds of sleep per batch in data loading")
    parser.add_argument("--evaluate-every", type=int, default=0)
    parser.add_argument("--end", default="normal",
                        choices=["normal", "exit", "raise", "sigint", "sigterm"])
    parser.add_argument("--end-at", type=int, default=-1,
                        help="iteration at which --end happens (default: after the loop)")
    args = parser.parse_args()

    np.random.seed(0)
    model = L.Classifier(MLP(args.unit, 4))
    optimizer = chainer.optimizers.SGD(lr=0.05)
    optimizer.setup(model)
    train = SlowDataset(2048, args.data_delay, args.batchsize, seed=1)
    it = chainer.iterators.SerialIterator(train, args.batchsize)
    test_x, test_t = train.x[:256], train.labels[:256]

    for i in range(args.iterations):
        if i == args.end_at:  # inside data loading: the iteration and its data phase are open
            train.on_read = lambda: end(args.end)
        batch = next(it)
        x, t = chainer.dataset.concat_examples(batch)
        optimizer.update(model, x, t)
        if args.evaluate_every and (i + 1) % args.evaluate_every == 0:
            with chainer.using_config("train", False), chainer.no_backprop_mode():
                acc = F.accuracy(model.predictor(test_x), test_t)
            print(f"iteration {i + 1}: accuracy {float(acc.array):.3f}")
    print(f"done: {args.iterations} iterations, loss {float(model.loss.array):.4f}")
    if args.end_at < 0:
        end(args.end)


def end(how):
    sys.stdout.flush()
    if how == "exit":
        sys.exit(3)
    if how == "raise":
        raise RuntimeError("the training script failed on purpose")
    if how == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)


if __name__ == "__main__":
    main()

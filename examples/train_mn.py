"""Data-parallel training with ChainerMN: an MLP on synthetic data, on CPU, in seconds.

Every rank trains a copy of the model on its shard of the data; gradients are
averaged over the ranks by all-reduce in each update.  The ``naive``
communicator needs only MPI and mpi4py (no GPU, no NCCL)::

    mpiexec -n 2 python examples/train_mn.py
    mpiexec -n 2 python -m chainer_autoprof --trace 'rank%r.json' examples/train_mn.py
    python -m chainer_autoprof merge rank*.json -o job.json

``--slow-rank R --slow-ms T`` makes rank R spend T more milliseconds in each
forward pass, a deliberate straggler (``--slow-every N``: in every N-th one only,
uneven iterations).  ``--hang-rank R --hang-at N`` makes
rank R stop in the forward pass of its iteration N (until the file
``--hang-until`` exists, else for good) while the other ranks wait for it in
the gradient all-reduce: a hung job, for the stall report::

    mpiexec -n 2 python -m chainer_autoprof --stall 10 examples/train_mn.py --hang-rank 1
    chainer-autoprof dump          # from another shell: where each rank is, the odd one out
"""

import argparse
import os
import threading
import time

import chainer
import chainer.functions as F
import chainer.links as L
import chainermn
import numpy as np
from chainer import training


class MLP(chainer.Chain):
    def __init__(self, n_units, n_out, delay=0.0, hang_at=-1, hang_until=None, every=1):
        super().__init__()
        self.delay, self.every = delay, every
        self.hang_at, self.hang_until, self.calls = hang_at, hang_until, 0
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_units)
            self.l3 = L.Linear(None, n_out)

    def forward(self, x):
        if self.calls == self.hang_at:
            hang(self.hang_until)
        self.calls += 1
        if self.delay and self.calls % self.every == 0:
            time.sleep(self.delay)
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def hang(until):
    """Block (inside C, in a lock) until the file ``until`` exists, or for good."""
    stop = threading.Event()
    while not stop.wait(0.2 if until else None):
        if os.path.exists(until):
            return


def synthetic(n, n_in, seed):
    """``n`` samples of ``n_in`` features in 10 learnable classes."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, size=n).astype(np.int32)
    centers = np.random.RandomState(0).randn(10, n_in).astype(np.float32)
    features = centers[labels] + rng.randn(n, n_in).astype(np.float32)
    return chainer.datasets.TupleDataset(features, labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--communicator", default="naive")
    parser.add_argument("--iterations", "-i", type=int, default=20)
    parser.add_argument("--batchsize", "-b", type=int, default=32, help="per rank")
    parser.add_argument("--unit", "-u", type=int, default=64)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--slow-every", type=int, default=1, help="every N-th forward only")
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=5, help="iteration at which it hangs")
    parser.add_argument("--hang-until", default=None, help="file that ends the hang")
    parser.add_argument("--out", "-o", default="result")
    args = parser.parse_args()

    comm = chainermn.create_communicator(args.communicator)
    delay = args.slow_ms / 1000.0 if comm.rank == args.slow_rank else 0.0
    hang_at = args.hang_at if comm.rank == args.hang_rank else -1
    model = L.Classifier(MLP(args.unit, 10, delay, hang_at, args.hang_until, args.slow_every))
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.Adam(), comm)
    optimizer.setup(model)

    # Rank 0 makes the data set; scatter_dataset hands every rank its shard.
    train = synthetic(args.samples, args.features, seed=1) if comm.rank == 0 else None
    train = chainermn.scatter_dataset(train, comm, shuffle=True)
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)

    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (args.iterations, "iteration"), out=args.out)
    trainer.run()

    # Every rank's final loss, gathered on rank 0 (an all-reduce of objects).
    with chainer.using_config("train", False), chainer.no_backprop_mode():
        x, t = chainer.dataset.concat_examples(train[:args.batchsize])
        loss = float(model(x, t).array)
    mean_loss = comm.allreduce_obj(loss) / comm.size
    if comm.rank == 0:
        print(f"ranks: {comm.size}  iterations: {args.iterations}  mean loss: {mean_loss:.4f}")


if __name__ == "__main__":
    main()

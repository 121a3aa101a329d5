
import multiprocessing
import os
import sys

import numpy as np

import chainer
import chainer.links as L

import chainer_autoprof


def train(steps, marker=None):
    rng = np.random.RandomState(steps)
    model = L.Classifier(L.Linear(20, 5))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    x = rng.randn(16, 20).astype(np.float32)
    t = rng.randint(0, 5, size=16).astype(np.int32)
    for _ in range(steps):
        optimizer.update(model, x, t)
    if marker:
        with open(marker, "w") as f:
            f.write(str(os.getpid()))


def child(method, marker):
    if method == "os.fork":
        # Forked inside an open range: the child must never end it.
        with chainer_autoprof.annotate("around fork"):
            pid = os.fork()
            if pid == 0:
                train(4, marker)
                sys.exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
    else:
        ctx = multiprocessing.get_context(method)
        proc = ctx.Process(target=train, args=(4, marker))
        proc.start()
        proc.join()
        assert proc.exitcode == 0, proc.exitcode


if __name__ == "__main__":
    for n, method in enumerate(sys.argv[1:]):
        child(method, f"child{n}.done")
    train(3)
    print("ok")

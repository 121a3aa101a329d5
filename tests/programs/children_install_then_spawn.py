
import multiprocessing
import os
import sys

import numpy as np

import chainer
import chainer.links as L

import chainer_autoprof


def train(steps):
    model = L.Classifier(L.Linear(20, 5))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    x = np.ones((16, 20), np.float32)
    t = np.zeros(16, np.int32)
    for _ in range(steps):
        optimizer.update(model, x, t)


if __name__ == "__main__":
    chainer_autoprof.install(granularity="link", trace=sys.argv[1], summary=False, warmup=0)
    proc = multiprocessing.get_context("spawn").Process(target=train, args=(4,))
    proc.start()
    proc.join()
    assert proc.exitcode == 0
    train(3)
    exported = sorted(k for k in os.environ if "CHAINER_PROF_" in k)
    chainer_autoprof.uninstall()
    left = sorted(k for k in os.environ if "CHAINER_PROF_" in k)
    print(exported, left)

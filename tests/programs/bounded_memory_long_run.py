
import gc
import json
import sys
import threading
import tracemalloc

import numpy as np
import chainer
import chainer.links as L

import chainer_autoprof
from chainer_autoprof import agent

link = L.Linear(2, 2)
x = np.ones((1, 2), np.float32)
tracer = agent.current().tracer
chainer.global_config.train = False  # inference: no training iterations, on every thread


def names(start, count):
    for i in range(start, start + count):
        with chainer_autoprof.annotate(f"step {i}"):
            link(x)


def labels(start, count):  # function labels that hold a constant: "_ * 12.0"
    v = chainer.Variable(x)
    for i in range(start, start + count):
        v * float(i)


def threads(count):
    for _ in range(count):
        t = threading.Thread(target=link, args=(x,))
        t.start()
        t.join()


def growth(work, *args):
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    work(*args)
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


tracemalloc.start()
names(0, 6000)        # past any cap on names
labels(0, 1000)
threads(300)
out = {"names": growth(names, 6000, 6000), "labels": growth(labels, 1000, 6000),
       "threads": growth(threads, 1500), "states": len(tracer.states)}
print(json.dumps(out))

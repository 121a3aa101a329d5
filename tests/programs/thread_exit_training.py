
import signal
import sys
import threading
import time

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L

started = threading.Barrier(4)
stop = threading.Event()


def train(seed):
    model = L.Classifier(L.Linear(16, 4))
    optimizer = chainer.optimizers.SGD()
    optimizer.setup(model)
    rng = np.random.RandomState(seed)
    x = rng.randn(8, 16).astype(np.float32)
    t = rng.randint(0, 4, 8).astype(np.int32)
    optimizer.update(model, x, t)
    started.wait()
    while not stop.is_set():
        optimizer.update(model, x, t)


daemon = sys.argv[1] == "daemon"
workers = [threading.Thread(target=train, args=(i,), daemon=daemon, name=f"worker-{i}")
           for i in range(3)]
for w in workers:
    w.start()
started.wait()
print("training", flush=True)
if daemon:
    time.sleep(0.5)   # the main thread returns while the daemons train
else:
    stop.wait()       # until SIGTERM

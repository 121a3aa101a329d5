"""Names that carry terminal escape sequences and HTML: two links, the model's class, a
thread and a user range; one iteration sleeps long enough for a stall report."""

import threading
import time

import numpy as np
import chainer
import chainer.functions as F
import chainer.links as L

import chainer_autoprof

ESC = "\x1b"
TITLE = ESC + "]0;pwned" + "\x07"        # retitles a terminal
CLEAR = ESC + "[2J" + "\r" + "\x9b" + "31m"   # clears it; C1 CSI


class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        self.add_link("l" + TITLE, L.Linear(4, 5))
        self.add_link("out" + CLEAR, L.Linear(5, 3))

    def forward(self, x):
        h = F.relu(getattr(self, "l" + TITLE)(x))
        return getattr(self, "out" + CLEAR)(h)


Net.__name__ = Net.__qualname__ = "Net<!--<script>" + TITLE

model = L.Classifier(Net())
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((4, 4), np.float32)
t = np.zeros(4, np.int32)
stop = threading.Event()
loader = threading.Thread(target=stop.wait, name="loader" + CLEAR, daemon=True)
loader.start()
for i in range(12):
    with chainer_autoprof.annotate("step" + TITLE):
        optimizer.update(model, x, t)
    if i == 6:
        time.sleep(1.5)   # long enough for a stall report
stop.set()


import sys
import numpy as np
import chainer, chainer.functions as F, chainer.links as L

EVERY, SIZE, LONG_LIVED, ITERATIONS = (int(a) for a in sys.argv[1:5])

class Node:
    __slots__ = ("next", "payload")

class CycleMaker(chainer.Chain):
    def __init__(self):
        super().__init__()
        self.calls = 0
        with self.init_scope():
            self.l1 = L.Linear(8, 8)

    def forward(self, x):
        self.calls += 1
        if self.calls % EVERY == 0:
            first = node = Node()
            for _ in range(SIZE):
                new = Node()
                new.payload = [node]
                node.next = new
                node = new
            node.next = first
        return F.sum(self.l1(x))

model = CycleMaker()
keep = [[i] for i in range(LONG_LIVED)]
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((4, 8), np.float32)
for _ in range(ITERATIONS):
    optimizer.update(model, x)
print("done")

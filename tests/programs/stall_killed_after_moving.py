
import os, threading
os.makedirs("elsewhere", exist_ok=True)

def warm_up():
    import numpy as np, chainer, chainer.links as L
    m = L.Classifier(L.Linear(4, 2))
    o = chainer.optimizers.SGD()
    o.setup(m)
    for _ in range(3):
        o.update(m, np.ones((2, 4), np.float32), np.zeros(2, np.int32))

w = threading.Thread(target=warm_up, name="warm-up-thread")
w.start()
w.join()
os.chdir("elsewhere")
# include: stall_killed

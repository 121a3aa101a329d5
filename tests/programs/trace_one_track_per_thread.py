
import threading
import numpy as np
import chainer
import chainer.links as L

model = L.Linear(8, 2)
x = np.ones((4, 8), dtype=np.float32)

def predict():
    with chainer.using_config("train", False):
        for _ in range(3):
            model(x)

t = threading.Thread(target=predict, name="predictor")
t.start()
t.join()
with chainer.using_config("train", False):
    model(x)


import threading

import numpy as np
import chainer.links as L

model = L.Linear(3, 2)
x = np.ones((1, 3), np.float32)
local = threading.local()


class CallsAtTeardown:
    def __del__(self):
        model(x)  # instrumented code while the thread's own state is being torn down


def work():
    model(x)
    local.guard = CallsAtTeardown()


for _ in range(50):
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
print("done")


import queue, threading, time
import numpy as np
import chainer, chainer.links as L

q = queue.Queue(maxsize=2)

def produce():
    rng = np.random.RandomState(0)
    for i in range(14):
        if i == 6:
            with open("paused_at", "w") as f:
                f.write(str(time.time()))
            time.sleep(4)
        q.put((rng.rand(8, 4).astype(np.float32), rng.randint(0, 2, 8).astype(np.int32)))
        time.sleep(0.02)

threading.Thread(target=produce, daemon=True).start()
model = L.Classifier(L.Linear(4, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
for _ in range(14):
    x, t = q.get()
    optimizer.update(model, x, t)
print("finished", flush=True)

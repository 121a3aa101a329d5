
import faulthandler, os, sys, time
import numpy as np
import chainer, chainer.links as L

model = L.Classifier(L.Linear(4, 2))
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
x = np.ones((8, 4), np.float32)
t = np.zeros(8, np.int32)
for step in range(30):
    optimizer.update(model, x, t)
    time.sleep(0.05)   # the watchdog keeps the timer set meanwhile
    if step == 10:
        pid = os.fork()
        if pid == 0:
            optimizer.update(model, x, t)
            sys.exit(0)          # a normal end: finalization runs
        assert os.waitpid(pid, 0)[1] == 0
        print("child ended", flush=True)
    if step == 20 and sys.argv[1] == "own":
        faulthandler.dump_traceback_later(3600)   # the program's own timer: it keeps it
        time.sleep(3)                             # no progress: a stall, reported
        faulthandler.cancel_dump_traceback_later()
print("finished", flush=True)

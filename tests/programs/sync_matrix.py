
import os
import sys

import numpy as np
import chainer
import chainer.links as L
import nvtx

import chainer_autoprof

log = os.environ["CHAINER_AUTOPROF_TEST_DEVICE_LOG"].replace("%p", str(os.getpid()))
x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
t = np.array([0, 1, 0, 1], np.int32)
for config in sys.argv[1:]:
    level, granularity = config.split(":")
    chainer_autoprof.install(sync_level=int(level), granularity=granularity, summary=False)
    nvtx.mark(message=config, domain="scenario")
    with open(log, "a") as f:
        f.write("# " + config + "\n")
    model = L.Classifier(L.Linear(3, 2))
    opt = chainer.optimizers.SGD()
    opt.setup(model)
    for _ in range(2):
        loss = model(x, t)
        model.cleargrads()
        loss.backward()
        opt.update()
    opt.update(model, x, t)
    chainer_autoprof.uninstall()
print("cupy" in sys.modules)

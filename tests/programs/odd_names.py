
import numpy as np
import chainer
import chainer.links as L

import chainer_autoprof

model = L.Classifier(L.Linear(3, 2))
model.predictor.name = "odd\udcffname"
optimizer = chainer.optimizers.SGD()
optimizer.setup(model)
with chainer_autoprof.annotate("step \udcff"):
    for _ in range(3):
        optimizer.update(model, np.ones((2, 3), np.float32), np.zeros(2, np.int32))
print("ok")


import chainer, cupy, numpy as np
import chainer.links as L
model = L.Classifier(L.Linear(512, 10))
model.to_gpu(0)
opt = chainer.optimizers.SGD()
opt.setup(model)
x = cupy.asarray(np.random.rand(256, 512).astype(np.float32))
t = cupy.asarray(np.random.randint(0, 10, 256).astype(np.int32))
for _ in range(30):
    opt.update(model, x, t)

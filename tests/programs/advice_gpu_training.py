
import numpy as np
import chainer, cupy
import chainer.functions as F
import chainer.links as L
from chainer.backends import cuda

class Net(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 8, 3)
            self.fc = L.Linear(None, 10)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)))

model = L.Classifier(Net())
model.to_gpu(0)
opt = chainer.optimizers.SGD()
opt.setup(model)
chainer.config.autotune = False
x = cupy.random.rand(8, 3, 16, 16).astype(np.float32)
t = cupy.zeros(8, dtype=np.int32)
extra = chainer.Parameter(cupy.zeros(3, dtype=np.float64))
with model.init_scope():
    model.extra = extra
for i in range(8):
    model.cleargrads()
    loss = model(x, t)
    loss.backward()
    print(float(cuda.to_cpu(loss.array)))
    opt.update()

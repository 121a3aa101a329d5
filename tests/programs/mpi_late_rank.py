
import os, sys
from mpi4py import MPI  # MPI is initialized: the launcher's variables are no longer needed
from chainer_autoprof.common.rank import LAUNCHER_VARS

for rank_var, size_var, _ in LAUNCHER_VARS:
    os.environ.pop(rank_var, None)
    if size_var:
        os.environ.pop(size_var, None)
import chainer_autoprof
chainer_autoprof.install(trace="run.json", summary=False)
import chainer, chainermn
import chainer.links as L
import numpy as np

comm = chainermn.create_communicator("naive")
model = L.Linear(3, 2)
optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
optimizer.setup(model)
x = np.ones((2, 3), np.float32)
for _ in range(3):
    optimizer.update(lambda: chainer.functions.sum(model(x)))

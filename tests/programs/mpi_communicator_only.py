
import os
import sys

import chainermn
from mpi4py import MPI  # MPI is initialized: the launcher's variables are no longer needed

from chainer_autoprof.common.rank import LAUNCHER_VARS

for rank_var, size_var, _ in LAUNCHER_VARS:  # hide every launcher: only the communicator tells
    os.environ.pop(rank_var, None)
    if size_var:
        os.environ.pop(size_var, None)
comm = chainermn.create_communicator("naive")
import chainer
import chainer.links as L
import numpy as np

model = L.Linear(3, 2)
optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
optimizer.setup(model)
x = np.ones((2, 3), np.float32)
for _ in range(3):
    optimizer.update(lambda: chainer.functions.sum(model(x)))
sys.stdout.write(f"rank {comm.rank} of {comm.size}\n")  # one write: ranks share stdout
sys.stdout.flush()

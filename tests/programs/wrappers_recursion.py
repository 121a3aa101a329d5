
import sys

import chainer

import chainer_autoprof


class Nested(chainer.Chain):
    """Calls itself until Python says no more."""

    def forward(self, depth):
        depth[0] += 1
        return self(depth)


def reach():
    depth = [0]
    try:
        Nested()(depth)
    except RecursionError:
        pass
    return depth[0]


plain = reach()
out = [str(plain)]
for granularity in sys.argv[1:]:
    chainer_autoprof.install(granularity=granularity, summary=False)
    out.append(str(reach()))
    chainer_autoprof.uninstall()
print(" ".join(out))

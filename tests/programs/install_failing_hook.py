
import chainer_autoprof.patches.chainer as chainer_patches


def broken(self, chainer):
    raise RuntimeError("instrumenting failed")


chainer_patches.ChainerPatches.apply = broken

# include: install_model

step(*new_model())
print("Link.__call__ untouched:", type(chainer.Link.__dict__["__call__"]).__name__)

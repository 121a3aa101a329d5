
import chainer.dataset.convert

import chainer_autoprof.patches.base as patch_base

del chainer.dataset.convert._call_converter  # a target this Chainer lacks
real_replace = patch_base.replace_attribute


def refusing(owner, name, wrapper):
    if name == "backward":
        raise RuntimeError("refused")
    return real_replace(owner, name, wrapper)


patch_base.replace_attribute = refusing
import chainer_autoprof

chainer_autoprof.install(log="debug", summary=False)

# include: install_model

model, opt = new_model()
for _ in range(3):
    step(model, opt)

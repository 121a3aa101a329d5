
import sys

import chainer_autoprof

print("chainer imported at start:", "chainer" in sys.modules)

# include: install_model

print("Link.__call__ wrapped at import:",
      getattr(chainer.Link.__dict__["__call__"], "_chainer_autoprof_switch", None) is not None)
model, opt = new_model()


@chainer_autoprof.annotate("train_step")
def train_step():
    step(model, opt)


train_step()
with chainer_autoprof.annotate("eval"):
    with chainer.using_config("train", False):
        model(x, t)
with chainer_autoprof.annotate("fwd"):  # the iteration it opens ends with the block
    loss = model(x, t)
model.cleargrads()
loss.backward()
opt.update()
chainer_autoprof.uninstall()
with chainer_autoprof.annotate("no agent"):
    step(model, opt)
print("done")

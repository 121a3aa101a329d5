
# include: install_model

import chainer_autoprof

real = chainer.__version__
chainer.__version__ = "99.0.0"
chainer_autoprof.install()
chainer_autoprof.uninstall()
chainer_autoprof.install()  # the same warning is not repeated
step(*new_model())
print("Link.__call__ untouched:", type(chainer.Link.__dict__["__call__"]).__name__)

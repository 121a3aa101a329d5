
# include: install_model

import sys

import nvtx
import chainer.dataset
import chainer.iterators
import chainer.optimizers
import chainer.training
import chainer.training.extensions
import chainer.training.updaters
import chainer._backprop_utils

import chainer_autoprof


def mark(name):
    nvtx.mark(message=name, domain="scenario")


def ours(obj):
    """Whether obj is a wrapper of the agent's (either implementation of the hot path)."""
    return getattr(obj, "_chainer_autoprof_switch", None) is not None


def routines():
    """Every attribute of Chainer's modules and classes (and Old), with the routines' identity."""
    seen = {}
    classes = [Old]
    for name, module in sorted(sys.modules.items()):
        if module is None or not (name == "chainer" or name.startswith("chainer.")):
            continue
        for key, value in vars(module).items():
            seen[(name, key)] = value
            if isinstance(value, type) and value.__module__.startswith("chainer"):
                classes.append(value)
    for cls in classes:
        for key, value in vars(cls).items():
            seen[(cls.__module__, cls.__qualname__, key)] = value
    return seen


def differences(before, after):
    """Keys added or removed, and routines (or descriptors) that are not the same object."""
    out = sorted(str(k) for k in before.keys() ^ after.keys())
    for key, value in before.items():
        if key in after and callable(value) and after[key] is not value:
            out.append(str(key))
    return out


original = routines()
agent = chainer_autoprof.install(granularity="function", summary=False)
print("second install returns the same agent:",
      chainer_autoprof.install(granularity="link") is agent)


class OldAfter(Old):
    def __call__(self, x):
        return super().__call__(x)


wrapped_after = OldAfter.__dict__["__call__"]
print("class defined later wrapped:", ours(wrapped_after))
from chainer.dataset.iterator import Iterator
from chainer.iterators import SerialIterator
print("next alias shares the wrapper:", SerialIterator.__dict__["next"]
      is SerialIterator.__dict__["__next__"], ours(SerialIterator.__dict__["next"]))
mark("installed")
step(*new_model())
m = L.Classifier(OldAfter())
opt = chainer.optimizers.SGD()
opt.setup(m)
step(m, opt)
chainer_autoprof.uninstall()
print("restored after uninstall:", differences(original, routines()))
print("class defined later restored:",
      OldAfter.__dict__["__call__"] is wrapped_after.__wrapped__)
print("__init_subclass__ hook removed:", "__init_subclass__" not in chainer.Link.__dict__)
print("Iterator.next untouched:", Iterator.__dict__["next"] is original[
    ("chainer.dataset.iterator", "Iterator", "next")])
mark("uninstalled")
step(*new_model())
chainer_autoprof.install(granularity="link", summary=False)
mark("reinstalled")
step(*new_model())
chainer_autoprof.uninstall()
print("restored after the second uninstall:", differences(original, routines()))
mark("end")

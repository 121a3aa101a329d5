
import chainer_autoprof

first = chainer_autoprof.install(sync_level=1, granularity="link", summary=False)
print(chainer_autoprof.install() is first)                       # nothing asked: silent
print(chainer_autoprof.install(sync_level=1) is first)           # the same settings: silent
print(chainer_autoprof.install(sync_level=2, granularity="link") is first)
print(first.cfg.sync_level, first.cfg.granularity)


import sys

sys.modules["chainer"] = None  # "import chainer" now fails as where it is not installed
import chainer_autoprof

chainer_autoprof.install(summary=False)  # no CHAINER_PROF_* variable: no start-up activation
try:
    import chainer  # noqa: F401
except ImportError as exc:
    print("script goes on:", type(exc).__name__)

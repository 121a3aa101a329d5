"""``python -m chainer_autoprof [options] script.py [args]``: see :mod:`chainer_autoprof.cli`."""

import sys

from chainer_autoprof.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""A package named cupy that gives no GPU but has CuPy's memory pools, whose figures the
program sets as CuPy's would move (the machine has no GPU)."""


class ndarray:  # what code that checks for CuPy arrays asks for
    pass


class _Pool:
    """What CuPy's pools tell of themselves: bytes in use, bytes held (in use and cached)."""

    def __init__(self):
        self.used = 0
        self.held = 0

    def used_bytes(self):
        return self.used

    def total_bytes(self):
        return self.held


_POOL = _Pool()
_PINNED = _Pool()


def get_default_memory_pool():
    return _POOL


def get_default_pinned_memory_pool():
    return _PINNED

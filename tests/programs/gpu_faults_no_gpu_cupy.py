"""A package named cupy that gives no GPU (the machine has none)."""


class ndarray:  # what code that checks for CuPy arrays asks for
    pass

import atexit
atexit.register(print, "atexit ran")

def inner():
    raise ValueError("boom")

def outer():
    try:
        {}["missing"]
    except KeyError:
        inner()

outer()

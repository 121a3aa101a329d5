import atexit
atexit.register(print, "atexit ran")

def inner():
    raise ValueError("boom")

inner()

import atexit
atexit.register(print, "atexit ran")
def f():
    raise KeyboardInterrupt
f()

import sys, traceback
def hook(typ, value, tb):
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(tb)]
    print("hook", typ.__name__, value, frames)
sys.excepthook = hook
raise RuntimeError("x")

import os, pickle, sys

class Point:
    def __init__(self, x):
        self.x = x

print("argv", sys.argv)
print("path0", sys.path[0])
print("name", __name__, "file", __file__)
print("pickled", type(pickle.loads(pickle.dumps(Point(2)))).__module__)
print("env", sorted((k, v) for k, v in os.environ.items() if k.startswith("CHAINER_PROF_")
                    and k not in ("CHAINER_PROF_SUMMARY", "CHAINER_PROF_ENABLE")))
sys.exit(int(os.environ.get("EXIT_WITH", "0")))

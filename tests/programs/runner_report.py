import sys, __main__
print("argv", sys.argv)
print("path", sys.path)
print("name", __name__, "file", __file__, "package", __package__)
print("spec", None if __spec__ is None else (__spec__.name, __spec__.origin))
print("loader", type(__loader__).__name__, getattr(__loader__, "name", None),
      getattr(__loader__, "path", None))
print("cached", __cached__, "builtins", __builtins__ is __import__("builtins"))
print("globals", sorted(globals()))
print("main", sys.modules["__main__"] is __main__ and __main__.__dict__ is globals())

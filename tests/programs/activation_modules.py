import json, sys
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in ("chainer_autoprof", "wrapt", "chainer"))))

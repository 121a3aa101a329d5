import json, sys
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in ("chainer_autoprof", "wrapt", "chainer"))))
import sitecustomize
print(getattr(sitecustomize, "MARK", None))
import chainer_autoprof.agent as agent
print(agent.current() is not None)

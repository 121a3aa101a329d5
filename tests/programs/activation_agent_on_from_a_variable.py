import json, sys
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in ("chainer_autoprof", "wrapt", "chainer"))))
import chainer_autoprof.agent as agent
print(agent.current() is not None, agent.current().cfg.granularity)

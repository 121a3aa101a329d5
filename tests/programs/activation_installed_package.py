# include: activation_train
import chainer_autoprof, chainer_autoprof.agent as agent
print(chainer_autoprof.__file__, agent.current() is not None)

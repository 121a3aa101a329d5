
class AutoEncoder(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.encoder = L.Linear(8, 3)
            self.decoder = L.Linear(3, 8)
            self.critic = L.Linear(3, 1)


ae = AutoEncoder()
optimizers = []
for part in (ae.encoder, ae.decoder, ae.critic):  # one optimizer per part of one model
    opt = chainer.optimizers.SGD(lr=0.01)
    opt.setup(part)
    optimizers.append(opt)
for step in range(10):
    x = X[step * 16:(step + 1) * 16]
    h = ae.encoder(x)
    loss = F.mean_squared_error(ae.decoder(h), x) + F.sum(ae.critic(h)) * 0.01
    ae.cleargrads()
    loss.backward()
    for opt in optimizers:
        opt.update()
print("done")

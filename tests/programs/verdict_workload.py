
import argparse
import time

import numpy as np

import chainer
import chainer.functions as F
import chainer.links as L
from chainer import training
from chainer.training import extensions

p = argparse.ArgumentParser()
p.add_argument("model", choices=["mlp", "big", "deep", "cheap"])
p.add_argument("--iterations", type=int, default=25)
p.add_argument("--epochs", type=int, default=0)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--width", type=int, default=8, help="mlp: inputs (hidden: 4x)")
p.add_argument("--examples", type=int, default=256)
p.add_argument("--delay", type=float, default=0.0, help="seconds per example loaded")
p.add_argument("--iterator", choices=["serial", "thread"], default="serial")
p.add_argument("--slow-extension", type=float, default=0.0, help="seconds per iteration")
p.add_argument("--evaluator", choices=["none", "standard", "keeps-graph"], default="none")
p.add_argument("--first-call-sleep", type=float, default=0.0)
p.add_argument("--type-check", type=int, default=1)
args = p.parse_args()
chainer.config.type_check = bool(args.type_check)
np.random.seed(0)


class MLP(chainer.Chain):
    def __init__(self, n_in, n_hidden, n_out, first_call_sleep=0.0):
        super().__init__()
        self.first_call_sleep = first_call_sleep
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_hidden)
            self.l2 = L.Linear(n_hidden, n_out)

    def forward(self, x):
        if self.first_call_sleep:  # a one-time cost, as lazy set-up or autotune would be
            time.sleep(self.first_call_sleep)
            self.first_call_sleep = 0.0
        return self.l2(F.relu(self.l1(x)))


class Deep(chainer.ChainList):
    def __init__(self, depth, width, n_out):
        super().__init__(*[L.Linear(width, width) for _ in range(depth - 1)],
                         L.Linear(width, n_out))

    def forward(self, x):
        for layer in self[:-1]:
            x = F.relu(layer(x))
        return self[-1](x)


class Cheap(chainer.Chain):
    """Many calls of cheap functions (where, scale), whose type checks show."""

    def __init__(self, n_in, n_out, count):
        super().__init__()
        self.count = count
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_out)

    def forward(self, x):
        h = self.l1(x)
        for _ in range(self.count):
            h = F.where(h.array > 0, h, h * 0.5)
        return h


class SlowDataset(chainer.dataset.DatasetMixin):
    def __init__(self, x, t, delay):
        self.x, self.t, self.delay = x, t, delay

    def __len__(self):
        return len(self.x)

    def get_example(self, i):
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.t[i]


class KeepsGraphEvaluator(extensions.Evaluator):
    """An evaluator written by hand that forgets no_backprop_mode."""

    def evaluate(self):
        model = self.get_target("main")
        summary = chainer.reporter.DictSummary()
        it = self.get_iterator("main")
        it.reset()
        for batch in it:
            x, t = self.converter(batch, self.device)
            observation = {}
            with chainer.reporter.report_scope(observation):
                model(x, t)
            summary.add(observation)
        return summary.compute_mean()


n_in, n_out = (256, 10) if args.model == "big" else (args.width, 4)
if args.model == "big":
    predictor = MLP(n_in, 1024, n_out)
elif args.model == "deep":
    predictor = Deep(40, n_in, n_out)
elif args.model == "cheap":
    predictor = Cheap(n_in, n_out, 60)
else:
    predictor = MLP(n_in, 4 * n_in, n_out, args.first_call_sleep)
model = L.Classifier(predictor)
optimizer = chainer.optimizers.SGD(lr=0.01)
optimizer.setup(model)

x = np.random.rand(args.examples, n_in).astype(np.float32)
t = np.random.randint(0, n_out, size=args.examples).astype(np.int32)
train = SlowDataset(x, t, args.delay)
if args.iterator == "thread":
    train_iter = chainer.iterators.MultithreadIterator(train, args.batch, n_threads=8)
else:
    train_iter = chainer.iterators.SerialIterator(train, args.batch)
updater = training.updaters.StandardUpdater(train_iter, optimizer)
stop = (args.epochs, "epoch") if args.epochs else (args.iterations, "iteration")
trainer = training.Trainer(updater, stop, out="result")
if args.slow_extension:
    class SlowReport(training.Extension):
        trigger = (1, "iteration")

        def __call__(self, trainer):
            time.sleep(args.slow_extension)

    trainer.extend(SlowReport())
if args.evaluator != "none":
    test = chainer.datasets.TupleDataset(x[:64], t[:64])
    test_iter = chainer.iterators.SerialIterator(test, 16, repeat=False, shuffle=False)
    cls = KeepsGraphEvaluator if args.evaluator == "keeps-graph" else extensions.Evaluator
    trainer.extend(cls(test_iter, model), trigger=(10, "iteration"))
trainer.run()
print("iterations", updater.iteration, "epoch", updater.epoch)

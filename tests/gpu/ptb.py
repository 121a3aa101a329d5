"""On a GPU machine (tests/gpu/run.sh): a host-bound RNN language model of the shapes of
Chainer's PTB example (``train_ptb.py -e 1 -b 20 -l 35 --unit 200``: a 10,000-word
vocabulary, two LSTM layers of 200 units, truncated backprop over 35 steps, batch 20, one
epoch, then the evaluation of a validation set) on a synthetic corpus of those shapes (the
GPU machine reaches no dataset).  About 2,500 small kernels per iteration: the GPU waits
for Python, the case where GPU activity must cost little.  As in the example, LogReport
sums the reported loss and accuracy after every iteration (on the GPU: a few kernels
between iterations, in every buffer of CUPTI's).

    python tests/gpu/ptb.py --words 70000      # one epoch of 100 iterations

Prints ``iterations N training_s T`` at the end: the training loop's wall time up to the
evaluation.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
from chainer import training
from chainer.training import extensions


class RNNLM(chainer.Chain):
    def __init__(self, n_vocab: int, n_units: int) -> None:
        super().__init__()
        with self.init_scope():
            self.embed = L.EmbedID(n_vocab, n_units)
            self.l1 = L.LSTM(n_units, n_units)
            self.l2 = L.LSTM(n_units, n_units)
            self.l3 = L.Linear(n_units, n_vocab)
        for param in self.params():
            param.array[...] = np.random.uniform(-0.1, 0.1, param.shape)

    def reset_state(self) -> None:
        self.l1.reset_state()
        self.l2.reset_state()

    def forward(self, x):
        h0 = self.embed(x)
        h1 = self.l1(F.dropout(h0))
        h2 = self.l2(F.dropout(h1))
        return self.l3(F.dropout(h2))


class Sequential(chainer.dataset.Iterator):
    """``batch`` cursors spread over the corpus, each reading the next word (the example's
    ParallelSequentialIterator)."""

    def __init__(self, words, batch: int, repeat: bool = True) -> None:
        self.words, self.batch_size, self.repeat = words, batch, repeat
        self.epoch, self.iteration, self.is_new_epoch = 0, 0, False
        self.offsets = [i * len(words) // batch for i in range(batch)]

    def __next__(self):
        n = len(self.words)
        if not self.repeat and self.iteration * self.batch_size >= n:
            raise StopIteration
        cur = [(o + self.iteration) % n for o in self.offsets]
        nxt = [(o + self.iteration + 1) % n for o in self.offsets]
        self.iteration += 1
        epoch = self.iteration * self.batch_size // n
        self.is_new_epoch = self.epoch < epoch
        self.epoch = epoch
        return list(zip(self.words[cur], self.words[nxt]))

    @property
    def epoch_detail(self) -> float:
        return self.iteration * self.batch_size / len(self.words)

    def reset(self) -> None:
        self.iteration, self.epoch, self.is_new_epoch = 0, 0, False


class BPTTUpdater(training.updaters.StandardUpdater):
    def __init__(self, iterator, optimizer, bprop_len: int, device: int) -> None:
        super().__init__(iterator, optimizer, device=device)
        self.bprop_len = bprop_len

    def update_core(self) -> None:
        loss = 0
        it = self.get_iterator("main")
        opt = self.get_optimizer("main")
        for _ in range(self.bprop_len):
            x, t = self.converter(it.__next__(), self.device)
            loss += opt.target(chainer.Variable(x), chainer.Variable(t))
        opt.target.cleargrads()
        loss.backward()
        loss.unchain_backward()
        opt.update()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--words", type=int, default=70_000, help="training corpus size")
    parser.add_argument("--vocab", type=int, default=10_000)
    parser.add_argument("--unit", type=int, default=200)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--bproplen", type=int, default=35)
    parser.add_argument("--device", type=int, default=0, help="-1: the CPU (a quick check)")
    args = parser.parse_args()
    device = args.device

    def synchronize() -> None:
        if device >= 0:
            import cupy

            cupy.cuda.Device(device).synchronize()

    rng = np.random.RandomState(0)
    train = rng.randint(0, args.vocab, args.words).astype(np.int32)
    val = rng.randint(0, args.vocab, args.words // 12).astype(np.int32)
    model = L.Classifier(RNNLM(args.vocab, args.unit))
    if device >= 0:
        chainer.backends.cuda.get_device_from_id(device).use()
        model.to_gpu(device)
    eval_model = model.copy()
    eval_model.predictor.train = False
    opt = chainer.optimizers.SGD(lr=1.0)
    opt.setup(model)
    opt.add_hook(chainer.optimizer_hooks.GradientClipping(5))
    it = Sequential(train, args.batch)
    iterations = args.words // (args.batch * args.bproplen)
    out = tempfile.mkdtemp(prefix="ptb-")  # (LogReport's file: not in the checkout)
    trainer = training.Trainer(BPTTUpdater(it, opt, args.bproplen, device),
                               (iterations, "iteration"), out=out)
    trainer.extend(extensions.LogReport(trigger=(10, "iteration")))
    marks: dict[str, float] = {}

    def before_evaluation(_evaluator) -> None:
        synchronize()
        marks.setdefault("trained", time.perf_counter())
        eval_model.predictor.reset_state()

    trainer.extend(extensions.Evaluator(Sequential(val, 1, repeat=False), eval_model,
                                        device=device,
                                        eval_hook=before_evaluation),
                   trigger=(iterations, "iteration"))
    t0 = time.perf_counter()
    trainer.run()
    shutil.rmtree(out, ignore_errors=True)
    print(f"iterations {iterations} training_s {marks['trained'] - t0:.3f}", flush=True)


if __name__ == "__main__":
    main()

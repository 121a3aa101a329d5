import os
import signal
import sys

pattern, checkpoint, activation = sys.argv[1], sys.argv[2], sys.argv[3]


def save():
    with open(checkpoint, "w") as f:
        f.write("weights\n")


def save_and_exit(signum, frame):
    save()
    sys.exit(143)


if pattern == "before":  # the program's handler first (before install() where it calls it)
    signal.signal(signal.SIGTERM, save_and_exit)
if activation == "install":
    import chainer_autoprof
    chainer_autoprof.install()
# include: exit_status_train
if pattern == "if default" and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    signal.signal(signal.SIGTERM, save_and_exit)
for _ in range(3):
    step()
print("default" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else "handled", flush=True)
if pattern == "chained":  # after training began, calling the handler it found first
    found = signal.getsignal(signal.SIGTERM)

    def chained(signum, frame):
        if callable(found):
            found(signum, frame)
        save()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, chained)
print("training", flush=True)
while True:
    step()

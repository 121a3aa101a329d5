import faulthandler
import sys
import time

# include: exit_status_train

faulthandler.dump_traceback_later(5, exit=True)  # the program's own watchdog, set first
import chainer_autoprof  # noqa: E402

chainer_autoprof.install(stall=float(sys.argv[1]))
for _ in range(5):
    step()
print("hanging", flush=True)
time.sleep(12)  # its watchdog ends it after 5 s
print("not ended by its own watchdog", flush=True)

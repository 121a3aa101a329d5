import os
import sys
import time

# include: exit_status_train

image = int(sys.argv[1])
for _ in range(5 if image == 1 else 7):
    step()
time.sleep(0.3)  # the trace so far is written meanwhile
print(f"image {image}", flush=True)
if image == 1:  # a restart wrapper: the same program again, in this process
    if sys.argv[2] == "execv":
        os.execv(sys.executable, [sys.executable, sys.argv[0], "2", "execv"])
    else:
        os.execlpe("python3", "python3", sys.argv[0], "2", "execlpe", dict(os.environ))

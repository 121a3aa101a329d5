"""A small Classifier trained by hand, 150 steps; one pause in module-level code between two
steps, long enough for a stall report (the launcher's own frames lie under this one)."""

import sys
import time

# include: classifier_small
pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
for i in range(150):
    optimizer.update(model, x, t)
    if i == 20 and pause:
        time.sleep(pause)

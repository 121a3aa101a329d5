import json
import threading
import time

# include: exit_status_train


def switches():
    """Voluntary context switches of each thread of the agent's (one per wake-up)."""
    counts = {}
    for thread in threading.enumerate():
        if thread.name.startswith("chainer_autoprof"):
            with open(f"/proc/self/task/{thread.native_id}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        counts[thread.name] = int(line.split()[1])
    return counts


for _ in range(5):
    step()
time.sleep(0.5)
before = switches()
time.sleep(3)  # the program idles: nothing asks the agent's threads to run
after = switches()
print(json.dumps({name: after[name] - before.get(name, 0) for name in after}))

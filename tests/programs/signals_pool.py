import multiprocessing as mp
import os
import signal
import sys
import time

# include: exit_status_train


def sleep_long():
    time.sleep(60)


def square(v):
    return v * v


if __name__ == "__main__":
    for _ in range(3):
        step()  # the parent trains: the agent has a run to save
    ctx = mp.get_context("fork")
    alive = 0
    for _ in range(int(sys.argv[1])):
        child = ctx.Process(target=sleep_long)
        child.start()
        os.kill(child.pid, signal.SIGTERM)  # at once: the child may not have run a line yet
        child.join(2)
        if child.is_alive():
            alive += 1
            child.kill()
            child.join()
    print("alive", alive, flush=True)
    for _ in range(int(sys.argv[2])):
        with ctx.Pool(2) as pool:  # its exit terminates the workers (SIGTERM)
            assert pool.map(square, range(8)) == [v * v for v in range(8)]
    print("pools done", flush=True)

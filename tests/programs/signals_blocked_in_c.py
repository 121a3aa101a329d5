import ctypes
import signal
import sys

# include: exit_status_train
if sys.argv[1] == "trains":
    for _ in range(3):
        step()
print("default" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else "handled", flush=True)
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # a pthread_mutex_t, zeroed: a plain mutex
libc.pthread_mutex_lock(mutex)
print("blocked", flush=True)
libc.pthread_mutex_lock(mutex)  # blocks in C for good: only a signal's default action ends it

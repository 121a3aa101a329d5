/*
 * term_guard.c -- SIGTERM at the default disposition, with the agent's end written and the
 * kill never held up (the lifecycle's exit.py drives it; nothing of the hot path).
 *
 * A handler set with signal.signal() is Python-level: CPython's C handler only notes the
 * signal, and the process lives on until the main thread runs bytecode again -- never, while
 * C code holds it (a native mutex, a long call).  The default action kills at once.  So the
 * guard is C: sigaction's handler here (Python's own table still says SIG_DFL, so a program
 * that installs its handler "if default" does, and replaces this one) notes the signal,
 * trips a private signal whose Python handler runs the agent's end (PyErr_SetInterruptEx:
 * async-signal-safe; a blocking call it interrupted then runs that handler), and wakes the
 * reaper: a thread of ours, blocked in read() until then, with every signal blocked.  The
 * reaper gives the end GRACE seconds to begin and LIMIT seconds to finish, then restores the
 * default action and sends SIGTERM again: the process dies by it as it would have.
 *
 * A second SIGTERM kills at once.  A forked child gets the default action back inside
 * fork() (pthread_atfork), and a signal caught before that in another process than the one
 * that armed the guard is the default action too.
 */

#include "native.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

static volatile sig_atomic_t armed = 0;      /* our handler is (meant to be) installed */
static volatile sig_atomic_t fired = 0;      /* SIGTERM came */
static volatile sig_atomic_t finishing = 0;  /* the Python side began the agent's end */
static volatile pid_t owner = 0;             /* the process that armed the guard */
static int notice_signal = 0;                /* the private signal (0: none) */
static double grace_s = 0.25, limit_s = 10.0;
static int wake[2] = {-1, -1};
static int reaper_running = 0;
static int atfork_registered = 0;

/* The default action, now: SIGTERM again with nothing in its way. */
static void die_by_sigterm(void)
{
    struct sigaction dfl;
    sigset_t term;

    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTERM, &dfl, NULL);
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_UNBLOCK, &term, NULL);  /* blocked while its handler runs */
    kill(getpid(), SIGTERM);
    _exit(128 + SIGTERM);  /* not reached: the signal is delivered before kill() returns */
}

static void on_term(int sig)
{
    int saved = errno;

    (void)sig;
    if (!armed || fired || getpid() != owner)
        die_by_sigterm();  /* a second SIGTERM, or a child before its fork hook ran */
    fired = 1;
#if PY_VERSION_HEX >= 0x030A0000
    if (notice_signal > 0)
        PyErr_SetInterruptEx(notice_signal);
#endif
    if (wake[1] >= 0) {
        char byte = 1;
        ssize_t n = write(wake[1], &byte, 1);
        (void)n;
    }
    errno = saved;
}

static double seconds_now(void) { return (double)now_ns() / 1e9; }

/* Sleep in steps of 1 ms until `flag` is set or `seconds` have passed; whether it was set. */
static int wait_for(volatile sig_atomic_t *flag, double seconds)
{
    double until = seconds_now() + seconds;
    struct timespec step = {0, 1000000};

    while (!*flag) {
        if (seconds_now() >= until)
            return 0;
        nanosleep(&step, NULL);
    }
    return 1;
}

static void *reaper(void *arg)
{
    char byte;

    (void)arg;
    for (;;) {
        ssize_t n = read(wake[0], &byte, 1);
        if (n == 1)
            break;
        if (n < 0 && errno == EINTR)
            continue;
        return NULL;  /* closed: disarmed for good */
    }
    if (!armed)
        return NULL;
    if (wait_for(&finishing, grace_s)) {
        volatile sig_atomic_t never = 0;
        wait_for(&never, limit_s);  /* the end is written meanwhile, and kills when done */
    }
    die_by_sigterm();
    return NULL;
}

static void after_fork_in_child(void)
{
    if (armed) {
        struct sigaction now;
        if (sigaction(SIGTERM, NULL, &now) == 0 && now.sa_handler == on_term) {
            struct sigaction dfl;
            memset(&dfl, 0, sizeof dfl);
            dfl.sa_handler = SIG_DFL;
            sigemptyset(&dfl.sa_mask);
            sigaction(SIGTERM, &dfl, NULL);
        }
    }
    armed = fired = finishing = 0;
    owner = 0;
    reaper_running = 0;  /* the parent's thread is not here */
    if (wake[0] >= 0)
        close(wake[0]);
    if (wake[1] >= 0)
        close(wake[1]);
    wake[0] = wake[1] = -1;
}

static int start_reaper(void)
{
    pthread_t thread;
    pthread_attr_t attr;
    sigset_t all, previous;
    int err;

    if (reaper_running)
        return 0;
    if (wake[0] < 0 && pipe2(wake, O_CLOEXEC) < 0)
        return -1;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &previous);  /* inherited: no signal goes to the reaper */
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    err = pthread_create(&thread, &attr, reaper, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (err != 0)
        return -1;
    reaper_running = 1;
    return 0;
}

/* term_arm(notice, grace, limit) -> bool: the guard on SIGTERM, where its action is the
 * default one (False: it is not, or the guard could not be made). */
static PyObject *term_arm(PyObject *self, PyObject *args)
{
    int notice;
    double grace, limit;
    struct sigaction now, ours;

    (void)self;
    if (!PyArg_ParseTuple(args, "idd", &notice, &grace, &limit))
        return NULL;
    if (armed && owner == getpid())
        Py_RETURN_TRUE;
    if (sigaction(SIGTERM, NULL, &now) < 0 || (now.sa_flags & SA_SIGINFO)
        || now.sa_handler != SIG_DFL)
        Py_RETURN_FALSE;
    if (!atfork_registered) {
        if (pthread_atfork(NULL, NULL, after_fork_in_child) != 0)
            Py_RETURN_FALSE;
        atfork_registered = 1;
    }
    if (start_reaper() < 0)
        Py_RETURN_FALSE;
    notice_signal = notice;
    grace_s = grace;
    limit_s = limit;
    fired = finishing = 0;
    owner = getpid();
    armed = 1;
    memset(&ours, 0, sizeof ours);
    ours.sa_handler = on_term;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = 0;  /* no SA_RESTART: a blocking call returns, and runs the notice */
    if (sigaction(SIGTERM, &ours, NULL) < 0) {
        armed = 0;
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* term_disarm(): the default action back, if the handler there is still ours. */
static PyObject *term_disarm(PyObject *self, PyObject *unused)
{
    struct sigaction now;

    (void)self;
    (void)unused;
    if (armed && !fired && sigaction(SIGTERM, NULL, &now) == 0 && now.sa_handler == on_term) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(SIGTERM, &dfl, NULL);
    }
    if (!fired)
        armed = 0;
    Py_RETURN_NONE;
}

static PyObject *term_fired(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyBool_FromLong(fired && owner == getpid());
}

/* term_finishing(): the agent's end has begun (the reaper gives it LIMIT seconds). */
static PyObject *term_finishing(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    finishing = 1;
    Py_RETURN_NONE;
}

static int run_pending(void *callable)
{
    PyObject *out = PyObject_CallNoArgs((PyObject *)callable);

    Py_DECREF((PyObject *)callable);
    if (out == NULL) {
        PyErr_Clear();  /* ours, never the program's: the callable says its own errors */
        return 0;
    }
    Py_DECREF(out);
    return 0;
}

/* call_on_main(callable) -> bool: run callable() on the main thread, as soon as it runs
 * Python code (or a blocking call of it is interrupted by a signal). */
static PyObject *call_on_main(PyObject *self, PyObject *callable)
{
    (void)self;
    Py_INCREF(callable);
    if (Py_AddPendingCall(run_pending, callable) < 0) {
        Py_DECREF(callable);
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef term_guard_methods[] = {
    {"term_arm", term_arm, METH_VARARGS,
     "term_arm(notice, grace, limit) -> bool: SIGTERM's default action guarded."},
    {"term_disarm", term_disarm, METH_NOARGS, "The default action back (if ours is there)."},
    {"term_fired", term_fired, METH_NOARGS, "Whether SIGTERM came since the guard was armed."},
    {"term_finishing", term_finishing, METH_NOARGS, "The agent's end has begun."},
    {"call_on_main", call_on_main, METH_O, "Run callable() on the main thread, soon."},
    {NULL}
};

int term_guard_ready(PyObject *module)
{
    return PyModule_AddFunctions(module, term_guard_methods);
}

/* cupti_fake.c -- a libcupti for machines without a GPU: it serves recorded CUPTI activity
 * (tests/data/gpu/cupti, written out by tests/cupti_fake.py) as CUPTI's own record structs.
 *
 * It implements the CUPTI functions chainer_autoprof's native reader calls (activity
 * callbacks, enable/disable per kind, the per-call API switches, flushes, the next-record
 * walk, the dropped count, timestamps, thread id type, result strings), so that reader runs
 * exactly as on a GPU: buffers requested through its callback, filled here with
 * CUpti_ActivityKernel13 / Memcpy7 / Memset5 / API records (only those of the enabled kinds
 * and calls), handed back through its completion callback on a thread of this library's
 * own, or on the caller's in cuptiActivityFlushAll.
 *
 * Control (ctypes, in the same process; dlopen of the same path gives the same library):
 *   cupti_fake_load(path)             the record stream (format: tests/cupti_fake.py)
 *   cupti_fake_clock(c0, p0, c1, p1)  cuptiGetTimestamp = the line through the recorded
 *                                     (CUPTI ns, perf_counter ns) pairs at CLOCK_MONOTONIC now
 *   cupti_fake_prepare(pieces)        fills the buffers of the stream cut in `pieces` equal
 *                                     parts (CUPTI's work, on the calling thread)
 *   cupti_fake_serve(pace_us)         a thread hands them over, `pace_us` apart
 *   cupti_fake_wait()                 joins that thread
 *   cupti_fake_system_ids(on)         whether cuptiSetThreadIdType(SYSTEM) succeeds
 *   cupti_fake_clock_fails(on)        whether cuptiGetTimestamp fails (CUPTI_ERROR_UNKNOWN)
 *   cupti_fake_served()               records handed over so far
 *   cupti_fake_run(count)             the program runs on: the stream's next `count` entries
 *                                     happen now, kept as what is enabled now says, and are
 *                                     handed over at once, on the calling thread
 *   cupti_fake_enabled_kinds()        the enabled kinds, a bit per CUpti_ActivityKind
 *   cupti_fake_call_recorded(kind, cbid)  whether a call of that kind and id is recorded now
 * With CUPTI_FAKE_LOG set, every switch of a kind or a call appends a line to that file:
 * CLOCK_MONOTONIC ns (time.perf_counter_ns), the function, the kind or cbid, the value.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cupti_activity.h>
#include <cupti_result.h>

#define EXPORT __attribute__((visibility("default")))

/* One entry of the stream file: a CUPTI kind and up to 16 fields (tests/cupti_fake.py). */
typedef struct {
    int32_t kind;
    int32_t pad;
    int64_t f[16];
} entry;

static entry *stream;
static size_t n_stream, released, delivered, served;
static char **names;
static size_t n_names;
static pthread_mutex_t deliver_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t server;
static int serving;
static size_t pieces;
static long pace_us;
static int system_ids;
static volatile int clock_fails;
static uint32_t enabled_kinds;  /* bit per CUpti_ActivityKind < 32 */
/* One line per switch to $CUPTI_FAKE_LOG, where set (see the header). */
static void log_switch(const char *what, long id, int value)
{
    const char *path = getenv("CUPTI_FAKE_LOG");
    if (path == NULL || *path == '\0')
        return;
    FILE *f = fopen(path, "a");
    if (f == NULL)
        return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    fprintf(f, "%lld %s %ld %d\n", (long long)now.tv_sec * 1000000000LL + now.tv_nsec, what, id,
            value);
    fclose(f);
}

/* Each call's own switch (cuptiActivityEnableRuntimeApi / DriverApi): CALL_UNSET, CALL_ON,
 * CALL_OFF.  As CUPTI documents it: with its kind enabled a call is recorded unless switched
 * off; without, only if switched on; enabling the kind later overrides the switches. */
enum { CALL_UNSET, CALL_ON, CALL_OFF };
static uint8_t runtime_call[4096], driver_call[4096];
static int64_t clock_c0, clock_p0;
static double clock_drift; /* slope - 1 */

static CUpti_BuffersCallbackRequestFunc requested;
static CUpti_BuffersCallbackCompleteFunc completed;

/* The reader reads the oldest struct versions that hold its fields (Kernel9, Memcpy6,
 * Memset4); these records are the newest: the fields must lie at the same offsets. */
#define SAME_OFFSET(new_t, old_t, field) \
    _Static_assert(offsetof(new_t, field) == offsetof(old_t, field), #old_t "." #field)
#define SAME_HEAD(new_t, old_t) \
    SAME_OFFSET(new_t, old_t, start); SAME_OFFSET(new_t, old_t, end); \
    SAME_OFFSET(new_t, old_t, deviceId); SAME_OFFSET(new_t, old_t, contextId); \
    SAME_OFFSET(new_t, old_t, streamId); SAME_OFFSET(new_t, old_t, correlationId)
SAME_HEAD(CUpti_ActivityKernel13, CUpti_ActivityKernel9);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, name);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, gridX);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, gridY);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, gridZ);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, blockX);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, blockY);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, blockZ);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, registersPerThread);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, staticSharedMemory);
SAME_OFFSET(CUpti_ActivityKernel13, CUpti_ActivityKernel9, dynamicSharedMemory);
SAME_HEAD(CUpti_ActivityMemcpy7, CUpti_ActivityMemcpy6);
SAME_OFFSET(CUpti_ActivityMemcpy7, CUpti_ActivityMemcpy6, bytes);
SAME_OFFSET(CUpti_ActivityMemcpy7, CUpti_ActivityMemcpy6, copyKind);
SAME_OFFSET(CUpti_ActivityMemcpy7, CUpti_ActivityMemcpy6, srcKind);
SAME_OFFSET(CUpti_ActivityMemcpy7, CUpti_ActivityMemcpy6, dstKind);
SAME_HEAD(CUpti_ActivityMemset5, CUpti_ActivityMemset4);
SAME_OFFSET(CUpti_ActivityMemset5, CUpti_ActivityMemset4, bytes);
SAME_OFFSET(CUpti_ActivityMemset5, CUpti_ActivityMemset4, value);

static size_t record_size(CUpti_ActivityKind kind)
{
    size_t s;
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: s = sizeof(CUpti_ActivityKernel13); break;
    case CUPTI_ACTIVITY_KIND_MEMCPY: s = sizeof(CUpti_ActivityMemcpy7); break;
    case CUPTI_ACTIVITY_KIND_MEMSET: s = sizeof(CUpti_ActivityMemset5); break;
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: s = sizeof(CUpti_ActivityAPI); break;
    default: s = sizeof(CUpti_Activity); break;
    }
    return (s + 7) & ~(size_t)7;
}

static int wanted(const entry *e)
{
    int kind_on = e->kind < 32 && (enabled_kinds & (1u << e->kind));
    const uint8_t *calls = e->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? runtime_call
                           : e->kind == CUPTI_ACTIVITY_KIND_DRIVER ? driver_call : NULL;
    if (calls == NULL || e->f[3] < 0 || e->f[3] >= 4096)
        return kind_on;
    return kind_on ? calls[e->f[3]] != CALL_OFF : calls[e->f[3]] == CALL_ON;
}

/* Write entry `e` as CUPTI's struct at `p`. */
static void write_record(const entry *e, uint8_t *p)
{
    memset(p, 0, record_size((CUpti_ActivityKind)e->kind));
    const int64_t *f = e->f;
    switch (e->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        CUpti_ActivityKernel13 *k = (CUpti_ActivityKernel13 *)p;
        k->kind = (CUpti_ActivityKind)e->kind;
        k->start = (uint64_t)f[0];
        k->end = (uint64_t)f[1];
        k->correlationId = (uint32_t)f[2];
        k->deviceId = (uint32_t)f[3];
        k->contextId = (uint32_t)f[4];
        k->streamId = (uint32_t)f[5];
        k->name = f[6] >= 0 && (size_t)f[6] < n_names ? names[f[6]] : NULL;
        k->gridX = (int32_t)f[7];
        k->gridY = (int32_t)f[8];
        k->gridZ = (int32_t)f[9];
        k->blockX = (int32_t)f[10];
        k->blockY = (int32_t)f[11];
        k->blockZ = (int32_t)f[12];
        k->registersPerThread = (uint16_t)f[13];
        k->staticSharedMemory = (int32_t)f[14];
        k->dynamicSharedMemory = (int32_t)f[15];
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        CUpti_ActivityMemcpy7 *m = (CUpti_ActivityMemcpy7 *)p;
        m->kind = CUPTI_ACTIVITY_KIND_MEMCPY;
        m->start = (uint64_t)f[0];
        m->end = (uint64_t)f[1];
        m->correlationId = (uint32_t)f[2];
        m->deviceId = (uint32_t)f[3];
        m->contextId = (uint32_t)f[4];
        m->streamId = (uint32_t)f[5];
        m->bytes = (uint64_t)f[6];
        m->copyKind = (uint8_t)f[7];
        m->srcKind = (uint8_t)f[8];
        m->dstKind = (uint8_t)f[9];
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        CUpti_ActivityMemset5 *m = (CUpti_ActivityMemset5 *)p;
        m->kind = CUPTI_ACTIVITY_KIND_MEMSET;
        m->start = (uint64_t)f[0];
        m->end = (uint64_t)f[1];
        m->correlationId = (uint32_t)f[2];
        m->deviceId = (uint32_t)f[3];
        m->contextId = (uint32_t)f[4];
        m->streamId = (uint32_t)f[5];
        m->bytes = (uint64_t)f[6];
        m->value = (uint32_t)f[7];
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)p;
        a->kind = (CUpti_ActivityKind)e->kind;
        a->start = (uint64_t)f[0];
        a->end = (uint64_t)f[1];
        a->correlationId = (uint32_t)f[2];
        a->cbid = (CUpti_CallbackId)f[3];
        a->threadId = (uint32_t)f[4];
        a->processId = (uint32_t)getpid();
        break;
    }
    default: {
        CUpti_Activity *a = (CUpti_Activity *)p;
        a->kind = (CUpti_ActivityKind)e->kind;
    }
    }
}

/* Buffers filled ahead (cupti_fake_prepare): CUPTI's own work, done before the measured
 * handing over, as CUPTI fills its buffers while the program runs. */
typedef struct {
    uint8_t *buffer;
    size_t size, used, upto;
} filled;
static filled *ready;
static size_t n_ready, next_ready;

/* Request a buffer and fill it with released records from `delivered` on. */
static int fill(filled *out)
{
    uint8_t *buffer = NULL;
    size_t size = 0, max_records = 0, used = 0;
    requested(&buffer, &size, &max_records);
    if (buffer == NULL)
        return -1;
    while (delivered < released) {
        const entry *e = &stream[delivered];
        if (!wanted(e)) {
            delivered++;
            continue;
        }
        size_t need = record_size((CUpti_ActivityKind)e->kind);
        if (used + need > size)
            break;
        write_record(e, buffer + used);
        used += need;
        served++;
        delivered++;
    }
    out->buffer = buffer;
    out->size = size;
    out->used = used;
    out->upto = delivered;
    return 0;
}

/* Hand over the released records not yet handed over, in as many buffers as they fill. */
static void deliver(void)
{
    pthread_mutex_lock(&deliver_lock);
    while (delivered < released && requested != NULL && completed != NULL) {
        filled f;
        if (fill(&f) != 0)
            break;
        completed(NULL, 0, f.buffer, f.size, f.used);
    }
    pthread_mutex_unlock(&deliver_lock);
}

static void *serve(void *arg)
{
    (void)arg;
    for (size_t i = next_ready; i < n_ready; i++) {
        pthread_mutex_lock(&deliver_lock);
        filled f = ready[i];
        next_ready = i + 1;
        pthread_mutex_unlock(&deliver_lock);
        completed(NULL, 0, f.buffer, f.size, f.used);
        if (pace_us > 0 && i + 1 < n_ready)
            usleep((useconds_t)pace_us);
    }
    return NULL;
}

/* -- control ---------------------------------------------------------------------------- */
EXPORT int cupti_fake_load(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    int64_t count;
    int ok = fread(&count, sizeof count, 1, f) == 1 && count >= 0;
    names = ok ? calloc((size_t)count + 1, sizeof(char *)) : NULL;
    n_names = ok ? (size_t)count : 0;
    for (size_t i = 0; ok && i < n_names; i++) {
        int64_t len;
        ok = fread(&len, sizeof len, 1, f) == 1 && len >= 0;
        names[i] = ok ? calloc((size_t)len + 1, 1) : NULL;
        ok = ok && names[i] != NULL && fread(names[i], 1, (size_t)len, f) == (size_t)len;
    }
    ok = ok && fread(&count, sizeof count, 1, f) == 1 && count >= 0;
    stream = ok ? calloc((size_t)count + 1, sizeof(entry)) : NULL;
    ok = ok && stream != NULL && fread(stream, sizeof(entry), (size_t)count, f) == (size_t)count;
    n_stream = ok ? (size_t)count : 0;
    released = delivered = served = 0;
    fclose(f);
    return ok ? 0 : -1;
}

EXPORT void cupti_fake_clock(int64_t c0, int64_t p0, int64_t c1, int64_t p1)
{
    clock_c0 = c0;
    clock_p0 = p0;
    clock_drift = p1 != p0 ? (double)((c1 - c0) - (p1 - p0)) / (double)(p1 - p0) : 0.0;
}

/* Fill the buffers of the stream cut into `n_pieces` equal parts (one buffer each, more
 * where a part does not fit), on the calling thread; nothing is handed over yet. */
EXPORT int cupti_fake_prepare(long n_pieces)
{
    if (requested == NULL || completed == NULL)
        return -1;
    pieces = n_pieces > 0 ? (size_t)n_pieces : 1;
    pthread_mutex_lock(&deliver_lock);
    free(ready);
    ready = calloc(n_stream + pieces + 1, sizeof(filled));
    n_ready = next_ready = 0;
    int ok = ready != NULL;
    for (size_t i = 0; ok && i < pieces; i++) {
        released = n_stream * (i + 1) / pieces;
        while (ok && delivered < released)
            ok = fill(&ready[n_ready++]) == 0;
    }
    pthread_mutex_unlock(&deliver_lock);
    return ok ? 0 : -1;
}

/* Hand the prepared buffers over on a thread of this library's own, `pace` us apart. */
EXPORT int cupti_fake_serve(long pace)
{
    pace_us = pace;
    serving = pthread_create(&server, NULL, serve, NULL) == 0;
    return serving ? 0 : -1;
}

EXPORT void cupti_fake_wait(void)
{
    if (serving)
        pthread_join(server, NULL);
    serving = 0;
}

EXPORT void cupti_fake_system_ids(int on) { system_ids = on; }
EXPORT void cupti_fake_clock_fails(int on) { clock_fails = on; }

EXPORT long cupti_fake_served(void) { return (long)served; }

EXPORT void cupti_fake_run(long count)
{
    pthread_mutex_lock(&deliver_lock);
    released = count < 0 || released + (size_t)count > n_stream ? n_stream
                                                               : released + (size_t)count;
    pthread_mutex_unlock(&deliver_lock);
    deliver();
}

EXPORT unsigned cupti_fake_enabled_kinds(void) { return enabled_kinds; }

EXPORT int cupti_fake_call_recorded(int kind, int cbid)
{
    entry e = {.kind = kind};
    e.f[3] = cbid;
    return wanted(&e);
}

/* -- CUPTI -------------------------------------------------------------------------------- */
EXPORT CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
                                                  CUpti_BuffersCallbackCompleteFunc comp)
{
    if (req == NULL || comp == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    requested = req;
    completed = comp;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind)
{
    if ((unsigned)kind >= 32)
        return CUPTI_ERROR_NOT_COMPATIBLE;
    log_switch("kind", (long)kind, 1);
    enabled_kinds |= 1u << kind;
    if (kind == CUPTI_ACTIVITY_KIND_RUNTIME)
        memset(runtime_call, CALL_UNSET, sizeof runtime_call);
    if (kind == CUPTI_ACTIVITY_KIND_DRIVER)
        memset(driver_call, CALL_UNSET, sizeof driver_call);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind)
{
    if ((unsigned)kind >= 32)
        return CUPTI_ERROR_NOT_COMPATIBLE;
    log_switch("kind", (long)kind, 0);
    enabled_kinds &= ~(1u << kind);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable)
{
    if (cbid >= 4096)
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (enable && getenv("CUPTI_FAKE_NO_CALL_SWITCH")) /* a libcupti that switches none on */
        return CUPTI_ERROR_NOT_SUPPORTED;
    runtime_call[cbid] = enable ? CALL_ON : CALL_OFF;
    log_switch("runtime", (long)cbid, enable != 0);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable)
{
    if (cbid >= 4096)
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (enable && getenv("CUPTI_FAKE_NO_CALL_SWITCH")) /* a libcupti that switches none on */
        return CUPTI_ERROR_NOT_SUPPORTED;
    driver_call[cbid] = enable ? CALL_ON : CALL_OFF;
    log_switch("driver", (long)cbid, enable != 0);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityFlushPeriod(uint32_t ms)
{
    (void)ms;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    (void)flag;
    deliver();
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid,
                                              CUpti_Activity **record)
{
    uint8_t *next = *record == NULL ? buffer
                                    : (uint8_t *)*record + record_size((*record)->kind);
    if (next + sizeof(CUpti_Activity) > buffer + valid)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id,
                                                     size_t *dropped)
{
    (void)context;
    (void)stream_id;
    *dropped = 0;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetTimestamp(uint64_t *timestamp)
{
    if (clock_fails)
        return CUPTI_ERROR_UNKNOWN;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t since = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec - clock_p0;
    *timestamp = (uint64_t)(clock_c0 + since + (int64_t)((double)since * clock_drift));
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiSetThreadIdType(CUpti_ActivityThreadIdType type)
{
    (void)type;
    return system_ids ? CUPTI_SUCCESS : CUPTI_ERROR_NOT_SUPPORTED;
}

EXPORT CUptiResult cuptiGetResultString(CUptiResult result, const char **text)
{
    switch (result) {
    case CUPTI_SUCCESS: *text = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_NOT_SUPPORTED: *text = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *text = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    default: *text = "CUPTI_ERROR_UNKNOWN"; break;
    }
    return CUPTI_SUCCESS;
}

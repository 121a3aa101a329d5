/*
 * nvtx_recorder.c -- a tiny NVTX v3 injection library for the test-suite.
 *
 * It records the exact stream of NVTX calls a profiler (Nsight Systems,
 * ...) would receive, without any GPU or NVIDIA tool.
 *
 * How NVTX v3 injection works (see nvtx3/nvtxDetail/nvtxInit.h, nvtxImpl.h):
 * every NVTX "copy" in the process (NVTX is header-only and its globals are
 * hidden, so each shared object using it -- every extension module of the
 * `nvtx` package, CuPy, ... -- has its own copy) starts with all its API
 * function pointers aimed at an init stub.  On the first NVTX call of a copy,
 * the stub dlopen()s the library named by $NVTX_INJECTION64_PATH and calls
 * its exported InitializeInjectionNvtx2(getExportTable).  The tool asks the
 * NVTX_ETID_CALLBACKS export table for the function tables of the modules
 * it handles (CORE: nvtxMarkA, nvtxRangePushA, ...; CORE2: nvtxDomain*) and
 * overwrites the slots it implements.  Slots left alone become no-ops.
 * dlopen() of an already loaded library returns the same handle, so all
 * copies share this library's state (one output file, one set of handles).
 *
 * Output: one line per event, appended to the file named by
 * $NVTX_RECORD_FILE ("%p" in the name is replaced by the pid; the file of a
 * fork()ed child is switched to the child's pid).  Tab-separated fields:
 *
 *     event  pid  tid  domain  text  color  category  id
 *
 *   event     push pop mark start end domain string category threadname
 *   pid, tid  getpid() and the kernel thread id (gettid)
 *   domain    name of the domain, "" for the default domain
 *   text      message (ASCII, Unicode converted to UTF-8, or the registered
 *             string resolved to its text); the domain name for "domain",
 *             the string for "string", the name for "category"/"threadname"
 *   color     0xAARRGGBB, or "-" when colorType is not NVTX_COLOR_ARGB
 *   category  decimal category id (0 = none)
 *   id        range id for start/end, the named OS thread id for
 *             threadname, "-" otherwise
 *
 * Backslash, tab, newline and carriage return in names and messages are
 * written as \\, \t, \n and \r.  Each line is written with a single write()
 * on an O_APPEND descriptor, so lines of concurrent threads never interleave.
 *
 * Build: gcc -shared -fPIC -O2 -pthread -I<dir containing nvtx3/> \
 *            -o libnvtx_recorder.so nvtx_recorder.c
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <wchar.h>

/* Tools include the NVTX headers without the implementation: this gives
 * the API types plus nvtxDetail/nvtxTypes.h (callback ids, export tables). */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

/* ------------------------------------------------------------------------ */
/* Handles                                                                  */
/* ------------------------------------------------------------------------ */

/* NVTX declares the handle structs but leaves their contents to the tool,
 * so a handle simply points at our own record.  Records are immutable once
 * created and never freed (nvtxDomainDestroy is ignored; registered strings
 * have no destroy API), so resolving a handle needs no lookup and no lock,
 * even from a fork()ed child or another NVTX copy of the process. */
struct nvtxDomainRegistration_st {
    struct nvtxDomainRegistration_st *next; /* list of all domains */
    char name[];
};

struct nvtxStringRegistration_st {
    const struct nvtxDomainRegistration_st *domain;
    char text[];
};

/* g_lock guards the domain list (nvtxDomainCreate returns the existing
 * handle for a known name) and the output file state. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static nvtxDomainHandle_t g_domains;

static const char *domain_name(nvtxDomainHandle_t domain)
{
    return domain ? domain->name : "";
}

static const char *string_text(nvtxStringHandle_t string)
{
    return string ? string->text : "";
}

/* ------------------------------------------------------------------------ */
/* Output file                                                              */
/* ------------------------------------------------------------------------ */

static int g_fd = -1;             /* -1: $NVTX_RECORD_FILE unset or unusable */
static int g_path_per_pid;        /* the file name contains %p */
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

/* Open $NVTX_RECORD_FILE for the current process, "%p" -> getpid(). */
static void open_record_file(void)
{
    const char *pattern = getenv("NVTX_RECORD_FILE");
    char path[4096];
    size_t n = 0;

    g_fd = -1;
    if (!pattern || !*pattern)
        return;
    g_path_per_pid = strstr(pattern, "%p") != NULL;
    for (const char *p = pattern; *p && n < sizeof(path) - 1; ++p) {
        if (p[0] == '%' && p[1] == 'p') {
            int w = snprintf(path + n, sizeof(path) - n, "%ld", (long)getpid());
            if (w < 0 || (size_t)w >= sizeof(path) - n)
                return; /* path too long */
            n += (size_t)w;
            ++p;
        } else {
            path[n++] = *p;
        }
    }
    if (n >= sizeof(path) - 1)
        return; /* path too long */
    path[n] = '\0';
    g_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

/* fork() handlers: hold g_lock across fork() so the child never inherits it
 * locked by a thread that does not exist there; then point the child at its
 * own file when the name is per pid (the child is single-threaded here). */
static void before_fork(void) { pthread_mutex_lock(&g_lock); }
static void after_fork_in_parent(void) { pthread_mutex_unlock(&g_lock); }
static void after_fork_in_child(void)
{
    pthread_mutex_unlock(&g_lock);
    if (g_path_per_pid) {
        if (g_fd >= 0)
            close(g_fd);
        open_record_file();
    }
}

static void init_once(void)
{
    open_record_file();
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

/* Append `s` to the line with \\, \t, \n, \r escaped. */
static void put_escaped(FILE *line, const char *s)
{
    for (; *s; ++s) {
        switch (*s) {
        case '\\': fputs("\\\\", line); break;
        case '\t': fputs("\\t", line); break;
        case '\n': fputs("\\n", line); break;
        case '\r': fputs("\\r", line); break;
        default: fputc(*s, line);
        }
    }
}

/* One recorded event; see the field list at the top of the file. */
typedef struct {
    const char *event;
    const char *domain;
    const char *text;
    int has_color;
    uint32_t color;
    uint32_t category;
    int has_id;
    uint64_t id;
} record_t;

static void record(const record_t *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *line;

    if (g_fd < 0)
        return;
    /* Build the whole line in memory, then write it with one write(). */
    line = open_memstream(&buf, &len);
    if (!line)
        return;
    fprintf(line, "%s\t%ld\t%ld\t", r->event, (long)getpid(), (long)syscall(SYS_gettid));
    put_escaped(line, r->domain);
    fputc('\t', line);
    put_escaped(line, r->text);
    if (r->has_color)
        fprintf(line, "\t0x%08x", (unsigned)r->color);
    else
        fputs("\t-", line);
    fprintf(line, "\t%u", (unsigned)r->category);
    if (r->has_id)
        fprintf(line, "\t%llu\n", (unsigned long long)r->id);
    else
        fputs("\t-\n", line);
    if (fclose(line) == 0) {
        ssize_t rc;
        do {
            rc = write(g_fd, buf, len);
        } while (rc < 0 && errno == EINTR);
    }
    free(buf);
}

/* ------------------------------------------------------------------------ */
/* Strings                                                                  */
/* ------------------------------------------------------------------------ */

/* wchar_t (UTF-32 on Linux) -> malloc'ed UTF-8; invalid code points -> U+FFFD. */
static char *utf8_from_wide(const wchar_t *ws)
{
    size_t n = ws ? wcslen(ws) : 0;
    char *out = malloc(4 * n + 1);
    char *p = out;

    if (!out)
        return NULL;
    for (size_t i = 0; i < n; ++i) {
        uint32_t c = (uint32_t)ws[i];
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            c = 0xFFFD;
        if (c < 0x80) {
            *p++ = (char)c;
        } else if (c < 0x800) {
            *p++ = (char)(0xC0 | (c >> 6));
            *p++ = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            *p++ = (char)(0xE0 | (c >> 12));
            *p++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (char)(0x80 | (c & 0x3F));
        } else {
            *p++ = (char)(0xF0 | (c >> 18));
            *p++ = (char)(0x80 | ((c >> 12) & 0x3F));
            *p++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (char)(0x80 | (c & 0x3F));
        }
    }
    *p = '\0';
    return out;
}

/* ------------------------------------------------------------------------ */
/* Event helpers                                                            */
/* ------------------------------------------------------------------------ */

/* Record an event described by an nvtxEventAttributes_t. */
static void record_attr(const char *event, nvtxDomainHandle_t domain,
                        const nvtxEventAttributes_t *attr, int has_id, uint64_t id)
{
    record_t r = {event, domain_name(domain), "", 0, 0, 0, has_id, id};
    char *wide_text = NULL;

    if (attr) {
        r.has_color = attr->colorType == NVTX_COLOR_ARGB;
        r.color = attr->color;
        r.category = attr->category;
        switch (attr->messageType) {
        case NVTX_MESSAGE_TYPE_ASCII:
            r.text = attr->message.ascii ? attr->message.ascii : "";
            break;
        case NVTX_MESSAGE_TYPE_UNICODE:
            wide_text = utf8_from_wide(attr->message.unicode);
            r.text = wide_text ? wide_text : "";
            break;
        case NVTX_MESSAGE_TYPE_REGISTERED:
            r.text = string_text(attr->message.registered);
            break;
        default: /* NVTX_MESSAGE_UNKNOWN or an extension type: no text */
            break;
        }
    }
    record(&r);
    free(wide_text);
}

/* Record an event that only has a name (and maybe a category or an id). */
static void record_text(const char *event, nvtxDomainHandle_t domain, const char *text,
                        uint32_t category, int has_id, uint64_t id)
{
    record_t r = {event, domain_name(domain), text ? text : "", 0, 0, category, has_id, id};
    record(&r);
}

/* Per-thread nesting level, returned by push/pop as NVTX specifies (one
 * counter for all domains: nobody in the test-suite relies on it). */
static __thread int t_depth;

static int push_level(void) { return t_depth++; }
static int pop_level(void) { return t_depth > 0 ? --t_depth : -1; }

static uint64_t g_next_range_id = 1;

static uint64_t new_range_id(void)
{
    return __atomic_fetch_add(&g_next_range_id, 1, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------------ */
/* CORE2 module: domains and registered strings                             */
/* ------------------------------------------------------------------------ */

static nvtxDomainHandle_t rec_DomainCreateA(const char *name)
{
    nvtxDomainHandle_t d;

    if (!name)
        name = "";
    pthread_mutex_lock(&g_lock);
    for (d = g_domains; d && strcmp(d->name, name) != 0; d = d->next)
        ;
    if (!d) {
        d = malloc(sizeof(*d) + strlen(name) + 1);
        if (d) {
            strcpy(d->name, name);
            d->next = g_domains;
            g_domains = d;
        }
    }
    pthread_mutex_unlock(&g_lock);
    record_text("domain", d, name, 0, 0, 0);
    return d;
}

static nvtxDomainHandle_t rec_DomainCreateW(const wchar_t *name)
{
    char *utf8 = utf8_from_wide(name);
    nvtxDomainHandle_t d = rec_DomainCreateA(utf8);
    free(utf8);
    return d;
}

static void rec_DomainDestroy(nvtxDomainHandle_t domain)
{
    (void)domain; /* keep it: events may still refer to it */
}

static nvtxStringHandle_t rec_DomainRegisterStringA(nvtxDomainHandle_t domain, const char *text)
{
    nvtxStringHandle_t s;

    if (!text)
        text = "";
    s = malloc(sizeof(*s) + strlen(text) + 1);
    if (s) {
        s->domain = domain;
        strcpy(s->text, text);
    }
    record_text("string", domain, text, 0, 0, 0);
    return s;
}

static nvtxStringHandle_t rec_DomainRegisterStringW(nvtxDomainHandle_t domain, const wchar_t *text)
{
    char *utf8 = utf8_from_wide(text);
    nvtxStringHandle_t s = rec_DomainRegisterStringA(domain, utf8);
    free(utf8);
    return s;
}

static void rec_DomainNameCategoryA(nvtxDomainHandle_t domain, uint32_t category, const char *name)
{
    record_text("category", domain, name, category, 0, 0);
}

static void rec_DomainNameCategoryW(nvtxDomainHandle_t domain, uint32_t category, const wchar_t *name)
{
    char *utf8 = utf8_from_wide(name);
    rec_DomainNameCategoryA(domain, category, utf8);
    free(utf8);
}

static void rec_DomainMarkEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attr)
{
    record_attr("mark", domain, attr, 0, 0);
}

static int rec_DomainRangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attr)
{
    record_attr("push", domain, attr, 0, 0);
    return push_level();
}

static int rec_DomainRangePop(nvtxDomainHandle_t domain)
{
    record_text("pop", domain, "", 0, 0, 0);
    return pop_level();
}

static nvtxRangeId_t rec_DomainRangeStartEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attr)
{
    nvtxRangeId_t id = new_range_id();
    record_attr("start", domain, attr, 1, id);
    return id;
}

static void rec_DomainRangeEnd(nvtxDomainHandle_t domain, nvtxRangeId_t id)
{
    record_text("end", domain, "", 0, 1, id);
}

/* ------------------------------------------------------------------------ */
/* CORE module: the non-domain API (default domain)                         */
/* ------------------------------------------------------------------------ */

static void rec_MarkEx(const nvtxEventAttributes_t *attr) { rec_DomainMarkEx(NULL, attr); }
static void rec_MarkA(const char *message) { record_text("mark", NULL, message, 0, 0, 0); }

static void rec_MarkW(const wchar_t *message)
{
    char *utf8 = utf8_from_wide(message);
    rec_MarkA(utf8);
    free(utf8);
}

static int rec_RangePushEx(const nvtxEventAttributes_t *attr) { return rec_DomainRangePushEx(NULL, attr); }

static int rec_RangePushA(const char *message)
{
    record_text("push", NULL, message, 0, 0, 0);
    return push_level();
}

static int rec_RangePushW(const wchar_t *message)
{
    char *utf8 = utf8_from_wide(message);
    int level = rec_RangePushA(utf8);
    free(utf8);
    return level;
}

static int rec_RangePop(void) { return rec_DomainRangePop(NULL); }

static nvtxRangeId_t rec_RangeStartEx(const nvtxEventAttributes_t *attr)
{
    return rec_DomainRangeStartEx(NULL, attr);
}

static nvtxRangeId_t rec_RangeStartA(const char *message)
{
    nvtxRangeId_t id = new_range_id();
    record_text("start", NULL, message, 0, 1, id);
    return id;
}

static nvtxRangeId_t rec_RangeStartW(const wchar_t *message)
{
    char *utf8 = utf8_from_wide(message);
    nvtxRangeId_t id = rec_RangeStartA(utf8);
    free(utf8);
    return id;
}

static void rec_RangeEnd(nvtxRangeId_t id) { rec_DomainRangeEnd(NULL, id); }

static void rec_NameCategoryA(uint32_t category, const char *name)
{
    rec_DomainNameCategoryA(NULL, category, name);
}

static void rec_NameCategoryW(uint32_t category, const wchar_t *name)
{
    rec_DomainNameCategoryW(NULL, category, name);
}

static void rec_NameOsThreadA(uint32_t thread_id, const char *name)
{
    record_text("threadname", NULL, name, 0, 1, thread_id);
}

static void rec_NameOsThreadW(uint32_t thread_id, const wchar_t *name)
{
    char *utf8 = utf8_from_wide(name);
    rec_NameOsThreadA(thread_id, utf8);
    free(utf8);
}

/* ------------------------------------------------------------------------ */
/* Registration with NVTX                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    unsigned int id;        /* NVTX_CBID_CORE_* or NVTX_CBID_CORE2_* */
    NvtxFunctionPointer fn; /* our implementation */
} slot_t;

#define SLOT(module, name) {NVTX_CBID_##module##_##name, (NvtxFunctionPointer)rec_##name}

static const slot_t core_slots[] = {
    SLOT(CORE, MarkEx),       SLOT(CORE, MarkA),        SLOT(CORE, MarkW),
    SLOT(CORE, RangeStartEx), SLOT(CORE, RangeStartA),  SLOT(CORE, RangeStartW),
    SLOT(CORE, RangeEnd),     SLOT(CORE, RangePushEx),  SLOT(CORE, RangePushA),
    SLOT(CORE, RangePushW),   SLOT(CORE, RangePop),     SLOT(CORE, NameCategoryA),
    SLOT(CORE, NameCategoryW), SLOT(CORE, NameOsThreadA), SLOT(CORE, NameOsThreadW),
};

static const slot_t core2_slots[] = {
    SLOT(CORE2, DomainMarkEx),          SLOT(CORE2, DomainRangeStartEx),
    SLOT(CORE2, DomainRangeEnd),        SLOT(CORE2, DomainRangePushEx),
    SLOT(CORE2, DomainRangePop),        SLOT(CORE2, DomainNameCategoryA),
    SLOT(CORE2, DomainNameCategoryW),   SLOT(CORE2, DomainRegisterStringA),
    SLOT(CORE2, DomainRegisterStringW), SLOT(CORE2, DomainCreateA),
    SLOT(CORE2, DomainCreateW),         SLOT(CORE2, DomainDestroy),
};

/* Fill in our functions in one module's table.  The table holds pointers
 * to the NVTX copy's function-pointer variables, indexed by callback id;
 * `size` is the number of ids that copy knows (older copies know fewer). */
static int install(const NvtxExportTableCallbacks *callbacks, NvtxCallbackModule module,
                   const slot_t *slots, size_t count)
{
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;

    if (!callbacks->GetModuleFunctionTable(module, &table, &size) || !table)
        return 0;
    for (size_t i = 0; i < count; ++i) {
        if (slots[i].id < size && table[slots[i].id])
            *table[slots[i].id] = slots[i].fn;
    }
    return 1;
}

/* Entry point, called once by every NVTX copy in the process.  Returning 0
 * would make that copy turn all its NVTX calls into no-ops. */
__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable)
{
    const NvtxExportTableCallbacks *callbacks;
    const NvtxExportTableVersionInfo *version;

    pthread_once(&g_init_once, init_once);

    callbacks = (const NvtxExportTableCallbacks *)getExportTable(NVTX_ETID_CALLBACKS);
    if (!callbacks || callbacks->struct_size < sizeof(NvtxExportTableCallbacks))
        return 0;

    /* Tools are asked to tell NVTX which version they were built against. */
    version = (const NvtxExportTableVersionInfo *)getExportTable(NVTX_ETID_VERSIONINFO);
    if (version && version->struct_size >= sizeof(NvtxExportTableVersionInfo)
        && version->SetInjectionNvtxVersion)
        version->SetInjectionNvtxVersion(NVTX_VERSION);

    return install(callbacks, NVTX_CB_MODULE_CORE, core_slots,
                   sizeof(core_slots) / sizeof(core_slots[0]))
        && install(callbacks, NVTX_CB_MODULE_CORE2, core2_slots,
                   sizeof(core2_slots) / sizeof(core2_slots[0]));
}

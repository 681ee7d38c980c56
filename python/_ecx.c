/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _ecx — the CPython extension behind `import ecx`: a thin layer over the
 * public API (include/ecx.h only, like the CLI), linked to the libecx.so
 * that ships inside the package.
 *
 * Three rules shape it (python/README.md explains them for users):
 *
 *  1. Library threads never wait for the GIL. The library's log lines (which
 *     may come from its progress thread while it holds a context's lock) go
 *     into a queue; they reach Python after the next ecx call returns, or
 *     from a pending call on the main thread. So a call may keep the GIL
 *     while it waits on a context's lock (no thread holding that lock ever
 *     needs the GIL), and the quick calls (fetch, poll(0), load, release)
 *     pay no GIL switch. What can take long lets other threads run: poll
 *     with a timeout, copies of item bytes, creating and freeing a context.
 *
 *  2. Nothing handed out points at freed memory. The memoryviews of a load
 *     or a save are exported by Span objects that count their exports in
 *     their Hold; ending a hold releases its views, and if buffers derived
 *     from them still live (numpy.frombuffer, a slice), the library's
 *     release / abort waits for the last of them. A context's ecx_free()
 *     waits likewise, and for calls running without the GIL.
 *
 *  3. Argument errors are TypeError / ValueError raised before any C call;
 *     a negative return from the library is ecx.Error(code, name).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ecx.h>

/* Method tables want PyCFunction; -Wcast-function-type needs the detour. */
#define METH(f) ((PyCFunction)(void (*)(void))(f))

static PyObject *Error;            /* ecx.Error */
static PyTypeObject *FetchResult;  /* ecx.FetchResult(state, reason) */
static PyTypeObject *RegionInfo;   /* ecx.RegionInfo(base, size_bytes, ...) */
static PyObject *fetch_ready, *fetch_pending, *fetch_local[ECX_REASON_COUNT];
static PyObject *s_peer_host, *s_peer_port, *s_size_bytes, *s_release, *s_metadata, *json_dumps;

/* ======================================================================
 * Logging: a queue between the library's threads and Python (rule 1)
 * ====================================================================== */

typedef struct log_line {
    struct log_line *next;
    int level;
    char text[];
} log_line;

#define LOG_QUEUE_MAX 4096

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static log_line *q_head, *q_tail;
static size_t q_len, q_dropped;
static atomic_int q_flag;      /* lines are waiting */
static atomic_int q_scheduled; /* a pending call will drain them */
static PyObject *log_target;   /* callable(level, line), or NULL: stderr (GIL) */

/* The last error or warning this thread logged, for the exception a failed
 * call raises ("config field block_bytes is out of range"). */
static _Thread_local unsigned tl_seq;
static _Thread_local char tl_last[1024];

static int drain_pending(void *arg);

/* The library's logger: any thread, under the library's log mutex. */
static void queue_line(void *arg, int level, const char *line)
{
    (void)arg;
    if (level <= ECX_LOG_WARN) {
        snprintf(tl_last, sizeof tl_last, "%s", line);
        tl_seq++;
    }
    size_t n = strlen(line) + 1;
    log_line *l = malloc(sizeof *l + n);
    pthread_mutex_lock(&q_mu);
    if (!l || q_len >= LOG_QUEUE_MAX) {
        q_dropped++;
        free(l);
    } else {
        l->next = NULL, l->level = level;
        memcpy(l->text, line, n);
        if (q_tail) q_tail->next = l;
        else q_head = l;
        q_tail = l, q_len++;
    }
    pthread_mutex_unlock(&q_mu);
    atomic_store(&q_flag, 1);
    /* For lines logged while no ecx call follows (the progress thread):
     * the main thread drains them at its next bytecode boundary. */
    if (!atomic_exchange(&q_scheduled, 1) && Py_AddPendingCall(drain_pending, NULL) != 0)
        atomic_store(&q_scheduled, 0);
}

static int py_level(int level)
{
    static const int map[] = {40, 30, 20, 10}; /* logging.ERROR .. logging.DEBUG */
    return map[level < 0 ? 0 : level > 3 ? 3 : level];
}

/* Hand the queued lines to Python. GIL held, no ecx lock held. */
static void drain(void)
{
    pthread_mutex_lock(&q_mu);
    log_line *l = q_head;
    size_t dropped = q_dropped;
    q_head = q_tail = NULL, q_len = 0, q_dropped = 0;
    atomic_store(&q_flag, 0);
    pthread_mutex_unlock(&q_mu);
    if (!l && !dropped) return;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb); /* a caller's pending exception survives */
    PyObject *fn = log_target;
    Py_XINCREF(fn); /* the callable may replace itself */
    char note[96];
    if (dropped) snprintf(note, sizeof note, "%zu log lines dropped (queue full)", dropped);
    for (int first = 1; l || (first && dropped); first = 0) {
        const char *text = l && !(first && dropped) ? l->text : note;
        int level = l && !(first && dropped) ? l->level : ECX_LOG_WARN;
        if (fn) {
            PyObject *r = PyObject_CallFunction(fn, "is", py_level(level), text);
            if (r) Py_DECREF(r);
            else PyErr_WriteUnraisable(fn);
        } else {
            static const char *tags[] = {"error", "warn", "info", "debug"};
            fprintf(stderr, "ecx %s: %s\n", tags[level < 0 ? 0 : level > 3 ? 3 : level], text);
        }
        if (first && dropped) continue;
        log_line *next = l->next;
        free(l);
        l = next;
    }
    Py_XDECREF(fn);
    PyErr_Restore(et, ev, tb);
}

static int drain_pending(void *arg)
{
    (void)arg;
    atomic_store(&q_scheduled, 0);
    drain();
    return 0;
}

#define DRAIN()                                                                                    \
    do {                                                                                           \
        if (atomic_load_explicit(&q_flag, memory_order_relaxed)) drain();                         \
    } while (0)

/* Take the last queued line equal to text out of the queue. */
static void unqueue(const char *text)
{
    pthread_mutex_lock(&q_mu);
    log_line *prev = NULL, *hit = NULL, *hit_prev = NULL;
    for (log_line *l = q_head; l; prev = l, l = l->next)
        if (!strcmp(l->text, text)) hit = l, hit_prev = prev;
    if (hit) {
        if (hit_prev) hit_prev->next = hit->next;
        else q_head = hit->next;
        if (q_tail == hit) q_tail = hit_prev;
        q_len--;
        free(hit);
    }
    pthread_mutex_unlock(&q_mu);
}

/* Raise ecx.Error for rc; the thread's last logged line since seq0 is the
 * detail. Returns NULL. Call it before any DRAIN() after the failed call:
 * that line must still be queued to be taken out; it drains the rest. */
static PyObject *raise_rc(int rc, unsigned seq0)
{
    if (tl_seq != seq0) unqueue(tl_last); /* it is the exception's detail: not logged too */
    DRAIN();
    PyObject *msg;
    if (tl_seq != seq0)
        msg = PyUnicode_FromFormat("%s: %s (%s)", ecx_errname(rc), ecx_strerror(rc), tl_last);
    else
        msg = PyUnicode_FromFormat("%s: %s", ecx_errname(rc), ecx_strerror(rc));
    if (!msg) return NULL;
    PyObject *e = PyObject_CallOneArg(Error, msg);
    Py_DECREF(msg);
    if (!e) return NULL;
    PyObject *code = PyLong_FromLong(rc), *name = PyUnicode_FromString(ecx_errname(rc));
    if (code && name && !PyObject_SetAttrString(e, "code", code) &&
        !PyObject_SetAttrString(e, "name", name))
        PyErr_SetObject(Error, e);
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_DECREF(e);
    return NULL;
}

/* ======================================================================
 * Arguments
 * ====================================================================== */

/* An mm_hash: str, 1..ECX_MM_HASH_MAX bytes of UTF-8, no NUL. */
static const char *arg_hash(PyObject *o)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "mm_hash must be str, not %.100s", Py_TYPE(o)->tp_name);
        return NULL;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (!s) return NULL;
    if (n < 1 || n > ECX_MM_HASH_MAX || (Py_ssize_t)strlen(s) != n) {
        PyErr_Format(PyExc_ValueError, "mm_hash must be 1 to %d bytes of UTF-8 without NUL",
                     ECX_MM_HASH_MAX);
        return NULL;
    }
    return s;
}

/* A str without NUL, as UTF-8 (valid while o lives). */
static const char *arg_str(PyObject *o, const char *what)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s && (Py_ssize_t)strlen(s) != n) {
        PyErr_Format(PyExc_ValueError, "%s must not contain NUL", what);
        return NULL;
    }
    return s;
}

/* An int (not bool) in [lo, hi]. */
static int arg_int(PyObject *o, const char *what, long long lo, long long hi, long long *out)
{
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    int over;
    long long v = PyLong_AsLongLongAndOverflow(o, &over);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (over || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be %lld to %lld", what, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int arg_u64(PyObject *o, const char *what, uint64_t *out)
{
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be 0 to 2**64-1", what);
        return -1;
    }
    *out = v;
    return 0;
}

/* Vectorcall arguments by position or keyword: names[i] for slot i. */
static int parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      const char *fname, const char *const *names, PyObject **slot, int nslots,
                      int required)
{
    if (nargs > nslots) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname,
                     nslots, nargs);
        return -1;
    }
    for (int i = 0; i < nslots; i++)
        slot[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < nslots && !(PyUnicode_CompareWithASCIIString(key, names[i]) == 0))
            i++;
        if (i == nslots) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname,
                         key);
            return -1;
        }
        if (slot[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname,
                         names[i]);
            return -1;
        }
        slot[i] = args[nargs + k];
    }
    for (int i = 0; i < required; i++)
        if (!slot[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return -1;
        }
    return 0;
}

/* ======================================================================
 * Context, Hold, Span
 * ====================================================================== */

typedef struct Ctx {
    PyObject_HEAD
    ecx_ctx *ctx;        /* NULL before init and once freed */
    int closed;          /* no new calls */
    int threaded;        /* progress_thread */
    int inflight;        /* calls running without the GIL */
    pid_t pid;           /* the process that made ctx: a forked child may not use it */
    Py_ssize_t pending;  /* holds whose release waits for exported buffers */
    PyObject *holds;     /* set of active Holds */
    PyObject *weakrefs;
    struct Ctx *prev, *next; /* every live context, for shutdown */
} Ctx;

static Ctx *live;

enum { HOLD_LOAD, HOLD_SAVE };
enum { ST_ACTIVE, ST_PENDING, ST_DONE };
enum { ACT_RELEASE, ACT_ABORT, ACT_COMMIT };

typedef struct Hold {
    PyObject_HEAD
    Ctx *ctx;
    int kind, state, action;
    Py_ssize_t exports; /* buffers exported by its Spans */
    uint64_t size;
    size_t n;
    ecx_segment *segs; /* a copy of the library's list */
    PyObject *views;   /* list of memoryviews until the hold ends */
    char hash[ECX_MM_HASH_MAX + 1];
} Hold;

typedef struct {
    PyObject_HEAD
    Hold *hold;
    size_t i;
} Span;

static PyTypeObject CtxType, HoldType, SpanType;

/* Calls that may take long run without the GIL; close() waits for them. */
#define NOGIL_BEGIN(self)                                                                          \
    (self)->inflight++;                                                                            \
    Py_BEGIN_ALLOW_THREADS
#define NOGIL_END(self)                                                                            \
    Py_END_ALLOW_THREADS                                                                           \
    (self)->inflight--;

/* Made in another process: this is a fork()ed child, which has the memory
 * but none of the library's threads; it must neither use nor free ctx. */
static int ctx_forked(const Ctx *self)
{
    return self->ctx && self->pid != getpid();
}

static int ctx_ok(Ctx *self)
{
    if (ctx_forked(self)) {
        PyErr_Format(PyExc_RuntimeError,
                     "ecx: this Context was made by process %d, and this is a fork()ed child "
                     "(%d): fork copies no threads, so the child must make its own Context "
                     "(or use the 'spawn' start method)",
                     (int)self->pid, (int)getpid());
        return -1;
    }
    if (self->ctx && !self->closed) return 0;
    PyErr_SetString(PyExc_ValueError,
                    self->ctx || self->closed ? "ecx: the context is closed"
                                              : "ecx: the context is not initialised");
    return -1;
}

/* Free the library context once closed and nothing needs it any more. */
static void ctx_maybe_free(Ctx *self)
{
    if (!self->closed || !self->ctx || self->inflight || self->pending ||
        (self->holds && PySet_GET_SIZE(self->holds)))
        return;
    ecx_ctx *c = self->ctx;
    self->ctx = NULL;
    Py_BEGIN_ALLOW_THREADS
    ecx_free(c);
    Py_END_ALLOW_THREADS
}

/* The library call that ends a hold. GIL held; returns rc. A commit
 * checksums the whole item: it runs without the GIL unless called from a
 * deallocator (nogil false). */
static int hold_act(Hold *h, bool nogil)
{
    Ctx *c = h->ctx;
    int rc = 0;
    if (ctx_forked(c)) h->action = -1; /* the parent's hold: nothing to do in a child */
    switch (h->action) {
    case ACT_RELEASE: rc = ecx_release(c->ctx, h->hash); break;
    case ACT_ABORT: rc = ecx_save_abort(c->ctx, h->hash); break;
    case ACT_COMMIT:
        if (!nogil) {
            rc = ecx_save_commit(c->ctx, h->hash);
            break;
        }
        NOGIL_BEGIN(c)
        rc = ecx_save_commit(c->ctx, h->hash);
        NOGIL_END(c)
        break;
    }
    h->state = ST_DONE;
    free(h->segs);
    h->segs = NULL, h->n = 0;
    return rc;
}

/* Release the views we handed out; those with buffers exported from them
 * stay (memoryview.release() refuses), and their Spans keep counting. */
static void hold_release_views(Hold *h)
{
    PyObject *views = h->views;
    h->views = NULL;
    if (!views) return;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(views); i++) {
        PyObject *r = PyObject_CallMethodNoArgs(PyList_GET_ITEM(views, i), s_release);
        if (r) Py_DECREF(r);
        else PyErr_Clear(); /* BufferError: exports exist; counted below */
    }
    Py_DECREF(views);
}

/* End an active hold with action: at once if no buffer is exported from its
 * views, else when the last one goes. Returns the action's rc, or 1 when
 * deferred. GIL held. */
static int hold_end(Hold *h, int action)
{
    if (h->state != ST_ACTIVE) return 0;
    Py_INCREF(h);
    hold_release_views(h); /* while active: the last release must not act */
    h->action = action;
    h->state = ST_PENDING;
    Ctx *c = h->ctx;
    if (c->holds && PySet_Discard(c->holds, (PyObject *)h) < 0) PyErr_Clear();
    int rc = 1;
    if (h->exports == 0) rc = hold_act(h, true);
    else c->pending++;
    ctx_maybe_free(c);
    Py_DECREF(h);
    return rc;
}

/* ---------- Span: the exporter of one segment ---------- */

static int span_getbuffer(Span *s, Py_buffer *view, int flags)
{
    Hold *h = s->hold;
    if (h->state != ST_ACTIVE) {
        PyErr_SetString(PyExc_ValueError, "ecx: the item's views were released");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)s, h->segs[s->i].ptr, (Py_ssize_t)h->segs[s->i].len,
                          h->kind == HOLD_LOAD, flags) < 0)
        return -1;
    h->exports++;
    return 0;
}

static void span_releasebuffer(Span *s, Py_buffer *view)
{
    (void)view;
    Hold *h = s->hold;
    if (--h->exports == 0 && h->state == ST_PENDING) {
        Ctx *c = h->ctx;
        Py_INCREF(h);
        c->pending--;
        hold_act(h, true); /* rc: nobody left to tell; the library logged it */
        ctx_maybe_free(c);
        Py_DECREF(h);
    }
}

static int span_traverse(Span *s, visitproc visit, void *arg)
{
    Py_VISIT(s->hold);
    return 0;
}

static void span_dealloc(Span *s)
{
    PyObject_GC_UnTrack(s);
    Py_CLEAR(s->hold);
    PyObject_GC_Del(s);
}

static PyBufferProcs span_buffer = {
    .bf_getbuffer = (getbufferproc)span_getbuffer,
    .bf_releasebuffer = (releasebufferproc)span_releasebuffer,
};

static PyTypeObject SpanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ecx._Span",
    .tp_basicsize = sizeof(Span),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One run of an item's blocks (the exporter behind a view).",
    .tp_as_buffer = &span_buffer,
    .tp_traverse = (traverseproc)span_traverse,
    .tp_dealloc = (destructor)span_dealloc,
};

/* ---------- Hold: a load or a save_into ---------- */

/* Undo the library's load or save_begin of a hold that never became
 * active for the caller. */
static void hold_undo(Ctx *c, const char *hash, int kind)
{
    if (kind == HOLD_LOAD) ecx_release(c->ctx, hash);
    else ecx_save_abort(c->ctx, hash);
}

/* A new active hold over segs (the library's load or save_begin of hash,
 * undone on failure), with one memoryview per segment. */
static Hold *hold_new(Ctx *c, const char *hash, int kind, const ecx_segment *segs, size_t n,
                      uint64_t size)
{
    Hold *h = PyObject_GC_New(Hold, &HoldType);
    if (!h) {
        hold_undo(c, hash, kind);
        return NULL;
    }
    Py_INCREF(c);
    h->ctx = c;
    h->kind = kind, h->state = ST_ACTIVE, h->action = kind == HOLD_LOAD ? ACT_RELEASE : ACT_ABORT;
    h->exports = 0, h->size = size, h->n = n, h->views = NULL;
    snprintf(h->hash, sizeof h->hash, "%s", hash);
    h->segs = malloc((n ? n : 1) * sizeof *segs);
    PyObject_GC_Track(h);
    if (!h->segs) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(h->segs, segs, n * sizeof *segs);
    if (!(h->views = PyList_New((Py_ssize_t)n))) goto fail;
    for (size_t i = 0; i < n; i++) {
        Span *s = PyObject_GC_New(Span, &SpanType);
        if (!s) goto fail;
        Py_INCREF(h);
        s->hold = h, s->i = i;
        PyObject_GC_Track(s);
        PyObject *mv = PyMemoryView_FromObject((PyObject *)s);
        Py_DECREF(s);
        if (!mv) goto fail;
        PyList_SET_ITEM(h->views, (Py_ssize_t)i, mv);
    }
    if (PySet_Add(c->holds, (PyObject *)h) < 0) goto fail;
    return h;
fail:
    /* Nobody else has seen it: drop the views, undo the library's call. */
    Py_CLEAR(h->views);
    h->state = ST_DONE;
    hold_undo(c, hash, kind);
    Py_DECREF(h);
    return NULL;
}

static int hold_traverse(Hold *h, visitproc visit, void *arg)
{
    Py_VISIT(h->ctx);
    Py_VISIT(h->views);
    return 0;
}

static int hold_clear(Hold *h)
{
    Py_CLEAR(h->views); /* the ctx stays: the hold's end needs it */
    return 0;
}

static void hold_dealloc(Hold *h)
{
    PyObject_GC_UnTrack(h);
    /* Every view left is released (a live one would keep its Span, and the
     * Span this hold), so nothing is exported: end it now. Only a hold the
     * garbage collector took from its context gets here active. */
    Py_CLEAR(h->views);
    Ctx *c = h->ctx;
    if (h->state == ST_ACTIVE && c && c->ctx) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        hold_act(h, false);
        PyErr_Restore(et, ev, tb);
    }
    free(h->segs);
    h->ctx = NULL;
    PyObject_GC_Del(h);
    if (c) {
        ctx_maybe_free(c);
        Py_DECREF(c);
    }
}

static PyObject *hold_views(Hold *h, void *unused)
{
    (void)unused;
    if (h->state != ST_ACTIVE || !h->views) {
        PyErr_SetString(PyExc_ValueError, "ecx: the item's views were released");
        return NULL;
    }
    /* A copy: the hold's own list is what it releases, whatever the caller
     * does with the one it gets. */
    return PyList_GetSlice(h->views, 0, PyList_GET_SIZE(h->views));
}

/* release() / abort(): idempotent. */
static PyObject *hold_release(Hold *h, PyObject *unused)
{
    (void)unused;
    if (h->state != ST_ACTIVE) Py_RETURN_NONE;
    unsigned seq0 = tl_seq;
    int rc = hold_end(h, h->kind == HOLD_LOAD ? ACT_RELEASE : ACT_ABORT);
    if (rc < 0) return raise_rc(rc, seq0); /* drains the rest */
    DRAIN();
    Py_RETURN_NONE;
}

static PyObject *hold_commit(Hold *h, PyObject *unused)
{
    (void)unused;
    if (h->kind != HOLD_SAVE) {
        PyErr_SetString(PyExc_TypeError, "commit() is for save_into(); a load is released");
        return NULL;
    }
    if (h->state != ST_ACTIVE) {
        PyErr_SetString(PyExc_ValueError, "ecx: this save was already committed or aborted");
        return NULL;
    }
    hold_release_views(h);
    unsigned seq0 = tl_seq;
    if (h->exports) {
        /* Committed bytes must not change: refuse while writable buffers
         * live, and abort when the last of them goes. */
        hold_end(h, ACT_ABORT);
        PyErr_Format(PyExc_BufferError,
                     "ecx: cannot commit '%s' while buffers exported from its views exist "
                     "(the save is aborted once they are gone)",
                     h->hash);
        return NULL;
    }
    int rc = hold_end(h, ACT_COMMIT);
    if (rc < 0) {
        ecx_save_abort(h->ctx->ctx, h->hash); /* a failed commit leaves nothing behind */
        return raise_rc(rc, seq0);
    }
    DRAIN();
    Py_RETURN_NONE;
}

static PyObject *hold_enter(Hold *h, PyObject *unused)
{
    return hold_views(h, unused);
}

static PyObject *hold_exit(Hold *h, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *r;
    if (h->kind == HOLD_SAVE && nargs >= 1 && args[0] == Py_None) {
        r = h->state == ST_ACTIVE ? hold_commit(h, NULL) : Py_NewRef(Py_None);
    } else {
        r = hold_release(h, NULL);
    }
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *hold_repr(Hold *h)
{
    static const char *states[] = {"active", "releasing", "released"};
    return PyUnicode_FromFormat("<ecx.%s '%s' %llu bytes in %zu segments, %s>",
                                h->kind == HOLD_LOAD ? "Load" : "SaveInto", h->hash,
                                (unsigned long long)h->size, h->n, states[h->state]);
}

static PyObject *hold_get_size(Hold *h, void *u)
{
    (void)u;
    return PyLong_FromUnsignedLongLong(h->size);
}

static PyObject *hold_get_hash(Hold *h, void *u)
{
    (void)u;
    return PyUnicode_FromString(h->hash);
}

/* Where the item's segments lie in the context's region, as (offset,
 * length) pairs: what another process that maps the same region file
 * (ecx.Region) needs to fill a save_into() or read a load(). */
static PyObject *hold_get_places(Hold *h, void *u)
{
    (void)u;
    if (h->state != ST_ACTIVE) {
        PyErr_SetString(PyExc_ValueError, "ecx: the hold has ended");
        return NULL;
    }
    if (ctx_ok(h->ctx)) return NULL;
    ecx_region_layout L;
    int rc = ecx_region_info(h->ctx->ctx, &L);
    if (rc < 0) return raise_rc(rc, tl_seq);
    PyObject *r = PyList_New((Py_ssize_t)h->n);
    if (!r) return NULL;
    for (size_t i = 0; i < h->n; i++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)(h->segs[i].ptr - L.base),
                                    (unsigned long long)h->segs[i].len);
        if (!t) {
            Py_DECREF(r);
            return NULL;
        }
        PyList_SET_ITEM(r, (Py_ssize_t)i, t);
    }
    return r;
}

static PyObject *hold_get_active(Hold *h, void *u)
{
    (void)u;
    return PyBool_FromLong(h->state == ST_ACTIVE);
}

static PyMethodDef hold_methods[] = {
    {"release", METH(hold_release), METH_NOARGS,
     "End the load (or abort the save): views are released at once; buffers exported from "
     "them keep the item pinned until they are gone."},
    {"abort", METH(hold_release), METH_NOARGS, "Give up the save (idempotent)."},
    {"commit", METH(hold_commit), METH_NOARGS,
     "Make the saved item ready. BufferError if buffers exported from the views still exist."},
    {"__enter__", METH(hold_enter), METH_NOARGS, NULL},
    {"__exit__", METH(hold_exit), METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef hold_getset[] = {
    {"views", (getter)hold_views, NULL, "The memoryviews of the item's segments, in order.", NULL},
    {"size", (getter)hold_get_size, NULL, "The item's size in bytes.", NULL},
    {"mm_hash", (getter)hold_get_hash, NULL, "The item's mm_hash.", NULL},
    {"active", (getter)hold_get_active, NULL, "False once released, committed or aborted.", NULL},
    {"places", (getter)hold_get_places, NULL,
     "[(offset, length)] of the segments in the region file, for another process that maps "
     "it (ecx.Region).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HoldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ecx.Hold",
    .tp_basicsize = sizeof(Hold),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A load (read-only views) or a save_into (writable views) of one item; "
              "a context manager.",
    .tp_traverse = (traverseproc)hold_traverse,
    .tp_clear = (inquiry)hold_clear,
    .tp_dealloc = (destructor)hold_dealloc,
    .tp_repr = (reprfunc)hold_repr,
    .tp_methods = hold_methods,
    .tp_getset = hold_getset,
};

/* ---------- Context ---------- */

enum { F_STR, F_STR_NULL, F_U64, F_I64, F_U32, F_INT, F_BOOL, F_KEYS };

static const struct field {
    const char *name;
    int type;
    size_t off;
} fields[] = {
#define F(name, type) {#name, type, offsetof(ecx_config, name)}
    F(listen, F_STR),
    F(advertise_host, F_STR_NULL),
    F(region_bytes, F_U64),
    F(block_bytes, F_U64),
    F(vllm_version, F_STR),
    F(model, F_STR),
    F(dtype, F_STR),
    F(data, F_STR),
    F(progress_thread, F_BOOL),
    F(instance, F_STR_NULL),
    F(rank, F_INT),
    F(ack_timeout_ms, F_I64),
    F(read_timeout_ms, F_I64),
    F(quarantine_ms, F_I64),
    F(item_wait_ms, F_I64),
    F(tombstone_ttl_ms, F_I64),
    F(session_idle_ms, F_I64),
    F(max_sessions, F_U32),
    F(lease_ms, F_I64),
    F(max_grants, F_U32),
    F(max_conn_grants, F_U32),
    F(max_conn_pin_pct, F_U32),
    F(max_connections, F_U32),
    F(curve_secret_key, F_STR_NULL),
    F(curve_server_key, F_STR_NULL),
    F(curve_allow, F_KEYS),
    F(connector_version, F_INT),
    F(max_pin_pct, F_U32),
    F(events_endpoint, F_STR_NULL),
    F(events_topic, F_STR_NULL),
#undef F
};

/* Set cfg's field f from value o (which must outlive ecx_new); *keys gets a
 * malloc'ed array for F_KEYS. */
static int set_field(ecx_config *cfg, const struct field *f, PyObject *o, const char ***keys)
{
    char *p = (char *)cfg + f->off;
    long long v;
    switch (f->type) {
    case F_STR_NULL:
        if (o == Py_None) {
            *(const char **)p = NULL;
            return 0;
        }
        /* fall through */
    case F_STR: {
        const char *s = arg_str(o, f->name);
        if (!s) return -1;
        *(const char **)p = s;
        return 0;
    }
    case F_U64: return arg_u64(o, f->name, (uint64_t *)p);
    case F_I64:
        if (arg_int(o, f->name, INT64_MIN, INT64_MAX, &v)) return -1;
        *(int64_t *)p = v;
        return 0;
    case F_U32:
        if (arg_int(o, f->name, 0, UINT32_MAX, &v)) return -1;
        *(uint32_t *)p = (uint32_t)v;
        return 0;
    case F_INT:
        if (arg_int(o, f->name, INT32_MIN, INT32_MAX, &v)) return -1;
        *(int *)p = (int)v;
        return 0;
    case F_BOOL:
        if (!PyBool_Check(o)) {
            PyErr_Format(PyExc_TypeError, "%s must be bool", f->name);
            return -1;
        }
        *(int *)p = o == Py_True;
        return 0;
    case F_KEYS: {
        if (o == Py_None) return 0;
        if (!PyList_Check(o) && !PyTuple_Check(o)) {
            PyErr_Format(PyExc_TypeError, "%s must be a list of str", f->name);
            return -1;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        *keys = calloc(n ? (size_t)n : 1, sizeof **keys);
        if (!*keys) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if (!((*keys)[i] = arg_str(PySequence_Fast_GET_ITEM(o, i), f->name))) return -1;
        cfg->curve_allow = *keys;
        cfg->n_curve_allow = (size_t)n;
        return 0;
    }
    }
    return -1;
}

static int ctx_init(Ctx *self, PyObject *args, PyObject *kw)
{
    if (self->ctx || self->closed) {
        PyErr_SetString(PyExc_RuntimeError, "ecx.Context.__init__ called twice");
        return -1;
    }
    ecx_config cfg;
    ecx_config_init(&cfg);
    PyObject *role = NULL;
    if (!PyArg_ParseTuple(args, "|O:Context", &role)) return -1;
    if (kw && !role) {
        role = PyDict_GetItemString(kw, "role"); /* borrowed */
    } else if (kw && PyDict_GetItemString(kw, "role")) {
        PyErr_SetString(PyExc_TypeError, "Context() got multiple values for argument 'role'");
        return -1;
    }
    if (role) {
        const char *r = arg_str(role, "role");
        if (!r) return -1;
        if (!strcmp(r, "producer")) cfg.role = ECX_ROLE_PRODUCER;
        else if (!strcmp(r, "consumer")) cfg.role = ECX_ROLE_CONSUMER;
        else if (!strcmp(r, "both")) cfg.role = ECX_ROLE_BOTH;
        else {
            PyErr_Format(PyExc_ValueError,
                         "role must be 'producer', 'consumer' or 'both', not '%s'", r);
            return -1;
        }
    }
    const char **keys = NULL;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (kw && PyDict_Next(kw, &pos, &k, &v)) {
        if ((PyUnicode_CompareWithASCIIString(k, "role") == 0)) continue;
        size_t i = 0;
        while (i < sizeof fields / sizeof *fields && !(PyUnicode_CompareWithASCIIString(k, fields[i].name) == 0))
            i++;
        if (i == sizeof fields / sizeof *fields) {
            PyErr_Format(PyExc_TypeError, "Context() got an unexpected keyword argument '%U'", k);
            free(keys);
            return -1;
        }
        if (set_field(&cfg, &fields[i], v, &keys)) {
            free(keys);
            return -1;
        }
    }
    ecx_ctx *c = NULL;
    unsigned seq0 = tl_seq;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ecx_new(&cfg, &c);
    Py_END_ALLOW_THREADS
    free(keys);
    if (rc < 0) {
        raise_rc(rc, seq0);
        return -1;
    }
    if (!self->holds && !(self->holds = PySet_New(NULL))) {
        Py_BEGIN_ALLOW_THREADS
        ecx_free(c);
        Py_END_ALLOW_THREADS
        return -1;
    }
    self->ctx = c;
    self->pid = getpid();
    self->threaded = cfg.progress_thread;
    self->next = live, self->prev = NULL;
    if (live) live->prev = self;
    live = self;
    DRAIN();
    return 0;
}

static void ctx_unlink(Ctx *self)
{
    if (self->prev) self->prev->next = self->next;
    else if (live == self) live = self->next;
    if (self->next) self->next->prev = self->prev;
    self->prev = self->next = NULL;
}

static PyObject *ctx_close(Ctx *self, PyObject *unused)
{
    (void)unused;
    if (ctx_forked(self)) self->ctx = NULL; /* the parent's: left alone (its region too) */
    if (self->closed || !self->ctx) {
        self->closed = 1;
        ctx_unlink(self);
        Py_RETURN_NONE;
    }
    self->closed = 1;
    /* Calls running without the GIL end within a poll slice or a copy. */
    while (self->inflight > 0) {
        Py_BEGIN_ALLOW_THREADS
        usleep(1000);
        Py_END_ALLOW_THREADS
    }
    PyObject *holds = PySequence_List(self->holds);
    if (!holds) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(holds); i++) {
        Hold *h = (Hold *)PyList_GET_ITEM(holds, i);
        hold_end(h, h->action);
    }
    Py_DECREF(holds);
    ctx_maybe_free(self);
    ctx_unlink(self);
    DRAIN();
    Py_RETURN_NONE;
}

static int ctx_traverse(Ctx *self, visitproc visit, void *arg)
{
    Py_VISIT(self->holds);
    return 0;
}

static int ctx_clear(Ctx *self)
{
    Py_CLEAR(self->holds);
    return 0;
}

static void ctx_dealloc(Ctx *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
    Py_CLEAR(self->holds); /* empty: every hold refers to its context */
    ctx_unlink(self);
    if (self->ctx && !ctx_forked(self)) {
        ecx_ctx *c = self->ctx;
        self->ctx = NULL;
        Py_BEGIN_ALLOW_THREADS
        ecx_free(c);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* fetch(mm_hash, announcement=None, expected_size=0) -> FetchResult */
static PyObject *ctx_fetch(Ctx *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"mm_hash", "announcement", "expected_size"};
    PyObject *a[3];
    if (parse_args(args, nargs, kwnames, "fetch", names, a, 3, 1)) return NULL;
    const char *h = arg_hash(a[0]);
    if (!h) return NULL;
    uint64_t expected = 0;
    if (a[2] && arg_u64(a[2], "expected_size", &expected)) return NULL;
    PyObject *ann = a[1] && a[1] != Py_None ? a[1] : NULL;
    ecx_announcement from, *fromp = NULL;
    const char *json = NULL;
    PyObject *text = NULL; /* owned: a dict the fast path cannot take, as JSON */
    if (ann && PyDict_Check(ann)) {
        PyObject *ph = PyDict_GetItemWithError(ann, s_peer_host);
        PyObject *pp = ph ? PyDict_GetItemWithError(ann, s_peer_port) : NULL;
        PyObject *sz = pp ? PyDict_GetItemWithError(ann, s_size_bytes) : NULL;
        if (PyErr_Occurred()) return NULL;
        int fast = 0;
        if (!ph) {
            fast = PyDict_GET_SIZE(ann) == 0 ||
                   (PyDict_GET_SIZE(ann) == 1 && PyDict_GetItemWithError(ann, s_metadata));
        } else if (sz && PyUnicode_Check(ph) && PyLong_Check(pp) && PyLong_Check(sz) &&
                   !PyBool_Check(pp) && !PyBool_Check(sz)) {
            Py_ssize_t n;
            int over1, over2;
            from.peer_host = PyUnicode_AsUTF8AndSize(ph, &n);
            long long port = PyLong_AsLongLongAndOverflow(pp, &over1);
            long long size = PyLong_AsLongLongAndOverflow(sz, &over2);
            if (!from.peer_host) return NULL;
            if (!over1 && !over2 && port >= 0 && port <= 65535 && size >= 0 &&
                (Py_ssize_t)strlen(from.peer_host) == n) {
                from.peer_port = (int)port, from.size_bytes = (uint64_t)size;
                fromp = &from;
                fast = 1;
            }
        }
        if (!fast) {
            /* Odd values: let the library judge the JSON (INVALID, NO_PEER). */
            if (!(text = PyObject_CallOneArg(json_dumps, ann))) return NULL;
            if (!(json = arg_str(text, "announcement"))) {
                Py_DECREF(text);
                return NULL;
            }
        }
    } else if (ann && PyUnicode_Check(ann)) {
        if (!(json = arg_str(ann, "announcement"))) return NULL;
    } else if (ann && PyBytes_Check(ann)) {
        json = PyBytes_AS_STRING(ann);
        if ((Py_ssize_t)strlen(json) != PyBytes_GET_SIZE(ann)) {
            PyErr_SetString(PyExc_ValueError, "announcement must not contain NUL");
            return NULL;
        }
    } else if (ann) {
        PyErr_Format(PyExc_TypeError, "announcement must be a dict, str, bytes or None, not %.100s",
                     Py_TYPE(ann)->tp_name);
        return NULL;
    }
    if (ctx_ok(self)) {
        Py_XDECREF(text);
        return NULL;
    }
    unsigned seq0 = tl_seq;
    int reason = 0;
    int st = json ? ecx_fetch(self->ctx, h, json, expected, &reason)
                  : ecx_fetch_from(self->ctx, h, fromp, expected, &reason);
    Py_XDECREF(text);
    if (st != ECX_FETCH_READY && st != ECX_FETCH_PENDING && st != ECX_FETCH_LOCAL)
        return raise_rc(st < 0 ? st : ECX_EINVAL, seq0); /* drains the rest */
    DRAIN();
    switch (st) {
    case ECX_FETCH_READY: return Py_NewRef(fetch_ready);
    case ECX_FETCH_PENDING: return Py_NewRef(fetch_pending);
    default:
        return Py_NewRef(fetch_local[reason >= 0 && reason < ECX_REASON_COUNT ? reason : 0]);
    }
}

static long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Longest wait without looking at signals and close(). */
#define POLL_SLICE_MS 100

/* poll(timeout_ms=0) -> int */
static PyObject *ctx_poll(Ctx *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"timeout_ms"};
    PyObject *a[1];
    long long timeout = 0;
    if (parse_args(args, nargs, kwnames, "poll", names, a, 1, 0)) return NULL;
    if (a[0] && arg_int(a[0], "timeout_ms", -1, INT32_MAX, &timeout)) return NULL;
    if (ctx_ok(self)) return NULL;
    unsigned seq0 = tl_seq;
    int ev;
    if (timeout == 0 && self->threaded) {
        /* Only reports what the progress thread did: a read of an eventfd. */
        ev = ecx_poll(self->ctx, 0);
    } else {
        /* In slices, so that signals (Ctrl-C) and close() are seen. */
        long long end = timeout > POLL_SLICE_MS ? mono_ns() + timeout * 1000000 : 0;
        for (int first = 1;; first = 0) {
            long long left = timeout < 0 ? POLL_SLICE_MS
                             : first     ? timeout
                                         : (end - mono_ns() + 999999) / 1000000; /* ms, up */
            int slice = left <= 0 ? 0 : left > POLL_SLICE_MS ? POLL_SLICE_MS : (int)left;
            ecx_ctx *c = self->ctx;
            NOGIL_BEGIN(self)
            ev = ecx_poll(c, slice);
            NOGIL_END(self)
            if (ev != 0 || slice == 0 || slice == timeout || self->closed) break;
            DRAIN();
            if (PyErr_CheckSignals() < 0) return NULL;
        }
    }
    if (ev < 0) return raise_rc(ev, seq0); /* drains the rest */
    DRAIN();
    return PyLong_FromLong(ev);
}

/* save(mm_hash, data): any C-contiguous buffer, copied once, into the region. */
static PyObject *ctx_save(Ctx *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"mm_hash", "data"};
    PyObject *a[2];
    if (parse_args(args, nargs, kwnames, "save", names, a, 2, 2)) return NULL;
    const char *h = arg_hash(a[0]);
    if (!h) return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(a[1], &buf, PyBUF_C_CONTIGUOUS) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "data must be a C-contiguous buffer");
        }
        return NULL;
    }
    if (buf.len == 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "data must not be empty");
        return NULL;
    }
    if (ctx_ok(self)) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    unsigned seq0 = tl_seq;
    const ecx_segment *segs;
    size_t n;
    int rc = ecx_save_begin(self->ctx, h, (uint64_t)buf.len, &segs, &n);
    if (rc == 0) {
        /* Copy outside the context's lock and the GIL; then commit. */
        NOGIL_BEGIN(self)
        const char *src = buf.buf;
        for (size_t i = 0; i < n; i++) {
            memcpy(segs[i].ptr, src, segs[i].len);
            src += segs[i].len;
        }
        rc = ecx_save_commit(self->ctx, h); /* checksums the item: no GIL */
        NOGIL_END(self)
        if (rc < 0) ecx_save_abort(self->ctx, h);
    }
    PyBuffer_Release(&buf);
    if (rc < 0) return raise_rc(rc, seq0); /* drains the rest */
    DRAIN();
    Py_RETURN_NONE;
}

/* save_shape(mm_hash, rows, width): version 2's own shape of a held item. */
static PyObject *ctx_save_shape(Ctx *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const names[] = {"mm_hash", "rows", "width"};
    PyObject *a[3];
    if (parse_args(args, nargs, kwnames, "save_shape", names, a, 3, 3)) return NULL;
    const char *h = arg_hash(a[0]);
    uint64_t rows, width;
    if (!h || arg_u64(a[1], "rows", &rows) || arg_u64(a[2], "width", &width) || ctx_ok(self))
        return NULL;
    unsigned seq0 = tl_seq;
    int rc = ecx_save_shape(self->ctx, h, rows, width);
    if (rc < 0) return raise_rc(rc, seq0); /* drains the rest */
    DRAIN();
    Py_RETURN_NONE;
}

/* The common start of load() and save_into(). */
static PyObject *ctx_hold(Ctx *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                          int kind)
{
    static const char *const load_names[] = {"mm_hash"}, *const save_names[] = {"mm_hash", "size"};
    PyObject *a[2];
    int ns = kind == HOLD_LOAD ? 1 : 2;
    if (parse_args(args, nargs, kwnames, kind == HOLD_LOAD ? "load" : "save_into",
                   kind == HOLD_LOAD ? load_names : save_names, a, ns, ns))
        return NULL;
    const char *h = arg_hash(a[0]);
    if (!h) return NULL;
    uint64_t size = 0;
    if (kind == HOLD_SAVE) {
        if (arg_u64(a[1], "size", &size)) return NULL;
        if (size == 0) {
            PyErr_SetString(PyExc_ValueError, "size must be at least 1");
            return NULL;
        }
    }
    if (ctx_ok(self)) return NULL;
    unsigned seq0 = tl_seq;
    const ecx_segment *segs;
    size_t n;
    int rc = kind == HOLD_LOAD ? ecx_load(self->ctx, h, &segs, &n, &size)
                               : ecx_save_begin(self->ctx, h, size, &segs, &n);
    if (rc < 0) return raise_rc(rc, seq0); /* drains the rest */
    DRAIN();
    return (PyObject *)hold_new(self, h, kind, segs, n, size);
}

static PyObject *ctx_load(Ctx *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return ctx_hold(self, args, nargs, kwnames, HOLD_LOAD);
}

static PyObject *ctx_save_into(Ctx *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    return ctx_hold(self, args, nargs, kwnames, HOLD_SAVE);
}

/* release(mm_hash): end the latest active load of mm_hash. */
static PyObject *ctx_release(Ctx *self, PyObject *arg)
{
    const char *h = arg_hash(arg);
    if (!h || ctx_ok(self)) return NULL;
    PyObject *it = PyObject_GetIter(self->holds), *o;
    Hold *found = NULL;
    while (it && (o = PyIter_Next(it))) {
        Hold *x = (Hold *)o;
        if (x->kind == HOLD_LOAD && x->state == ST_ACTIVE && !strcmp(x->hash, h)) {
            Py_XDECREF(found);
            found = x;
        } else {
            Py_DECREF(o);
        }
    }
    Py_XDECREF(it);
    if (PyErr_Occurred()) {
        Py_XDECREF(found);
        return NULL;
    }
    if (!found) return raise_rc(ECX_ECACHE_STATE, tl_seq);
    PyObject *r = hold_release(found, NULL);
    Py_DECREF(found);
    return r;
}

/* evict(mm_hash): remove a ready item that is not loaded or granted. */
static PyObject *ctx_evict(Ctx *self, PyObject *arg)
{
    const char *h = arg_hash(arg);
    if (!h || ctx_ok(self)) return NULL;
    unsigned seq0 = tl_seq;
    int rc = ecx_evict(self->ctx, h);
    if (rc < 0) return raise_rc(rc, seq0); /* drains the rest */
    DRAIN();
    Py_RETURN_NONE;
}

/* Copy an item's bytes out: into dst (cap bytes), or a new bytes object. */
static PyObject *ctx_copy_out(Ctx *self, PyObject *hobj, Py_buffer *dst)
{
    const char *h = arg_hash(hobj);
    if (!h || ctx_ok(self)) return NULL;
    unsigned seq0 = tl_seq;
    const ecx_segment *segs;
    size_t n;
    uint64_t size;
    int rc = ecx_load(self->ctx, h, &segs, &n, &size);
    if (rc < 0) return raise_rc(rc, seq0);
    PyObject *out = NULL;
    char *d = NULL;
    if (dst) {
        if ((uint64_t)dst->len < size) rc = ECX_ERANGE;
        else d = dst->buf;
    } else if ((out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size))) {
        d = PyBytes_AS_STRING(out);
    }
    if (d) {
        /* Pinned: the copy needs neither the context's lock nor the GIL. */
        NOGIL_BEGIN(self)
        for (size_t i = 0; i < n; i++) {
            memcpy(d, segs[i].ptr, segs[i].len);
            d += segs[i].len;
        }
        NOGIL_END(self)
    }
    int rrc = ecx_release(self->ctx, h);
    if (rc == 0 && rrc < 0) rc = rrc;
    if (rc < 0) {
        Py_XDECREF(out);
        return raise_rc(rc, seq0); /* drains the rest */
    }
    DRAIN();
    if (!d) return NULL; /* MemoryError */
    return out ? out : PyLong_FromUnsignedLongLong(size);
}

static PyObject *ctx_read(Ctx *self, PyObject *arg)
{
    return ctx_copy_out(self, arg, NULL);
}

static PyObject *ctx_read_into(Ctx *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    static const char *const names[] = {"mm_hash", "buffer"};
    PyObject *a[2];
    if (parse_args(args, nargs, kwnames, "read_into", names, a, 2, 2)) return NULL;
    if (!arg_hash(a[0])) return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(a[1], &buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "buffer must be a writable C-contiguous buffer");
        }
        return NULL;
    }
    PyObject *r = ctx_copy_out(self, a[0], &buf);
    PyBuffer_Release(&buf);
    return r;
}

/* announce(mm_hash) -> dict: the reference's announcement, the library's own
 * JSON (ecx_announce: with "shape" under connector_version 2) as a dict. */
static PyObject *ctx_announce(Ctx *self, PyObject *arg)
{
    const char *h = arg_hash(arg);
    if (!h || ctx_ok(self)) return NULL;
    unsigned seq0 = tl_seq;
    char buf[1024]; /* a host is at most 255 bytes: the JSON always fits */
    size_t len = 0;
    int rc = ecx_announce(self->ctx, h, buf, sizeof buf, &len);
    if (rc < 0) return raise_rc(rc, seq0); /* drains the rest */
    DRAIN();
    PyObject *json = PyImport_ImportModule("json");
    if (!json) return NULL;
    PyObject *d = PyObject_CallMethod(json, "loads", "s#", buf, (Py_ssize_t)len);
    Py_DECREF(json);
    return d;
}

static PyObject *ctx_metrics(Ctx *self, PyObject *unused)
{
    (void)unused;
    if (ctx_ok(self)) return NULL;
    unsigned seq0 = tl_seq;
    size_t cap = 16384, len = 0;
    for (int tries = 0; tries < 8; tries++) {
        char *buf = PyMem_Malloc(cap);
        if (!buf) return PyErr_NoMemory();
        int rc = ecx_metrics(self->ctx, buf, cap, &len);
        if (rc == 0) {
            PyObject *s = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, "replace");
            PyMem_Free(buf);
            DRAIN();
            return s;
        }
        PyMem_Free(buf);
        if (rc != ECX_ERANGE) return raise_rc(rc, seq0);
        cap = len + len / 4 + 4096;
    }
    return raise_rc(ECX_ERANGE, seq0);
}

static PyObject *ctx_region_info(Ctx *self, PyObject *unused)
{
    (void)unused;
    if (ctx_ok(self)) return NULL;
    ecx_region_layout L;
    int rc = ecx_region_info(self->ctx, &L);
    if (rc < 0) return raise_rc(rc, tl_seq);
    PyObject *r = PyStructSequence_New(RegionInfo);
    if (!r) return NULL;
    PyStructSequence_SET_ITEM(r, 0, PyLong_FromVoidPtr(L.base));
    PyStructSequence_SET_ITEM(r, 1, PyLong_FromUnsignedLongLong(L.size_bytes));
    PyStructSequence_SET_ITEM(r, 2, PyLong_FromUnsignedLongLong(L.block_bytes));
    PyStructSequence_SET_ITEM(r, 3, PyLong_FromUnsignedLongLong(L.num_blocks));
    PyStructSequence_SET_ITEM(r, 4, PyUnicode_DecodeFSDefault(L.path));
    for (int i = 0; i < 5; i++)
        if (!PyStructSequence_GET_ITEM(r, i)) {
            Py_DECREF(r);
            return NULL;
        }
    return r;
}

static PyObject *ctx_fileno(Ctx *self, PyObject *unused)
{
    (void)unused;
    if (ctx_ok(self)) return NULL;
    int fd = ecx_fd(self->ctx);
    if (fd < 0) return raise_rc(fd, tl_seq);
    return PyLong_FromLong(fd);
}

static PyObject *ctx_next_timeout(Ctx *self, PyObject *unused)
{
    (void)unused;
    if (ctx_ok(self)) return NULL;
    unsigned seq0 = tl_seq;
    int t = ecx_next_timeout(self->ctx);
    if (t < 0 && t != ECX_NO_TIMEOUT) return raise_rc(t, seq0); /* drains the rest */
    DRAIN();
    if (t == ECX_NO_TIMEOUT) return PyLong_FromLong(-1); /* Python's "none": errors raise */
    return PyLong_FromLong(t);
}

static PyObject *ctx_get_port(Ctx *self, void *u)
{
    (void)u;
    if (ctx_ok(self)) return NULL;
    int p = ecx_listen_port(self->ctx);
    if (p < 0) return raise_rc(p, tl_seq);
    return PyLong_FromLong(p);
}

static PyObject *ctx_get_closed(Ctx *self, void *u)
{
    (void)u;
    return PyBool_FromLong(self->closed || !self->ctx);
}

static PyObject *ctx_enter(Ctx *self, PyObject *unused)
{
    (void)unused;
    if (ctx_ok(self)) return NULL;
    return Py_NewRef(self);
}

static PyObject *ctx_exit(Ctx *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args, (void)nargs;
    PyObject *r = ctx_close(self, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyMethodDef ctx_methods[] = {
    {"close", METH(ctx_close), METH_NOARGS,
     "Release every load, abort every unfinished save and free the context (at once, or when "
     "the last buffer exported from a view is gone). Idempotent."},
    {"fetch", METH(ctx_fetch), METH_FASTCALL | METH_KEYWORDS,
     "fetch(mm_hash, announcement=None, expected_size=0) -> FetchResult"},
    {"poll", METH(ctx_poll), METH_FASTCALL | METH_KEYWORDS,
     "poll(timeout_ms=0) -> int: events handled; waits without the GIL (-1: until one)."},
    {"save", METH(ctx_save), METH_FASTCALL | METH_KEYWORDS,
     "save(mm_hash, data): store any C-contiguous buffer as a ready item."},
    {"save_into", METH(ctx_save_into), METH_FASTCALL | METH_KEYWORDS,
     "save_into(mm_hash, size) -> Hold: writable views; committed on normal exit."},
    {"load", METH(ctx_load), METH_FASTCALL | METH_KEYWORDS,
     "load(mm_hash) -> Hold: read-only views of a ready item; released on exit."},
    {"release", METH(ctx_release), METH_O, "release(mm_hash): end the latest load of mm_hash."},
    {"evict", METH(ctx_evict), METH_O,
     "evict(mm_hash): remove a ready item now, freeing its blocks (an Error if it is not held, "
     "not ready, loaded, or granted to a consumer)."},
    {"read", METH(ctx_read), METH_O, "read(mm_hash) -> bytes"},
    {"read_into", METH(ctx_read_into), METH_FASTCALL | METH_KEYWORDS,
     "read_into(mm_hash, buffer) -> int: copy the item into a writable buffer."},
    {"save_shape", METH(ctx_save_shape), METH_FASTCALL | METH_KEYWORDS,
     "save_shape(mm_hash, rows, width): connector_version 2: announce the held item with shape "
     "[rows, width] (its whole blocks must be the item's size)."},
    {"announce", METH(ctx_announce), METH_O, "announce(mm_hash) -> dict"},
    {"metrics", METH(ctx_metrics), METH_NOARGS, "metrics() -> str (Prometheus text)"},
    {"region_info", METH(ctx_region_info), METH_NOARGS, "region_info() -> RegionInfo"},
    {"fileno", METH(ctx_fileno), METH_NOARGS,
     "fileno() -> int: readable when poll() has work (never read it or close it)."},
    {"next_timeout", METH(ctx_next_timeout), METH_NOARGS,
     "next_timeout() -> int: ms until poll() must run (-1: nothing pending)."},
    {"__enter__", METH(ctx_enter), METH_NOARGS, NULL},
    {"__exit__", METH(ctx_exit), METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ctx_getset[] = {
    {"port", (getter)ctx_get_port, NULL, "The producer's bound port.", NULL},
    {"closed", (getter)ctx_get_closed, NULL, "True once close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CtxType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ecx._ecx.Context",
    .tp_basicsize = sizeof(Ctx),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Context(role='consumer', **config): an ecx context (see ecx.Context).",
    .tp_traverse = (traverseproc)ctx_traverse,
    .tp_clear = (inquiry)ctx_clear,
    .tp_dealloc = (destructor)ctx_dealloc,
    .tp_weaklistoffset = offsetof(Ctx, weakrefs),
    .tp_methods = ctx_methods,
    .tp_getset = ctx_getset,
    .tp_init = (initproc)ctx_init,
    .tp_new = PyType_GenericNew,
};

/* ======================================================================
 * Module functions
 * ====================================================================== */

static PyObject *mod_compat_hash(PyObject *m, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    (void)m;
    static const char *const names[] = {"vllm_version", "model", "dtype", "block_size_bytes"};
    PyObject *a[4];
    if (parse_args(args, nargs, kwnames, "compat_hash", names, a, 4, 4)) return NULL;
    const char *s[3];
    Py_ssize_t n[3];
    for (int i = 0; i < 3; i++) {
        if (!PyUnicode_Check(a[i])) {
            PyErr_Format(PyExc_TypeError, "%s must be str", names[i]);
            return NULL;
        }
        if (!(s[i] = PyUnicode_AsUTF8AndSize(a[i], &n[i]))) return NULL;
    }
    long long bs;
    if (arg_int(a[3], "block_size_bytes", INT64_MIN, INT64_MAX, &bs)) return NULL;
    char out[ECX_COMPAT_HASH_HEX + 1];
    unsigned seq0 = tl_seq;
    int rc = ecx_compat_hash(s[0], (size_t)n[0], s[1], (size_t)n[1], s[2], (size_t)n[2], bs, out);
    if (rc < 0) return raise_rc(rc, seq0); /* drains the rest */
    DRAIN();
    return PyUnicode_FromStringAndSize(out, ECX_COMPAT_HASH_HEX);
}

static PyObject *mod_errname(PyObject *m, PyObject *arg)
{
    (void)m;
    long long code;
    if (arg_int(arg, "code", INT32_MIN, INT32_MAX, &code)) return NULL;
    return PyUnicode_FromString(ecx_errname((int)code));
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    (void)m;
    long long code;
    if (arg_int(arg, "code", INT32_MIN, INT32_MAX, &code)) return NULL;
    return PyUnicode_FromString(ecx_strerror((int)code));
}

static PyObject *mod_library_version(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyUnicode_FromString(ecx_version());
}

/* set_logger(fn): fn(level, line) gets every line (level as in logging);
 * None: the library writes to stderr itself. */
static PyObject *mod_set_logger(PyObject *m, PyObject *fn)
{
    (void)m;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "set_logger() takes a callable(level, line) or None");
        return NULL;
    }
    DRAIN(); /* lines logged so far go where they were meant to */
    if (fn == Py_None) {
        ecx_set_logger(NULL, NULL);
        Py_CLEAR(log_target);
        DRAIN(); /* (to stderr) */
    } else {
        Py_XSETREF(log_target, Py_NewRef(fn));
        ecx_set_logger(queue_line, NULL);
    }
    Py_RETURN_NONE;
}

static PyObject *mod_set_log_level(PyObject *m, PyObject *arg)
{
    (void)m;
    long long level;
    if (arg_int(arg, "level", ECX_LOG_ERROR, ECX_LOG_DEBUG, &level)) return NULL;
    ecx_set_log_level((int)level);
    Py_RETURN_NONE;
}

static PyObject *mod_reap_regions(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    (void)m;
    const char *dir = NULL;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "reap_regions(dir=None) takes at most one argument");
        return NULL;
    }
    PyObject *bytes = NULL;
    if (nargs == 1 && args[0] != Py_None) {
        if (!PyUnicode_FSConverter(args[0], &bytes)) return NULL;
        dir = PyBytes_AS_STRING(bytes);
    }
    unsigned seq0 = tl_seq;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ecx_reap_regions(dir);
    Py_END_ALLOW_THREADS
    Py_XDECREF(bytes);
    if (rc < 0) return raise_rc(rc, seq0); /* drains the rest */
    DRAIN();
    return PyLong_FromLong(rc);
}

/* At interpreter exit (atexit, before finalisation): deliver queued lines,
 * give the library its stderr logger back (so no library thread ever calls
 * into a finalising interpreter), and close every live context. */
static PyObject *mod_shutdown(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    DRAIN();
    while (live) { /* close() unlinks each */
        Ctx *c = live;
        Py_INCREF(c);
        PyObject *r = ctx_close(c, NULL);
        if (r) Py_DECREF(r);
        else PyErr_Clear();
        ctx_unlink(c);
        Py_DECREF(c);
    }
    DRAIN();
    ecx_set_logger(NULL, NULL);
    Py_CLEAR(log_target);
    DRAIN();
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"compat_hash", METH(mod_compat_hash), METH_FASTCALL | METH_KEYWORDS,
     "compat_hash(vllm_version, model, dtype, block_size_bytes) -> str (64 hex characters)"},
    {"errname", METH(mod_errname), METH_O, "errname(code) -> 'ECX_...'"},
    {"strerror", METH(mod_strerror), METH_O, "strerror(code) -> message"},
    {"library_version", METH(mod_library_version), METH_NOARGS,
     "The loaded libecx's version (ecx_version())."},
    {"set_logger", METH(mod_set_logger), METH_O, NULL},
    {"set_log_level", METH(mod_set_log_level), METH_O, NULL},
    {"reap_regions", METH(mod_reap_regions), METH_FASTCALL,
     "reap_regions(dir=None) -> int: remove region files of dead processes of this user."},
    {"_shutdown", METH(mod_shutdown), METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyStructSequence_Field fetch_fields[] = {
    {"state", "'ready', 'pending' or 'local'"},
    {"reason", "None, or why to encode locally ('NACK_MISSING', 'ACK_TIMEOUT', ...)"},
    {NULL, NULL},
};
static PyStructSequence_Desc fetch_desc = {"ecx.FetchResult", "What a fetch came to.",
                                           fetch_fields, 2};

static PyStructSequence_Field region_fields[] = {
    {"base", "address of the region's first byte (valid until close)"},
    {"size_bytes", "num_blocks * block_bytes"},
    {"block_bytes", NULL},
    {"num_blocks", NULL},
    {"path", "the region file"},
    {NULL, NULL},
};
static PyStructSequence_Desc region_desc = {"ecx.RegionInfo", "Where a context's region lives.",
                                            region_fields, 5};

static PyObject *fetch_result(const char *state, const char *reason)
{
    PyObject *r = PyStructSequence_New(FetchResult);
    if (!r) return NULL;
    PyObject *s = PyUnicode_InternFromString(state);
    PyObject *why = reason ? PyUnicode_InternFromString(reason) : Py_NewRef(Py_None);
    if (!s || !why) {
        Py_XDECREF(s);
        Py_XDECREF(why);
        Py_DECREF(r);
        return NULL;
    }
    PyStructSequence_SET_ITEM(r, 0, s);
    PyStructSequence_SET_ITEM(r, 1, why);
    return r;
}

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_ecx", "The C core of the ecx package (import ecx instead).", -1,
    mod_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ecx(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    if (PyType_Ready(&SpanType) < 0 || PyType_Ready(&HoldType) < 0 || PyType_Ready(&CtxType) < 0)
        goto fail;
    if (!(FetchResult = PyStructSequence_NewType(&fetch_desc)) ||
        !(RegionInfo = PyStructSequence_NewType(&region_desc)))
        goto fail;
    if (!(fetch_ready = fetch_result("ready", NULL)) ||
        !(fetch_pending = fetch_result("pending", NULL)))
        goto fail;
    for (int i = 0; i < ECX_REASON_COUNT; i++)
        if (!(fetch_local[i] = fetch_result("local", i ? ecx_reason_name(i) : NULL))) goto fail;
    struct {
        PyObject **p;
        const char *s;
    } strs[] = {{&s_peer_host, "peer_host"}, {&s_peer_port, "peer_port"},
                {&s_size_bytes, "size_bytes"}, {&s_release, "release"},
                {&s_metadata, "metadata"}};
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++)
        if (!(*strs[i].p = PyUnicode_InternFromString(strs[i].s))) goto fail;
    PyObject *json = PyImport_ImportModule("json");
    if (!json) goto fail;
    json_dumps = PyObject_GetAttrString(json, "dumps");
    Py_DECREF(json);
    if (!json_dumps) goto fail;
    PyObject *attrs = Py_BuildValue("{s:O,s:O}", "code", Py_None, "name", Py_None);
    if (!attrs) goto fail;
    Error = PyErr_NewExceptionWithDoc(
        "ecx.Error", "A negative return from libecx: .code (int) and .name ('ECX_ECACHE_FULL').",
        NULL, attrs);
    Py_DECREF(attrs);
    if (!Error) goto fail;
    if (PyModule_AddObjectRef(m, "Error", Error) < 0 ||
        PyModule_AddObjectRef(m, "Context", (PyObject *)&CtxType) < 0 ||
        PyModule_AddObjectRef(m, "Hold", (PyObject *)&HoldType) < 0 ||
        PyModule_AddObjectRef(m, "FetchResult", (PyObject *)FetchResult) < 0 ||
        PyModule_AddObjectRef(m, "RegionInfo", (PyObject *)RegionInfo) < 0 ||
        PyModule_AddStringConstant(m, "VERSION", ECX_VERSION_STRING) < 0 ||
        PyModule_AddStringConstant(m, "DATA_PATHS", ECX_DATA_PATHS) < 0 ||
        PyModule_AddIntConstant(m, "MM_HASH_MAX", ECX_MM_HASH_MAX) < 0)
        goto fail;
    /* The lists of ecx.h, as Python values. */
    PyObject *errors = PyDict_New(), *reasons = PyList_New(0);
    if (!errors || !reasons) goto fail;
#define ERR_(name, code, msg)                                                                      \
    {                                                                                              \
        PyObject *v = PyLong_FromLong(code);                                                       \
        if (!v || PyDict_SetItemString(errors, "ECX_" #name, v) < 0) goto fail;                    \
        Py_DECREF(v);                                                                              \
    }
    ECX_ERRORS(ERR_)
#undef ERR_
#define REASON_(name, meaning)                                                                     \
    {                                                                                              \
        PyObject *v = PyUnicode_FromString(#name);                                                 \
        if (!v || PyList_Append(reasons, v) < 0) goto fail;                                        \
        Py_DECREF(v);                                                                              \
    }
    ECX_REASONS(REASON_)
#undef REASON_
    PyObject *rt = PyList_AsTuple(reasons);
    Py_DECREF(reasons);
    if (!rt || PyModule_AddObject(m, "ERRORS", errors) < 0 ||
        PyModule_AddObject(m, "REASONS", rt) < 0)
        goto fail;
    /* The keyword arguments Context takes: fields[], the one list. */
    PyObject *cf = PyTuple_New(sizeof fields / sizeof *fields);
    for (size_t i = 0; cf && i < sizeof fields / sizeof *fields; i++) {
        PyObject *v = PyUnicode_FromString(fields[i].name);
        if (!v) Py_CLEAR(cf);
        else PyTuple_SET_ITEM(cf, (Py_ssize_t)i, v);
    }
    if (!cf || PyModule_AddObject(m, "CONFIG_FIELDS", cf) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}

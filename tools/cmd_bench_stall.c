/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx bench stall — what fetching costs an inference engine's step, through
 * the public API alone (issue 12's measurements).
 *
 * The producer runs in a child process forked before this process makes
 * any context (so it inherits no library state): it opens a producer
 * context on the path measured, saves each item the benchmark asks for,
 * and otherwise waits on ecx_fd() for at most ecx_next_timeout() and calls
 * ecx_poll(p, 0), as an engine with its own event loop would. It talks to
 * this process over two pipes, one line per command and answer; every wait
 * on it is bounded, it dies with this process (PR_SET_PDEATHSIG), and it is
 * always reaped (asked to quit, then killed after REAP_LIMIT_S).
 *
 * For each data path and item size, with the producer's region holding
 * PROD_SLOTS items of that size and each consumer's CONS_SLOTS:
 *
 *   1. cold / warm: warmup + count fresh consumer contexts, one after the
 *      other. Each first times a memcpy of the size (bench_time_memcpy), then
 *      fetches a missing item twice (XferReq -> NACK_MISSING: the first
 *      opens the control connection, the second is the timed round trip,
 *      RTT), then fetches PROD_SLOTS + 1 fresh items with continuous
 *      polling: the first is "cold" (the data path's first use by this
 *      context: its data connection, its mapping of the producer's region,
 *      first-touch faults), the second comes after IDLE_PAUSE_MS of idle
 *      (blocks this context never read, after the time the library had to
 *      pre-fault them; the process's minor page faults during it are
 *      counted), the last "warm" (every page of the producer's region has
 *      been read through this context's mapping by then). Ratios are
 *      medians over (median memcpy + median RTT).
 *   2. engine loop: the last of those consumers (warm) stays, and for each
 *      step interval S (0 first: continuous polling, the baseline) fetches
 *      warmup + count fresh items the way an engine does: every S ms, one
 *      step = ecx_fetch_from(), then (if still pending) ecx_poll(ctx, 0);
 *      then sleep until the next step boundary (a step that overran starts
 *      the next at once). Each call is timed. Time to ready runs from the
 *      first ecx_fetch_from() call to the end of the one answering READY.
 *
 * Every fetched item is a fresh mm_hash, so each fetch is a real transfer;
 * its bytes are verified (untimed) against the pattern of bench_util.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_ctx.h"
#include "bench_util.h"
#include "cli.h"
#include "ecx.h"
#include "opts.h"

#define MAX_LIST 8
#define MAX_ITEM (1ull << 30) /* 1 GiB */
#define PROD_SLOTS 3          /* items the producer's region holds */
#define CONS_SLOTS 2          /* items a consumer's region holds */
#define FETCH_LIMIT_S 60.0    /* one fetch may take this long, plus LIMIT_STEPS steps */
#define LIMIT_STEPS 1000
#define OPEN_LIMIT_S 120.0    /* the producer's context (region populated) */
#define SAVE_LIMIT_S 30.0     /* a save, waiting for pins to lapse */
#define REAP_LIMIT_S 10.0     /* the producer process exits when asked */
#define MAX_SAMPLES (16u << 20)
#define IDLE_PAUSE_MS 100     /* before a cold/warm context's 2nd fetch */

static const char HELP[] =
    "usage: ecx bench stall [--data LIST] [--size LIST] [--step-ms LIST] [--count N]\n"
    "                       [--warmup N] [options]\n"
    "\n"
    "What fetching costs an inference engine's step (issue 12), through the public\n"
    "API. The producer runs in a child process (its own context on the path\n"
    "measured, driven by ecx_fd/ecx_next_timeout/ecx_poll); this process is the\n"
    "consumer. For each path and size:\n"
    "\n"
    "  cold/warm  COUNT fresh consumer contexts (after WARMUP untimed ones), each:\n"
    "             its region faulted in first by its background thread, as an\n"
    "             engine's is by its first request (backed_ms: how long that\n"
    "             took; not in any other figure; ECX_PREFAULT=0: not waited for);\n"
    "             a timed memcpy of SIZE (destination overwritten first, buffers\n"
    "             already faulted in); RTT = a fetch of an item the producer does\n"
    "             not hold, XferReq -> NACK_MISSING (after one such fetch that opens\n"
    "             the control connection); then 4 fetches of fresh items with\n"
    "             continuous polling: the 1st is cold (the data path's first use by\n"
    "             the context: data connection, fresh mapping of the producer's\n"
    "             region, first-touch page faults), the 2nd comes after 100 ms idle\n"
    "             (blocks never read by the context, after the time the library\n"
    "             had to pre-fault them), the 4th warm (the producer's region\n"
    "             holds 3 items, so every page of it has been read through this\n"
    "             mapping by then).\n"
    "  engine     the last of those consumers (warm) then fetches WARMUP + COUNT\n"
    "             fresh items per step interval S, as an engine does: every S ms\n"
    "             a step = ecx_fetch_from() of the item, then, while it is pending,\n"
    "             ecx_poll(ctx, 0); sleep until the next step boundary (a step that\n"
    "             overran starts the next at once). S = 0 is continuous polling,\n"
    "             always measured first as the baseline. Each call is timed.\n"
    "\n"
    "Every fetch is a fresh mm_hash (a real transfer) and its bytes are verified.\n"
    "  --data LIST            comma-separated paths from shm, tcp, ucx, or all\n"
    "                         (default all; auto means all; all skips a path this\n"
    "                         libecx is built without); run in the order shm, tcp, ucx\n"
    "  --size LIST            item sizes, comma-separated or repeated, up to 8, each\n"
    "                         1 byte to 1Gi (default 28835840,256000000: llava-1.5's\n"
    "                         3520 rows of 4096 bf16, and 31250 rows); under protocol\n"
    "                         version 2 (the default) whole blocks of --block-bytes,\n"
    "                         else a usage error naming the size to give. /dev/shm (or\n"
    "                         $ECX_SHM_DIR) must have room for 5 items of the\n"
    "                         largest size (producer region 3, consumer 2), and\n"
    "                         memory for 7: checked before anything runs\n"
    "  --step-ms LIST         engine step intervals in ms, 0..1000, comma-separated or\n"
    "                         repeated, up to 8 (default 1,20); 0 is always added\n"
    "  --count N              timed fetches per path, size and step, and timed\n"
    "                         cold/warm contexts per path and size (default 5)\n"
    "  --warmup N             untimed ones before them (default 1)\n"
    "  --block-bytes SIZE     block size of the regions (default 8Ki: one row of\n"
    "                         4096 bf16; the figures before version 2 used 1Mi:\n"
    "                         --vllm-version 0.31.0 --block-bytes 1Mi)\n"
    "  --vllm-version, --model, --dtype  compatibility factors (both sides use them);\n"
    "                         --region-bytes is accepted and ignored (regions are\n"
    "                         sized from --size)\n"
    "\n"
    "Output (stdout), per path and size, first\n"
    "  path=P size=B memcpy_ms=X rtt_ms=X cold_ms=X warm_ms=X cold_ratio=X warm_ratio=X\n"
    "    after_idle_ms=X after_idle_ratio=X after_idle_minflt=N backed_ms=X\n"
    "    (on one line; medians over COUNT contexts; cold_ratio = cold_ms / (memcpy_ms\n"
    "    + rtt_ms), the others likewise; after_idle_minflt: this process's minor page\n"
    "    faults during the 2nd fetch), then one line per step interval, 0 first:\n"
    "  path=P size=B step_ms=S polls=N poll_max_ms=X poll_p999_ms=X poll_p50_ms=X\n"
    "    fetch_max_ms=X ready_ms=X ready_ratio_vs_continuous=X ready_floor_ratio=X\n"
    "    (on one line). polls: ecx_poll calls timed over the COUNT fetches; poll_max\n"
    "    the longest of them; p999 / p50 nearest-rank percentiles over all of them\n"
    "    (with under 1000 polls, p999 is the maximum); fetch_max the longest\n"
    "    ecx_fetch_from call; ready_ms the median time to ready; its ratio to\n"
    "    step 0's; ready_floor_ratio the least that ratio can be when READY is seen\n"
    "    only at a step: ceil(T0 / S) * S / T0, T0 being step 0's ready_ms.\n"
    "  Milliseconds with 3 decimals. A summary goes to stderr.\n"
    "\n"
    "Exit status: 0 success, 1 failure (a fetch failed, was not ready within 60 s\n"
    "plus 1000 steps, or delivered wrong bytes; no room), 2 usage error.\n";

/* ---------- the producer process ---------- */

typedef struct producer {
    pid_t pid;
    int to, from;   /* command pipe (write end), answer pipe (read end) */
    char in[1024];  /* answer bytes not yet consumed */
    size_t in_len;
} producer;

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void child_reply(int fd, const char *fmt, ...)
{
    char buf[600];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    (void)write_all(fd, buf, (size_t)n);
}

/* Save mm_hash with the pattern of `size` bytes, retrying while the region
 * is full of items still pinned by grants. */
static int child_save(ecx_ctx *p, const char *name, uint64_t size)
{
    double limit = mono_s() + SAVE_LIMIT_S;
    for (;;) {
        const ecx_segment *segs;
        size_t n;
        int e = ecx_save_begin(p, name, size, &segs, &n);
        if (e == 0) {
            uint64_t off = 0;
            for (size_t i = 0; i < n && off + segs[i].len <= size; i++) {
                bench_fill(segs[i].ptr, off, segs[i].len, size);
                off += segs[i].len;
            }
            e = off == size ? ecx_save_commit(p, name) : ECX_ERANGE;
            if (e == 0) return 0;
            ecx_save_abort(p, name);
        }
        if (e != ECX_ECACHE_FULL || mono_s() > limit) return e;
        ecx_poll(p, 1); /* let the producer see its grants end */
    }
}

/* One command; false to quit. */
static bool child_command(char *line, ecx_ctx **p, const ecx_config *base, int out)
{
    char what[16], arg[ECX_MM_HASH_MAX + 1];
    unsigned long long n = 0;
    if (sscanf(line, "open %15s %llu", what, &n) == 2) {
        ecx_free(*p);
        *p = NULL;
        ecx_config pc = *base;
        pc.role = ECX_ROLE_PRODUCER;
        pc.listen = "127.0.0.1:0";
        pc.advertise_host = NULL;
        pc.data = what;
        pc.region_bytes = n;
        /* The region holds PROD_SLOTS items and the one consumer connection
         * may still pin the last item when it asks for the next (its
         * completion in flight): allow it the whole region, or the default
         * 50% answers NACK_INTERNAL on a slow machine (seen under ASan). */
        pc.max_conn_pin_pct = 100;
        pc.instance = NULL;
        int e = ecx_new(&pc, p);
        if (e == ECX_EDATA_NOPATH) {
            *p = NULL;
            child_reply(out, "nopath");
        } else if (e) {
            *p = NULL;
            child_reply(out, "err cannot start the %s producer: %s", what, ecx_strerror(e));
        } else
            child_reply(out, "ok %d", ecx_listen_port(*p));
    } else if (sscanf(line, "save %255s %llu", arg, &n) == 2) {
        int e = *p ? child_save(*p, arg, n) : ECX_EINVAL;
        if (e)
            child_reply(out, "err cannot save %llu bytes: %s", n, ecx_strerror(e));
        else
            child_reply(out, "ok");
    } else if (!strcmp(line, "close")) {
        ecx_free(*p);
        *p = NULL;
        child_reply(out, "ok");
    } else if (!strcmp(line, "quit")) {
        return false;
    } else
        child_reply(out, "err unknown command");
    return true;
}

static void __attribute__((noreturn)) child_main(int in, int out, const ecx_config *base,
                                                  pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    ecx_ctx *p = NULL;
    char buf[1024];
    size_t len = 0;
    for (;;) {
        struct pollfd pf[2] = {{.fd = in, .events = POLLIN},
                               {.fd = p ? ecx_fd(p) : -1, .events = POLLIN}};
        int t = 1000;
        if (p) {
            t = ecx_next_timeout(p);
            if (t < 0 || t > 100) t = 100;
        }
        poll(pf, 2, t);
        if (p) ecx_poll(p, 0);
        if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t r = read(in, buf + len, sizeof buf - 1 - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* the benchmark is gone */
        len += (size_t)r;
        char *nl;
        bool go = true;
        while (go && (nl = memchr(buf, '\n', len))) {
            *nl = 0;
            go = child_command(buf, &p, base, out);
            len -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, len);
        }
        if (!go || len == sizeof buf - 1) break;
    }
    ecx_free(p);
    _exit(0);
}

static int producer_start(producer *pr, const ecx_config *base)
{
    int a[2], b[2];
    memset(pr, 0, sizeof *pr);
    pr->pid = -1;
    if (pipe2(a, O_CLOEXEC)) return -1;
    if (pipe2(b, O_CLOEXEC)) {
        close(a[0]), close(a[1]);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        close(a[1]), close(b[0]);
        child_main(a[0], b[1], base, parent);
    }
    close(a[0]), close(b[1]);
    if (pid < 0) {
        close(a[1]), close(b[0]);
        return -1;
    }
    pr->pid = pid;
    pr->to = a[1];
    pr->from = b[0];
    return 0;
}

/* Send one command line; wait at most limit_s for its answer. 0 with what
 * follows "ok" in ans (if given), or -1 with a message printed. */
static int producer_call(producer *pr, double limit_s, char *ans, size_t cap, const char *fmt,
                         ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof cmd - 1) return -1;
    cmd[n++] = '\n';
    if (write_all(pr->to, cmd, (size_t)n)) {
        fprintf(stderr, "ecx: bench stall: the producer process is gone\n");
        return -1;
    }
    double limit = mono_s() + limit_s;
    char *nl;
    while (!(nl = memchr(pr->in, '\n', pr->in_len))) {
        double left = limit - mono_s();
        if (left <= 0 || pr->in_len == sizeof pr->in) {
            fprintf(stderr,
                    "ecx: bench stall: the producer process did not answer '%.*s' in %.0f s\n",
                    n - 1, cmd, limit_s);
            return -1;
        }
        struct pollfd pf = {.fd = pr->from, .events = POLLIN};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR) return -1;
        if (r <= 0) continue;
        ssize_t got = read(pr->from, pr->in + pr->in_len, sizeof pr->in - pr->in_len);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            fprintf(stderr, "ecx: bench stall: the producer process is gone\n");
            return -1;
        }
        pr->in_len += (size_t)got;
    }
    *nl = 0;
    int rc = 0;
    if (!strncmp(pr->in, "ok", 2)) {
        if (ans) snprintf(ans, cap, "%s", pr->in + 2 + (pr->in[2] == ' '));
    } else if (!strcmp(pr->in, "nopath")) {
        rc = 1; /* the path is not built into this libecx */
    } else {
        fprintf(stderr, "ecx: bench stall: producer: %s\n",
                strncmp(pr->in, "err ", 4) ? pr->in : pr->in + 4);
        rc = -1;
    }
    pr->in_len -= (size_t)(nl + 1 - pr->in);
    memmove(pr->in, nl + 1, pr->in_len);
    return rc;
}

/* Ask the producer to quit, wait REAP_LIMIT_S at most, then kill it; always
 * reaps it. */
static void producer_stop(producer *pr)
{
    if (pr->pid <= 0) return;
    (void)write_all(pr->to, "quit\n", 5);
    close(pr->to);
    double limit = mono_s() + REAP_LIMIT_S;
    int st;
    pid_t r;
    while ((r = waitpid(pr->pid, &st, WNOHANG)) == 0 || (r < 0 && errno == EINTR)) {
        if (mono_s() > limit) {
            fprintf(stderr, "ecx: bench stall: the producer process did not exit; killing it\n");
            kill(pr->pid, SIGKILL);
            while (waitpid(pr->pid, &st, 0) < 0 && errno == EINTR) {
            }
            break;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    close(pr->from);
    pr->pid = -1;
}

/* ---------- the consumer: an engine ---------- */

typedef struct samples {
    uint64_t *v; /* durations, ns */
    size_t n, cap;
    uint64_t max;
} samples;

static void samples_add(samples *s, uint64_t ns)
{
    if (ns > s->max) s->max = ns;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4096;
        uint64_t *v = cap <= MAX_SAMPLES ? realloc(s->v, cap * sizeof *v) : NULL;
        if (!v) return; /* the maximum stays exact; percentiles from what fits */
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = ns;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of v (sorted here), in ms. */
static double pct_ms(samples *s, double p)
{
    if (!s->n) return 0;
    qsort(s->v, s->n, sizeof *s->v, cmp_u64);
    size_t k = (size_t)ceil(p * (double)s->n);
    if (k < 1) k = 1;
    if (k > s->n) k = s->n;
    return (double)s->v[k - 1] / 1e6;
}

typedef struct stall {
    const ecx_config *base;
    int iters, warmup;
    producer pr;
    const char *path; /* the one measured now */
    bool all;         /* --data all: a path not built in is skipped */
    int port;         /* its producer's */
    uint8_t *src, *dst; /* the memcpy baseline's */
    uint64_t seq;       /* makes every mm_hash new */
} stall;

static void sleep_until(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* A fetch that returned something other than READY. */
static void fetch_failed(const stall *b, uint64_t size, int st, int reason)
{
    fprintf(stderr, "ecx: bench stall: %s fetch of %llu bytes: %s\n", b->path,
            (unsigned long long)size,
            st == ECX_FETCH_PENDING ? "not ready within the fetch limit"
            : st == ECX_FETCH_LOCAL ? ecx_reason_name(reason)
                                    : ecx_strerror(st));
}

/* The producer saves a fresh item of `size` bytes; the engine fetches it,
 * stepping every step_ms (0: continuously), timing its calls into polls /
 * *fetch_max when given; the bytes are then verified. Seconds from the
 * first fetch call to READY, or < 0. */
static double engine_fetch(stall *b, ecx_ctx *cons, uint64_t size, int step_ms, samples *polls,
                           uint64_t *fetch_max)
{
    char name[ECX_MM_HASH_MAX + 1];
    snprintf(name, sizeof name, "ecx-stall-%s-%llu-%d-%llu", b->path, (unsigned long long)size,
             (int)getpid(), (unsigned long long)++b->seq);
    if (producer_call(&b->pr, SAVE_LIMIT_S + 5, NULL, 0, "save %s %llu", name,
                      (unsigned long long)size))
        return -1;
    ecx_announcement from = {.peer_host = "127.0.0.1", .peer_port = b->port, .size_bytes = size};
    const uint64_t step = (uint64_t)step_ms * 1000000ull;
    uint64_t t0 = bench_now_ns(), next = t0, t;
    uint64_t limit = t0 + (uint64_t)(FETCH_LIMIT_S * 1e9) + LIMIT_STEPS * step;
    int st, reason = 0;
    for (;;) {
        uint64_t a = bench_now_ns();
        st = ecx_fetch_from(cons, name, &from, size, &reason);
        t = bench_now_ns();
        if (fetch_max && t - a > *fetch_max) *fetch_max = t - a;
        if (st != ECX_FETCH_PENDING || t > limit) break;
        a = bench_now_ns();
        int e = ecx_poll(cons, 0);
        t = bench_now_ns();
        if (polls) samples_add(polls, t - a);
        if (e < 0) {
            fprintf(stderr, "ecx: bench stall: ecx_poll: %s\n", ecx_strerror(e));
            return -1;
        }
        if (step) {
            next += step;
            if (next > t)
                sleep_until(next);
            else
                next = t; /* overran: the next step starts now */
        }
    }
    if (st != ECX_FETCH_READY) {
        fetch_failed(b, size, st, reason);
        return -1;
    }
    double ready = (double)(t - t0) / 1e9;
    const ecx_segment *segs;
    size_t n;
    uint64_t got;
    int e = ecx_load(cons, name, &segs, &n, &got);
    if (e) {
        fprintf(stderr, "ecx: bench stall: %s: cannot load a fetched item: %s\n", b->path,
                ecx_strerror(e));
        return -1;
    }
    bool same = got == size;
    uint64_t off = 0;
    for (size_t i = 0; same && i < n; i++) {
        same = off + segs[i].len <= size && bench_check(segs[i].ptr, off, segs[i].len, size);
        off += segs[i].len;
    }
    ecx_release(cons, name);
    if (!same || off != size) {
        fprintf(stderr, "ecx: bench stall: %s fetch delivered wrong bytes\n", b->path);
        return -1;
    }
    return ready;
}

/* One control round trip: a fetch of an item the producer does not hold,
 * polled continuously until NACK_MISSING comes back. Seconds, or < 0. */
static double rtt_once(stall *b, ecx_ctx *cons)
{
    char name[ECX_MM_HASH_MAX + 1];
    snprintf(name, sizeof name, "ecx-stall-missing-%d-%llu", (int)getpid(),
             (unsigned long long)++b->seq);
    /* Announced as one block: under version 2 a size that is not whole
     * blocks is refused locally (SIZE_MISMATCH) before any request. */
    ecx_announcement from = {.peer_host = "127.0.0.1", .peer_port = b->port,
                             .size_bytes = b->base->block_bytes};
    int st, reason = 0;
    double t0 = mono_s(), limit = t0 + FETCH_LIMIT_S;
    while ((st = ecx_fetch_from(cons, name, &from, from.size_bytes, &reason)) ==
               ECX_FETCH_PENDING &&
           mono_s() < limit)
        ecx_poll(cons, 0);
    double t = mono_s() - t0;
    if (st != ECX_FETCH_LOCAL || reason != ECX_REASON_NACK_MISSING) {
        fprintf(stderr,
                "ecx: bench stall: %s: a fetch of a missing item came to %s, not NACK_MISSING\n",
                b->path, st == ECX_FETCH_LOCAL ? ecx_reason_name(reason)
                         : st == ECX_FETCH_PENDING ? "no answer"
                         : st == ECX_FETCH_READY   ? "READY"
                                                   : ecx_strerror(st));
        return -1;
    }
    return t;
}

static int new_consumer(const stall *b, uint64_t item, ecx_ctx **out)
{
    ecx_config cc = *b->base;
    cc.role = ECX_ROLE_CONSUMER;
    cc.data = b->path;
    cc.region_bytes = CONS_SLOTS * item;
    cc.instance = NULL; /* a fresh region */
    int e = ecx_new(&cc, out);
    if (e) {
        *out = NULL;
        fprintf(stderr, "ecx: bench stall: %s: cannot start a consumer: %s\n", b->path,
                ecx_strerror(e));
    }
    return e ? -1 : 0;
}

/* A metric's value from ecx_metrics' text, or -1. */
/* Cold and warm fetches against memcpy + RTT; leaves the last (warm)
 * consumer in *keep. */
static int cold_warm(stall *b, uint64_t size, uint64_t item, ecx_ctx **keep)
{
    int n = b->iters, rc = -1;
    double *tm = calloc((size_t)n, sizeof *tm), *trtt = calloc((size_t)n, sizeof *trtt);
    double *tc = calloc((size_t)n, sizeof *tc), *tw = calloc((size_t)n, sizeof *tw);
    double *ti = calloc((size_t)n, sizeof *ti), *fi = calloc((size_t)n, sizeof *fi);
    double *tb = calloc((size_t)n, sizeof *tb);
    ecx_ctx *cons = NULL;
    if (!tm || !trtt || !tc || !tw || !ti || !fi || !tb) goto out;
    for (int it = 0; it < b->warmup + n; it++) {
        ecx_free(cons); /* its region goes before the next one is made */
        cons = NULL;
        double m = bench_time_memcpy(b->dst, b->src, size);
        if (!bench_check(b->dst, 0, size, size)) {
            fprintf(stderr, "ecx: bench stall: memcpy baseline delivered wrong bytes\n");
            goto out;
        }
        if (new_consumer(b, item, &cons)) goto out;
        double backed = bench_wait_backed(cons, FETCH_LIMIT_S);
        double r, cold, idle, warm = 0;
        if (rtt_once(b, cons) < 0 || (r = rtt_once(b, cons)) < 0) goto out;
        if ((cold = engine_fetch(b, cons, size, 0, NULL, NULL)) < 0) goto out;
        sleep_until(bench_now_ns() + IDLE_PAUSE_MS * 1000000ull);
        struct rusage ru0, ru1;
        getrusage(RUSAGE_SELF, &ru0);
        if ((idle = engine_fetch(b, cons, size, 0, NULL, NULL)) < 0) goto out;
        getrusage(RUSAGE_SELF, &ru1);
        for (int k = 1; k < PROD_SLOTS; k++)
            if ((warm = engine_fetch(b, cons, size, 0, NULL, NULL)) < 0) goto out;
        if (it < b->warmup) continue;
        tm[it - b->warmup] = m, trtt[it - b->warmup] = r;
        tc[it - b->warmup] = cold, tw[it - b->warmup] = warm, ti[it - b->warmup] = idle;
        fi[it - b->warmup] = (double)(ru1.ru_minflt - ru0.ru_minflt);
        tb[it - b->warmup] = backed;
    }
    double m = bench_median(tm, n), r = bench_median(trtt, n);
    double c = bench_median(tc, n), w = bench_median(tw, n);
    double i = bench_median(ti, n), f = bench_median(fi, n), bk = bench_median(tb, n);
    fprintf(stderr,
            "bench stall: %s %llu B: memcpy %.3f ms + RTT %.3f ms (missing item); first fetch of a "
            "fresh consumer %.3f ms, after %d ms idle %.3f ms (%.0f minor faults), warm %.3f ms "
            "(medians of %d)\n",
            b->path, (unsigned long long)size, m * 1e3, r * 1e3, c * 1e3, IDLE_PAUSE_MS, i * 1e3,
            f, w * 1e3, n);
    printf("path=%s size=%llu memcpy_ms=%.3f rtt_ms=%.3f cold_ms=%.3f warm_ms=%.3f "
           "cold_ratio=%.3f warm_ratio=%.3f after_idle_ms=%.3f after_idle_ratio=%.3f "
           "after_idle_minflt=%.0f backed_ms=%.3f\n",
           b->path, (unsigned long long)size, m * 1e3, r * 1e3, c * 1e3, w * 1e3, c / (m + r),
           w / (m + r), i * 1e3, i / (m + r), f, bk * 1e3);
    fflush(stdout);
    *keep = cons;
    cons = NULL;
    rc = 0;
out:
    ecx_free(cons);
    free(tm), free(trtt), free(tc), free(tw), free(ti), free(fi), free(tb);
    return rc;
}

/* The engine loop at each step interval; steps[0] is 0. */
static int engine_steps(stall *b, ecx_ctx *cons, uint64_t size, const int *steps, int nsteps)
{
    int n = b->iters, rc = -1;
    double *tr = calloc((size_t)n, sizeof *tr), t0 = 0;
    samples polls = {0};
    if (!tr) goto out;
    for (int s = 0; s < nsteps; s++) {
        uint64_t fetch_max = 0;
        polls.n = 0, polls.max = 0;
        for (int it = 0; it < b->warmup + n; it++) {
            bool timed = it >= b->warmup;
            double t = engine_fetch(b, cons, size, steps[s], timed ? &polls : NULL,
                                    timed ? &fetch_max : NULL);
            if (t < 0) goto out;
            if (timed) tr[it - b->warmup] = t;
        }
        double ready = bench_median(tr, n);
        if (s == 0) t0 = ready;
        double floor_ratio = 1;
        if (steps[s] > 0 && t0 > 0) {
            double sd = steps[s] / 1e3;
            floor_ratio = ceil(t0 / sd) * sd / t0;
        }
        double pmax = (double)polls.max / 1e6;
        double p999 = pct_ms(&polls, 0.999), p50 = pct_ms(&polls, 0.5);
        fprintf(stderr,
                "bench stall: %s %llu B, step %d ms: longest ecx_poll %.3f ms (p99.9 %.3f, p50 "
                "%.3f, %zu polls), longest ecx_fetch_from %.3f ms, ready in %.3f ms (%.2fx "
                "continuous)\n",
                b->path, (unsigned long long)size, steps[s], pmax, p999, p50, polls.n,
                (double)fetch_max / 1e6, ready * 1e3, t0 > 0 ? ready / t0 : 0);
        printf("path=%s size=%llu step_ms=%d polls=%zu poll_max_ms=%.3f poll_p999_ms=%.3f "
               "poll_p50_ms=%.3f fetch_max_ms=%.3f ready_ms=%.3f ready_ratio_vs_continuous=%.3f "
               "ready_floor_ratio=%.3f\n",
               b->path, (unsigned long long)size, steps[s], polls.n, pmax, p999, p50,
               (double)fetch_max / 1e6, ready * 1e3, t0 > 0 ? ready / t0 : 0, floor_ratio);
        fflush(stdout);
    }
    rc = 0;
out:
    free(polls.v);
    free(tr);
    return rc;
}

/* Room for the regions (tmpfs) and the buffers (memory), before anything
 * is made. */
static int check_room(uint64_t item, uint64_t max_size)
{
    const char *dir = shm_dir();
    uint64_t regions = (PROD_SLOTS + CONS_SLOTS) * item, mem = regions + 2 * max_size;
    struct statvfs sv;
    if (statvfs(dir, &sv) == 0) {
        uint64_t free_b = (uint64_t)sv.f_bavail * sv.f_frsize;
        if (free_b < regions + (64ull << 20)) {
            fprintf(stderr,
                    "ecx: bench stall: items of %llu bytes need %.2f GB free in %s (the producer's "
                    "region holds %d, the consumer's %d), and %.2f GB are free; free some, set "
                    "ECX_SHM_DIR to a larger tmpfs, or pass a smaller --size\n",
                    (unsigned long long)max_size, (double)regions / 1e9, dir, PROD_SLOTS,
                    CONS_SLOTS, (double)free_b / 1e9);
            return -1;
        }
    }
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
        fclose(f);
        if (kb && kb * 1024ull < mem + (256ull << 20)) {
            fprintf(stderr,
                    "ecx: bench stall: items of %llu bytes need about %.2f GB of memory (regions "
                    "%.2f GB, buffers %.2f GB), and %.2f GB are available; pass a smaller --size\n",
                    (unsigned long long)max_size, (double)mem / 1e9, (double)regions / 1e9,
                    (double)(2 * max_size) / 1e9, (double)kb * 1024 / 1e9);
            return -1;
        }
    }
    return 0;
}

static int run(stall *b, const char *const *paths, int npaths, const uint64_t *sizes, int nsizes,
               const int *steps, int nsteps)
{
    uint64_t max = 0, bs = b->base->block_bytes;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > max) max = sizes[i];
    if (check_room(bench_blocks_of(max, bs), max)) return -1;
    signal(SIGPIPE, SIG_IGN);
    /* Forked before this process makes any context or thread. */
    if (producer_start(&b->pr, b->base)) {
        fprintf(stderr, "ecx: bench stall: cannot start the producer process: %s\n",
                strerror(errno));
        return -1;
    }
    int rc = -1;
    ecx_ctx *cons = NULL;
    b->src = malloc(max);
    b->dst = malloc(max);
    if (!b->src || !b->dst) {
        fprintf(stderr, "ecx: bench stall: out of memory\n");
        goto out;
    }
    bench_fill(b->src, 0, max, max);
    memset(b->dst, 0, max);
    for (int p = 0; p < npaths; p++) {
        b->path = paths[p];
        for (int s = 0; s < nsizes; s++) {
            uint64_t item = bench_blocks_of(sizes[s], bs);
            char port[32];
            bench_fill(b->src, 0, sizes[s], sizes[s]); /* the pattern of this size */
            int o = producer_call(&b->pr, OPEN_LIMIT_S, port, sizeof port, "open %s %llu",
                                  b->path, (unsigned long long)(PROD_SLOTS * item));
            if (o == 1 && b->all) {
                fprintf(stderr, "ecx: bench stall: %s is not built into this libecx; skipped\n",
                        b->path);
                break;
            }
            if (o == 1)
                fprintf(stderr, "ecx: bench stall: %s is not built into this libecx\n", b->path);
            if (o) goto out;
            b->port = atoi(port);
            if (cold_warm(b, sizes[s], item, &cons)) goto out;
            if (engine_steps(b, cons, sizes[s], steps, nsteps)) goto out;
            ecx_free(cons);
            cons = NULL;
        }
        if (producer_call(&b->pr, OPEN_LIMIT_S, NULL, 0, "close")) goto out;
    }
    rc = 0;
out:
    ecx_free(cons);
    producer_stop(&b->pr);
    free(b->src), free(b->dst);
    return rc;
}

/* Split a comma-separated option value; each piece to fn. */
typedef int (*piece_fn)(const char *piece, void *arg);

static int each_piece(const char *opt, const char *val, piece_fn fn, void *arg)
{
    char buf[256];
    if (strlen(val) >= sizeof buf) return usage_error("%s: '%s' is too long", opt, val);
    strcpy(buf, val);
    char *save = NULL, *tok = strtok_r(buf, ",", &save);
    if (!tok) return usage_error("%s: empty list", opt);
    for (; tok; tok = strtok_r(NULL, ",", &save))
        if (fn(tok, arg)) return EXIT_USAGE;
    return 0;
}

typedef struct lists {
    uint64_t sizes[MAX_LIST];
    int nsizes;
    int steps[MAX_LIST + 1];
    int nsteps;
    bool want[3]; /* shm, tcp, ucx */
    bool all;     /* "all" (or the default): skip a path not built in */
    bool data_given;
} lists;

static int add_size(const char *s, void *arg)
{
    lists *l = arg;
    uint64_t v;
    if (l->nsizes == MAX_LIST) return usage_error("--size: at most %d sizes", MAX_LIST);
    if (parse_size("--size", s, &v)) return EXIT_USAGE;
    if (v == 0 || v > MAX_ITEM)
        return usage_error("--size: '%s' is not 1 byte to 1Gi (%llu bytes)", s,
                           (unsigned long long)MAX_ITEM);
    l->sizes[l->nsizes++] = v;
    return 0;
}

static int add_step(const char *s, void *arg)
{
    lists *l = arg;
    int64_t v;
    if (parse_int("--step-ms", s, 0, 1000, &v)) return EXIT_USAGE;
    for (int i = 0; i < l->nsteps; i++)
        if (l->steps[i] == (int)v) return 0;
    if (l->nsteps == MAX_LIST + 1) return usage_error("--step-ms: at most %d intervals", MAX_LIST);
    l->steps[l->nsteps++] = (int)v;
    return 0;
}

static int add_path(const char *s, void *arg)
{
    lists *l = arg;
    if (!l->data_given) l->want[0] = l->want[1] = l->want[2] = false, l->data_given = true;
    if (!strcmp(s, "all") || !strcmp(s, "auto"))
        l->want[0] = l->want[1] = l->want[2] = l->all = true;
    else if (!strcmp(s, "shm"))
        l->want[0] = true;
    else if (!strcmp(s, "tcp"))
        l->want[1] = true;
    else if (!strcmp(s, "ucx"))
        l->want[2] = true;
    else
        return usage_error("--data takes all, shm, tcp or ucx (comma-separated), not '%s'", s);
    return 0;
}

int cmd_bench_stall(int argc, char **argv)
{
    enum { O_SIZE = 2000, O_COUNT, O_WARMUP, O_STEP };
    static const struct option opts[] = {{"size", required_argument, 0, O_SIZE},
                                         {"count", required_argument, 0, O_COUNT},
                                         {"warmup", required_argument, 0, O_WARMUP},
                                         {"step-ms", required_argument, 0, O_STEP},
                                         {"help", no_argument, 0, 'h'},
                                         COMMON_LONG_OPTS,
                                         {0, 0, 0, 0}};
    ecx_config cfg;
    ecx_config_init(&cfg);
    lists l = {.steps = {0}, .nsteps = 1, .want = {true, true, true}};
    bool steps_given = false;
    stall b = {.iters = 5, .warmup = 1};
    int c;
    int64_t v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == OPT_DATA) {
            if (each_piece("--data", optarg, add_path, &l)) return EXIT_USAGE;
            continue;
        }
        int r = common_opt(c, optarg, &cfg, NULL);
        if (r < 0) return EXIT_USAGE;
        if (r > 0) continue;
        switch (c) {
        case 'h': fputs(HELP, stdout); return EXIT_OK;
        case O_SIZE:
            if (each_piece("--size", optarg, add_size, &l)) return EXIT_USAGE;
            break;
        case O_STEP:
            steps_given = true;
            if (each_piece("--step-ms", optarg, add_step, &l)) return EXIT_USAGE;
            break;
        case O_COUNT:
            if (parse_int("--count", optarg, 1, 10000, &v)) return EXIT_USAGE;
            b.iters = (int)v;
            break;
        case O_WARMUP:
            if (parse_int("--warmup", optarg, 0, 10000, &v)) return EXIT_USAGE;
            b.warmup = (int)v;
            break;
        default: return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return usage_error("bench stall takes no arguments ('%s'); try 'ecx bench stall --help'",
                           argv[optind]);
    if (common_finish(&cfg)) return EXIT_USAGE;
    if (l.nsizes == 0) l.sizes[l.nsizes++] = 28835840, l.sizes[l.nsizes++] = 256000000;
    for (int i = 0; i < l.nsizes; i++)
        if (whole_blocks_check("bench stall --size", l.sizes[i], &cfg)) return EXIT_USAGE;
    if (!steps_given) l.steps[l.nsteps++] = 1, l.steps[l.nsteps++] = 20;
    static const char *const names[3] = {"shm", "tcp", "ucx"};
    const char *paths[3];
    int np = 0;
    for (int i = 0; i < 3; i++)
        if (l.want[i]) paths[np++] = names[i];
    b.base = &cfg;
    b.all = l.all || !l.data_given;
    return run(&b, paths, np, l.sizes, l.nsizes, l.steps, l.nsteps) ? EXIT_FAIL : EXIT_OK;
}

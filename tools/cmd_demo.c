/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx demo — the main job in one command: a real producer (`ecx serve`,
 * exec'd from this binary) and several consumer processes on loopback move
 * realistic encodings (a mix of 4.7 MB and 28.8 MB), verify every byte, and
 * then show the three ways a fetch can go other than "ready": a miss
 * (NACK_MISSING), an item that is not ready yet (retried until it lands) and
 * a producer that was SIGKILLed (the consumer falls back). It prints one
 * short table and exits 0 only if every expectation held.
 *
 * Why it is built this way: the consumers are forked children that drive
 * the library directly (ecx_new / ecx_fetch / ecx_poll / ecx_load), so the
 * demo can time each fetch without the file writes `ecx get` does, verify
 * bytes in place, and read the consumer's own retry counter. Each child
 * writes its results into a shared anonymous mapping the parent reads after
 * reaping it. Every region file of the demo lives in a private directory
 * under /dev/shm (ECX_SHM_DIR, inherited by the children); at the end the
 * orphan left by the killed producer is reaped and the directory removed,
 * so /dev/shm is left as it was found. Every wait is bounded, every child
 * is reaped, and on any failure the survivors are killed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ecx.h"
#include "opts.h"

static const char HELP[] =
    "usage: ecx demo [options]\n"
    "\n"
    "Run the whole system on loopback and check that it behaves: one producer\n"
    "(`ecx serve --synthetic`, a child process) serves a mix of 4.7 MB and 28.8 MB\n"
    "encodings; several consumer processes fetch them all at once and verify every\n"
    "byte. Then: a fetch of an item the producer lacks (NACK_MISSING -> encode\n"
    "locally); a second producer whose items are not ready for --ready-delay-ms (the\n"
    "consumer retries and the item lands); and that producer SIGKILLed before a fetch\n"
    "(the consumer falls back). Prints a table and PASS/FAIL for each scenario.\n"
    "\n"
    "options:\n"
    "  --consumers N          consumer processes for the main load (default: CPUs + 1,\n"
    "                         2..8)\n"
    "  --items N              encodings in the main load, every third 28.8 MB, the\n"
    "                         rest 4.7 MB (default 24, fewer if /dev/shm is small)\n"
    "  --data PATH            data path for producers and consumers: " ECX_DATA_PATHS "\n"
    "                         (default auto; ucx and nixl: trusted networks only, see\n"
    "                         README's threat model; nixl between ecx ends is auto's paths)\n"
    "  --ack-timeout-ms MS    consumer ack timeout (default 300; a producer that\n"
    "                         accepts and stays silent costs about this much, a killed\n"
    "                         one's closed port falls back at once: REFUSED)\n"
    "  --ready-delay-ms MS    how long the second producer keeps items not ready\n"
    "                         (default 400)\n"
    "  --keep                 keep the work directory (announcements, child logs)\n"
    "  --tamper               flip one byte of every fetched item before verifying it:\n"
    "                         the checks must catch it, so the demo fails (exit 1)\n"
    "\n"
    "Exit status: 0 every expectation held; 1 one did not (the table says which);\n"
    "2 usage error.\n";

#define SMALL_BYTES 4718592ull  /* llava-1.5: 576 rows of 4096 bf16 */
#define LARGE_BYTES 28835840ull /* 3520 rows */
#define MAX_ITEMS 1000
#define MAX_CONSUMERS 16

enum scenario { SC_MAIN, SC_MISS, SC_NOT_READY, SC_GONE, SC_COUNT };

/* One fetch: set up by the parent, filled in by the consumer child. */
typedef struct job {
    char hash[65];
    uint64_t size;
    int scenario;
    int consumer;    /* which child fetches it */
    const char *ann; /* announcement JSON (parent memory, inherited) */
    bool verify;     /* content is synthetic: check every byte */
    int done;        /* the child finished it */
    int outcome;     /* ECX_FETCH_READY / ECX_FETCH_LOCAL, -1 not finished */
    int reason;      /* enum ecx_reason when local */
    int verified;    /* 1 bytes matched, 0 not checked, -1 mismatch */
    double t0, t1;   /* CLOCK_MONOTONIC seconds */
} job;

/* What each consumer child says about itself. */
typedef struct child_stat {
    int started;
    int err;          /* ecx_new failed or similar */
    uint64_t retries; /* ecx_consumer_retries_total */
    double t0, t1;    /* first fetch, last outcome */
} child_stat;

typedef struct demo {
    int consumers, items;
    const char *data;
    int64_t ack_ms, delay_ms;
    bool keep, tamper;
    char exe[4096];
    char work[256]; /* /tmp/ecx-demo.XXXXXX: announcements, logs */
    char shm[256];  /* /dev/shm/ecx-demo.XXXXXX: region files */
    pid_t prod_a, prod_b;
    job *jobs; /* shared mapping */
    size_t n_jobs, cap_jobs;
    child_stat *stats; /* shared mapping, one per child */
    int *gate;         /* shared: [0] children started, [1] children done fetching */
    json_t *ann_a, *ann_b;
    json_t *main_ann;  /* mm_hash -> announcement text */
    char *ann_text[4]; /* announcements the scenarios use, freed at the end */
} demo;

static volatile sig_atomic_t stop;
static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static double now_s(void)
{
    return mono_s();
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Wait up to timeout_ms for pid; *status gets its wait status. Returns 0
 * if it was reaped, -1 if it is still running. */
static int wait_child(pid_t pid, int timeout_ms, int *status)
{
    double end = now_s() + timeout_ms / 1000.0;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) return 0;
        if (now_s() >= end) return -1;
        sleep_ms(5);
    }
}

/* Stop pid: sig, then SIGKILL after grace_ms; always reaped. Returns the
 * wait status. */
static int stop_child(pid_t pid, int sig, int grace_ms)
{
    int st = 0;
    if (pid <= 0) return 0;
    kill(pid, sig);
    if (wait_child(pid, grace_ms, &st)) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    return st;
}

/* Point stdout and stderr of this (child) process at path. */
static void redirect_output(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
}

/* ---------- producers ---------- */

/* Start `ecx serve` serving the synthetic items and wait (bounded) for its
 * announcements. Returns them, or NULL (the child is stopped and reaped). */
static json_t *start_producer(demo *d, const char *name, uint64_t n_small, uint64_t n_large,
                              int64_t delay_ms, pid_t *pid_out)
{
    char ann[400], log[400], small[64], large[64], delay[32];
    snprintf(ann, sizeof ann, "%s/%s.json", d->work, name);
    snprintf(log, sizeof log, "%s/%s.log", d->work, name);
    snprintf(small, sizeof small, "%llu:%llu", (unsigned long long)n_small, SMALL_BYTES);
    snprintf(large, sizeof large, "%llu:%llu", (unsigned long long)n_large, LARGE_BYTES);
    snprintf(delay, sizeof delay, "%lld", (long long)delay_ms);
    const char *argv[20];
    int a = 0;
    argv[a++] = d->exe;
    argv[a++] = "serve";
    argv[a++] = "--listen";
    argv[a++] = "127.0.0.1:0";
    argv[a++] = "--announce-out";
    argv[a++] = ann;
    argv[a++] = "--data";
    argv[a++] = d->data;
    if (n_small) argv[a++] = "--synthetic", argv[a++] = small;
    if (n_large) argv[a++] = "--synthetic", argv[a++] = large;
    if (delay_ms) argv[a++] = "--ready-delay-ms", argv[a++] = delay;
    argv[a] = NULL;

    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ecx: demo: fork: %s\n", strerror(errno));
        return NULL;
    }
    if (pid == 0) {
        redirect_output(log);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execv(d->exe, (char *const *)argv);
        _exit(127);
    }
    *pid_out = pid;
    double end = now_s() + 20; /* a sanitizer build starts slowly */
    while (!stop && now_s() < end) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "ecx: demo: producer %s exited early (see %s)\n", name, log);
            *pid_out = 0;
            return NULL;
        }
        if (access(ann, R_OK) == 0) {
            json_error_t err;
            json_t *j = json_load_file(ann, 0, &err);
            if (j && json_is_object(j)) return j;
            json_decref(j);
            fprintf(stderr, "ecx: demo: %s: %s\n", ann, err.text);
            break;
        }
        sleep_ms(10);
    }
    if (!stop && now_s() >= end)
        fprintf(stderr, "ecx: demo: producer %s did not announce in time (see %s)\n", name, log);
    stop_child(pid, SIGKILL, 1000);
    *pid_out = 0;
    return NULL;
}

/* ---------- consumers (forked children) ---------- */

static job *add_job(demo *d, const char *hash, uint64_t size, int scenario, int consumer,
                    const char *ann, bool verify)
{
    if (d->n_jobs == d->cap_jobs) return NULL;
    job *j = &d->jobs[d->n_jobs++];
    memset(j, 0, sizeof *j);
    snprintf(j->hash, sizeof j->hash, "%s", hash);
    j->size = size, j->scenario = scenario, j->consumer = consumer;
    j->ann = ann, j->verify = verify, j->outcome = -1;
    return j;
}

/* Compare an item's bytes, in place, with its synthetic content. */
static int verify_item(ecx_ctx *ctx, job *j, bool tamper, uint8_t *buf, size_t buf_len)
{
    const ecx_segment *segs; /* the library's, valid until ecx_release */
    size_t n;
    uint64_t size;
    int rc = ecx_load(ctx, j->hash, &segs, &n, &size);
    if (rc) {
        fprintf(stderr, "demo consumer: %s: cannot load: %s\n", j->hash, ecx_strerror(rc));
        return -1;
    }
    if (tamper && n && segs[0].len) segs[0].ptr[segs[0].len / 2] ^= 0x5a;
    bool same = size == j->size;
    uint64_t off = 0;
    for (size_t i = 0; same && i < n; i++) {
        for (size_t k = 0; same && k < segs[i].len; k += buf_len) {
            size_t len = segs[i].len - k < buf_len ? segs[i].len - k : buf_len;
            synthetic_fill(j->hash, buf, off + k, len);
            if (memcmp(buf, segs[i].ptr + k, len)) {
                fprintf(stderr, "demo consumer: %s: bytes differ near offset %llu\n", j->hash,
                        (unsigned long long)(off + k));
                same = false;
            }
        }
        off += segs[i].len;
    }
    if (same && off != j->size) same = false;
    ecx_release(ctx, j->hash);
    return same ? 0 : -1;
}

/* ecx_consumer_retries_total from the context's metrics. */
static uint64_t read_retries(ecx_ctx *ctx)
{
    size_t len = 1 << 16;
    for (int tries = 0; tries < 3; tries++) { /* the text may grow between calls */
        char *buf = malloc(len + 1);
        if (!buf) return 0;
        int n = ecx_metrics(ctx, buf, len + 1, &len);
        uint64_t v = 0;
        if (n >= 0) {
            const char *k = "\necx_consumer_retries_total ";
            const char *p = strstr(buf, k);
            if (p) v = strtoull(p + strlen(k), NULL, 10);
        }
        free(buf);
        if (n != ECX_ERANGE) return v;
    }
    return 0;
}

/* Count this child in at gate[k] and wait (bounded) until all n are in,
 * so every consumer of a phase fetches at the same time and none verifies
 * (CPU-heavy) while another is still fetching. */
static void barrier(demo *d, int k, int n)
{
    __atomic_add_fetch(&d->gate[k], 1, __ATOMIC_SEQ_CST);
    double end = now_s() + 15;
    while (__atomic_load_n(&d->gate[k], __ATOMIC_SEQ_CST) < n && !stop && now_s() < end)
        sleep_ms(1);
}

/* The body of consumer child `me`: fetch its jobs all at once, then verify
 * them. Runs in the child; never returns. */
static void consumer_child(demo *d, int me, int group, int64_t ack_ms, const char *log)
{
    redirect_output(log);
    child_stat *cs = &d->stats[me];
    cs->started = 1;
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = ECX_ROLE_CONSUMER;
    cfg.data = d->data;
    cfg.ack_timeout_ms = ack_ms;
    cfg.item_wait_ms = 10000;
    uint64_t need = 0;
    size_t mine = 0;
    for (size_t i = 0; i < d->n_jobs; i++) {
        if (d->jobs[i].consumer != me) continue;
        need += (d->jobs[i].size + cfg.block_bytes - 1) / cfg.block_bytes * cfg.block_bytes;
        mine++;
    }
    cfg.region_bytes = need > cfg.block_bytes ? need : cfg.block_bytes;
    ecx_ctx *ctx;
    int e = ecx_new(&cfg, &ctx);
    if (e) {
        fprintf(stderr, "demo consumer %d: cannot start: %s\n", me, ecx_strerror(e));
        cs->err = 1;
        _exit(1);
    }
    barrier(d, 0, group);
    size_t left = mine;
    double t0 = now_s(), end = t0 + 30;
    cs->t0 = t0;
    for (size_t i = 0; i < d->n_jobs; i++)
        if (d->jobs[i].consumer == me) d->jobs[i].t0 = t0;
    while (left && !stop && now_s() < end) {
        for (size_t i = 0; i < d->n_jobs; i++) {
            job *j = &d->jobs[i];
            if (j->consumer != me || j->done) continue;
            int reason = 0;
            int st = ecx_fetch(ctx, j->hash, j->ann, 0, &reason);
            if (st == ECX_FETCH_PENDING) continue;
            j->t1 = now_s();
            j->outcome = st == ECX_FETCH_READY ? ECX_FETCH_READY : ECX_FETCH_LOCAL;
            j->reason = st < 0 ? ECX_REASON_INVALID : reason;
            j->done = 1;
            left--;
        }
        if (left) ecx_poll(ctx, 5);
    }
    cs->t1 = now_s();
    barrier(d, 1, group);
    size_t buf_len = 1 << 20;
    uint8_t *buf = malloc(buf_len);
    for (size_t i = 0; i < d->n_jobs; i++) {
        job *j = &d->jobs[i];
        if (j->consumer != me || j->outcome != ECX_FETCH_READY || !j->verify) continue;
        j->verified = buf && !verify_item(ctx, j, d->tamper, buf, buf_len) ? 1 : -1;
    }
    free(buf);
    cs->retries = read_retries(ctx);
    ecx_free(ctx);
    _exit(left ? 1 : 0);
}

/* Fork consumers first..first+count-1 and wait (bounded) for all of them.
 * Returns 0 if every child exited 0. */
static int run_consumers(demo *d, int first, int count, int64_t ack_ms)
{
    pid_t pids[MAX_CONSUMERS + 2];
    int rc = 0;
    d->gate[0] = d->gate[1] = 0;
    fflush(NULL);
    for (int c = 0; c < count; c++) {
        char log[400];
        snprintf(log, sizeof log, "%s/consumer%d.log", d->work, first + c);
        pids[c] = fork();
        if (pids[c] < 0) {
            fprintf(stderr, "ecx: demo: fork: %s\n", strerror(errno));
            count = c, rc = -1;
            break;
        }
        if (pids[c] == 0) consumer_child(d, first + c, count, ack_ms, log);
    }
    double end = now_s() + 60;
    for (int c = 0; c < count; c++) {
        int st = 0;
        int left_ms = (int)((end - now_s()) * 1000);
        if (stop || wait_child(pids[c], left_ms > 0 ? left_ms : 0, &st)) {
            fprintf(stderr, "ecx: demo: consumer %d did not finish; killed\n", first + c);
            st = stop_child(pids[c], SIGKILL, 1000);
            rc = -1;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "ecx: demo: consumer %d failed (see %s/consumer%d.log)\n", first + c,
                    d->work, first + c);
            rc = -1;
        }
    }
    return rc;
}

/* ---------- report ---------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, size_t n, double p)
{
    if (!n) return 0;
    size_t r = (size_t)ceil(p / 100.0 * (double)n);
    return v[r ? r - 1 : 0];
}

static const char *outcome_text(const job *j, char *buf, size_t cap)
{
    if (!j || j->outcome < 0) return "not finished";
    double ms = (j->t1 - j->t0) * 1000;
    if (j->outcome == ECX_FETCH_READY)
        snprintf(buf, cap, "ready in %.0f ms%s", ms,
                 j->verified > 0   ? ", verified"
                 : j->verified < 0 ? ", BYTES DIFFER"
                                   : "");
    else
        snprintf(buf, cap, "local (%s) in %.0f ms", ecx_reason_name(j->reason), ms);
    return buf;
}

static job *find_job(demo *d, int scenario)
{
    for (size_t i = 0; i < d->n_jobs; i++)
        if (d->jobs[i].scenario == scenario) return &d->jobs[i];
    return NULL;
}

static void row(const char *what, const char *got, bool ok)
{
    printf("  %-42s %-44s %s\n", what, got, ok ? "PASS" : "FAIL");
}

/* Is dir empty (apart from . and ..)? */
static bool dir_empty(const char *dir)
{
    DIR *dp = opendir(dir);
    if (!dp) return false;
    bool empty = true;
    struct dirent *de;
    while ((de = readdir(dp)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = false;
    closedir(dp);
    return empty;
}

static void remove_work(const char *dir)
{
    DIR *dp = opendir(dir);
    if (!dp) return;
    struct dirent *de;
    while ((de = readdir(dp)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) unlinkat(dirfd(dp), de->d_name, 0);
    closedir(dp);
    rmdir(dir);
}

/* ---------- main ---------- */

int cmd_demo(int argc, char **argv)
{
    enum { O_CONSUMERS = 2000, O_ITEMS, O_DATA, O_ACK, O_DELAY, O_KEEP, O_TAMPER };
    static const struct option opts[] = {{"consumers", required_argument, 0, O_CONSUMERS},
                                         {"items", required_argument, 0, O_ITEMS},
                                         {"data", required_argument, 0, O_DATA},
                                         {"ack-timeout-ms", required_argument, 0, O_ACK},
                                         {"ready-delay-ms", required_argument, 0, O_DELAY},
                                         {"keep", no_argument, 0, O_KEEP},
                                         {"tamper", no_argument, 0, O_TAMPER},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    demo dd, *d = &dd;
    memset(d, 0, sizeof *d);
    d->consumers = -1, d->items = -1, d->data = "auto", d->ack_ms = 300, d->delay_ms = 400;
    int64_t v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(HELP, stdout); return EXIT_OK;
        case O_CONSUMERS:
            if (parse_int("--consumers", optarg, 1, MAX_CONSUMERS, &v)) return EXIT_USAGE;
            d->consumers = (int)v;
            break;
        case O_ITEMS:
            if (parse_int("--items", optarg, 1, MAX_ITEMS, &v)) return EXIT_USAGE;
            d->items = (int)v;
            break;
        case O_DATA:
            if (!data_path_ok(optarg))
                return usage_error("--data takes one of %s, not '%s'", ECX_DATA_PATHS, optarg);
            d->data = optarg;
            break;
        case O_ACK:
            if (parse_int("--ack-timeout-ms", optarg, 10, 60000, &d->ack_ms)) return EXIT_USAGE;
            break;
        case O_DELAY:
            if (parse_int("--ready-delay-ms", optarg, 50, 5000, &d->delay_ms)) return EXIT_USAGE;
            break;
        case O_KEEP: d->keep = true; break;
        case O_TAMPER: d->tamper = true; break;
        default: return usage_error("try 'ecx demo --help'");
        }
    }
    if (optind < argc)
        return usage_error("demo takes no arguments ('%s'); try 'ecx demo --help'", argv[optind]);

    /* Size for this machine: a consumer per CPU and one more, and a load
     * that (producer + consumer copies) fits a quarter of free /dev/shm. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1) cpus = 1;
    struct statvfs vfs;
    char shm_root[200]; /* copied: ECX_SHM_DIR is set to the demo's own directory below */
    snprintf(shm_root, sizeof shm_root, "%s", shm_dir());
    double shm_free =
        statvfs(shm_root, &vfs) == 0 ? (double)vfs.f_bavail * (double)vfs.f_frsize : 0;
    bool items_given = d->items > 0;
    if (d->consumers < 0) d->consumers = cpus + 1 < 2 ? 2 : cpus + 1 > 8 ? 8 : (int)cpus + 1;
    if (!items_given) d->items = 24;
    for (;;) {
        int n_large = d->items / 3, n_small = d->items - n_large;
        double need = 2.0 * ((double)n_small * SMALL_BYTES + (double)n_large * LARGE_BYTES) +
                      4.0 * SMALL_BYTES;
        if (need <= shm_free / (items_given ? 1.2 : 4)) break;
        if (items_given || d->items <= 3) {
            fprintf(stderr, "ecx: demo: %s has %.0f MB free; %d items need about %.0f MB\n",
                    shm_root, shm_free / 1e6, d->items, need / 1e6);
            return EXIT_FAIL;
        }
        d->items--;
    }
    if (d->consumers > d->items) d->consumers = d->items;

    ssize_t el = readlink("/proc/self/exe", d->exe, sizeof d->exe - 1);
    if (el <= 0) {
        fprintf(stderr, "ecx: demo: cannot find my own binary: %s\n", strerror(errno));
        return EXIT_FAIL;
    }
    d->exe[el] = 0;

    /* Shared result slots: main items + the three scenario fetches. */
    d->cap_jobs = (size_t)d->items + 3;
    size_t jobs_bytes = d->cap_jobs * sizeof(job);
    size_t stats_bytes = (MAX_CONSUMERS + 2) * sizeof(child_stat) + 2 * sizeof(int);
    void *shared = mmap(NULL, jobs_bytes + stats_bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        fprintf(stderr, "ecx: demo: mmap: %s\n", strerror(errno));
        return EXIT_FAIL;
    }
    d->jobs = shared;
    d->stats = (child_stat *)((char *)shared + jobs_bytes);
    d->gate = (int *)(d->stats + MAX_CONSUMERS + 2);

    snprintf(d->work, sizeof d->work, "/tmp/ecx-demo.XXXXXX");
    snprintf(d->shm, sizeof d->shm, "%s/ecx-demo.XXXXXX", shm_root);
    bool have_work = mkdtemp(d->work) != NULL, have_shm = have_work && mkdtemp(d->shm) != NULL;
    if (!have_work || !have_shm) {
        fprintf(stderr, "ecx: demo: cannot make a work directory: %s\n", strerror(errno));
        if (have_work) rmdir(d->work);
        munmap(shared, jobs_bytes + stats_bytes);
        return EXIT_FAIL;
    }
    setenv("ECX_SHM_DIR", d->shm, 1);

    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    int n_large = d->items / 3, n_small = d->items - n_large;
    d->main_ann = json_object();
    printf("ecx demo: 1 producer + %d consumer processes on loopback, data path %s\n", d->consumers,
           d->data);
    printf("  sized for this machine: %ld CPUs, %.1f GiB free in %s\n", cpus, shm_free / (1u << 30),
           shm_root);
    fflush(stdout);
    double t_start = now_s();
    bool setup_ok = true, main_ok = false, miss_ok = false, nr_ok = false, gone_ok = false;
    int prod_a_status = 0;

    /* 1. The main load: producer A, every item fetched by some consumer. */
    d->ann_a = start_producer(d, "producer-a", (uint64_t)n_small, (uint64_t)n_large, 0, &d->prod_a);
    if (!d->ann_a) {
        setup_ok = false;
        goto cleanup;
    }
    int is = 0, il = 0;
    for (int k = 0; k < d->items; k++) {
        bool large = k % 3 == 2;
        uint64_t size = large ? LARGE_BYTES : SMALL_BYTES;
        char h[65];
        synthetic_hash((uint64_t)(large ? il++ : is++), size, h);
        json_t *a = json_object_get(d->ann_a, h);
        const char *text = a ? json_string_value(json_object_get(d->main_ann, h)) : NULL;
        if (a && !text) {
            char *t = json_dumps(a, JSON_COMPACT);
            json_object_set_new(d->main_ann, h, json_string(t ? t : "{}"));
            free(t);
            text = json_string_value(json_object_get(d->main_ann, h));
        }
        add_job(d, h, size, SC_MAIN, k % d->consumers, text, true);
    }
    run_consumers(d, 0, d->consumers, d->ack_ms);

    /* 2 + 3. A miss at producer A, and producer B whose items are not ready
     * yet: the consumer is asked right after B announces, so it sees
     * NOT_READY, retries, and the item lands. */
    d->ann_b = start_producer(d, "producer-b", 2, 0, d->delay_ms, &d->prod_b);
    if (!d->ann_b) {
        setup_ok = false;
        goto cleanup;
    }
    char h_miss[65], h_b0[65], h_b1[65];
    synthetic_hash((uint64_t)n_small, SMALL_BYTES, h_miss); /* one past what A holds */
    synthetic_hash(0, SMALL_BYTES, h_b0);
    synthetic_hash(1, SMALL_BYTES, h_b1);
    json_t *a0 = json_object_get(d->ann_a, d->jobs[0].hash);
    d->ann_text[0] = a0 ? json_dumps(a0, JSON_COMPACT) : NULL;
    d->ann_text[1] = json_dumps(json_object_get(d->ann_b, h_b0), JSON_COMPACT);
    d->ann_text[2] = json_dumps(json_object_get(d->ann_b, h_b1), JSON_COMPACT);
    int sc = d->consumers;
    add_job(d, h_miss, SMALL_BYTES, SC_MISS, sc, d->ann_text[0], false);
    add_job(d, h_b0, SMALL_BYTES, SC_NOT_READY, sc, d->ann_text[1], true);
    run_consumers(d, sc, 1, d->ack_ms);

    /* 4. Producer B goes away (SIGKILL), then a consumer asks it for the
     * other item it announced: no ack comes, and the consumer falls back. */
    stop_child(d->prod_b, SIGKILL, 1000);
    d->prod_b = 0;
    add_job(d, h_b1, SMALL_BYTES, SC_GONE, sc + 1, d->ann_text[2], true);
    run_consumers(d, sc + 1, 1, d->ack_ms);

cleanup:
    if (d->prod_b) stop_child(d->prod_b, SIGKILL, 1000);
    if (d->prod_a) prod_a_status = stop_child(d->prod_a, SIGTERM, 5000);
    bool a_clean = d->prod_a && WIFEXITED(prod_a_status) && WEXITSTATUS(prod_a_status) == 0;
    /* The killed producer's region file is an orphan: reap it, then the
     * directory must be empty. */
    ecx_reap_regions(d->shm);
    bool shm_clean = dir_empty(d->shm) && rmdir(d->shm) == 0;
    double secs = now_s() - t_start;

    /* ---------- the table ---------- */
    size_t n_main = 0, n_ready = 0, n_verified = 0;
    uint64_t bytes = 0;
    double lat[MAX_ITEMS], first = 1e300, last = 0;
    unsigned outcomes[ECX_REASON_COUNT + 1] = {0}; /* [0] ready, [r] local with reason r */
    unsigned unfinished = 0;
    for (size_t i = 0; i < d->n_jobs; i++) {
        job *j = &d->jobs[i];
        if (j->outcome == ECX_FETCH_READY)
            outcomes[0]++;
        else if (j->outcome == ECX_FETCH_LOCAL && j->reason > 0 && j->reason < ECX_REASON_COUNT)
            outcomes[j->reason]++;
        else
            unfinished++;
        if (j->scenario != SC_MAIN) continue;
        n_main++;
        if (j->outcome != ECX_FETCH_READY) continue;
        n_ready++;
        n_verified += j->verified > 0;
        bytes += j->size;
        lat[n_ready - 1] = (j->t1 - j->t0) * 1000;
        if (j->t0 < first) first = j->t0;
        if (j->t1 > last) last = j->t1;
    }
    qsort(lat, n_ready, sizeof *lat, cmp_double);
    double span = n_ready && last > first ? last - first : 0;
    main_ok = setup_ok && n_main == (size_t)d->items && n_ready == n_main && n_verified == n_main;

    printf("\n  main load: %d items (%d x 4.7 MB, %d x 28.8 MB), %d consumers fetching at once\n",
           d->items, n_small, n_large, d->consumers);
    printf("  %8s %11s %9s %12s %10s %10s\n", "items", "bytes", "time", "throughput", "p50", "p99");
    char tput[32] = "-";
    if (span > 0) snprintf(tput, sizeof tput, "%.0f MB/s", bytes / 1e6 / span);
    printf("  %8zu %8.1f MB %7.3f s %12s %7.1f ms %7.1f ms\n", n_ready, bytes / 1e6, span, tput,
           pct(lat, n_ready, 50), pct(lat, n_ready, 99));

    printf("\n  outcomes (all %zu fetches): ready %u", d->n_jobs, outcomes[0]);
    for (int r = 1; r < ECX_REASON_COUNT; r++)
        if (outcomes[r]) printf(", %s %u", ecx_reason_name(r), outcomes[r]);
    if (unfinished) printf(", unfinished %u", unfinished);
    printf("\n\n  %-42s %s\n", "scenario", "what happened");

    char got[128];
    snprintf(got, sizeof got, "%zu/%zu ready, %zu/%zu bytes verified", n_ready, n_main, n_verified,
             n_main);
    char what[64];
    snprintf(what, sizeof what, "main load: %d items, %d consumers", d->items, d->consumers);
    row(what, got, main_ok);

    job *jm = find_job(d, SC_MISS), *jn = find_job(d, SC_NOT_READY), *jg = find_job(d, SC_GONE);
    miss_ok = jm && jm->outcome == ECX_FETCH_LOCAL && jm->reason == ECX_REASON_NACK_MISSING;
    row("miss: an item the producer lacks", outcome_text(jm, got, sizeof got), miss_ok);

    uint64_t retries = d->stats[d->consumers].retries;
    nr_ok = jn && jn->outcome == ECX_FETCH_READY && jn->verified > 0 && retries >= 1;
    if (jn && jn->outcome >= 0) {
        char t[100];
        snprintf(got, sizeof got, "%llu retr%s, %s", (unsigned long long)retries,
                 retries == 1 ? "y" : "ies", outcome_text(jn, t, sizeof t));
    } else {
        snprintf(got, sizeof got, "not run");
    }
    snprintf(what, sizeof what, "not ready for %lld ms, then retried", (long long)d->delay_ms);
    row(what, got, nr_ok);

    /* Falling back is the point; it must also be quick (about the ack
     * timeout, not the 60 s a NOT_READY wait may take). */
    gone_ok =
        jg && jg->outcome == ECX_FETCH_LOCAL && (jg->t1 - jg->t0) * 1000 < (double)d->ack_ms + 5000;
    row("producer SIGKILLed, then asked", outcome_text(jg, got, sizeof got), gone_ok);

    bool clean = a_clean && shm_clean;
    snprintf(got, sizeof got, "%s; %s", a_clean ? "producer exited 0" : "PRODUCER EXIT FAILED",
             shm_clean ? "no region files left" : "REGION FILES LEFT");
    row("cleanup: children reaped, /dev/shm clean", got, clean);

    bool all = setup_ok && main_ok && miss_ok && nr_ok && gone_ok && clean && !stop;
    printf("\n%s in %.1f s\n",
           all ? "PASS: every expectation held" : "FAIL: some expectation did not hold", secs);
    if (!all || d->keep)
        printf("work directory (announcements, child logs): %s\n", d->work);
    else
        remove_work(d->work);
    fflush(stdout);

    for (int i = 0; i < 4; i++)
        free(d->ann_text[i]);
    json_decref(d->main_ann);
    json_decref(d->ann_a);
    json_decref(d->ann_b);
    munmap(shared, jobs_bytes + stats_bytes);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return all ? EXIT_OK : EXIT_FAIL;
}

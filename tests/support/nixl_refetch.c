/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nixl_refetch — one nixl consumer context (public API only) fetching
 * items one after the other, for tests/shell/test_nixl_agent_proc.sh:
 *
 *   nixl_refetch PARAMS.json OUTDIR [--kill SIG@K] HASH...
 *
 * Fetches each HASH (announced in PARAMS.json) alone, waiting for it to
 * end, and writes OUTDIR/HASH when ready; prints one line per item:
 * "HASH ready" or "HASH local REASON". --kill SIG@K: before item K (from
 * 0), sends signal SIG to this process's children (the NIXL agent
 * process: a fault injected from outside, as UCX's abort or the OOM
 * killer would end it). Prints the helper restarts from the metrics at
 * the end: "restarts N". Exit 0 unless the context could not start.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ecx.h>
#include <jansson.h>

static void kill_children(int sig)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)getpid());
    DIR *d = opendir(path);
    struct dirent *t;
    while (d && (t = readdir(d))) {
        if (t->d_name[0] == '.') continue;
        char cp[512];
        snprintf(cp, sizeof cp, "/proc/%d/task/%s/children", (int)getpid(), t->d_name);
        FILE *f = fopen(cp, "r");
        int pid;
        while (f && fscanf(f, "%d", &pid) == 1) {
            printf("killing child %d with signal %d\n", pid, sig);
            kill(pid, sig);
        }
        if (f) fclose(f);
    }
    if (d) closedir(d);
}

int main(int argc, char **argv)
{
    if (argc < 4) return fprintf(stderr, "usage: see tests/support/nixl_refetch.c\n"), 2;
    json_t *all = json_load_file(argv[1], 0, NULL);
    if (!json_is_object(all)) return fprintf(stderr, "%s: not a JSON object\n", argv[1]), 2;
    int kill_sig = 0, kill_at = -1, first = 3;
    if (!strcmp(argv[3], "--kill") && argc > 5) {
        if (sscanf(argv[4], "%d@%d", &kill_sig, &kill_at) != 2) return 2;
        first = 5;
    }
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = ECX_ROLE_CONSUMER;
    cfg.data = "nixl";
    cfg.region_bytes = 64u << 20;
    /* the defaults otherwise: vLLM 0.34.0, version 2, 8 KiB blocks, as
     * nixl_producer.py's default */
    ecx_ctx *ctx;
    int rc = ecx_new(&cfg, &ctx);
    if (rc) return fprintf(stderr, "ecx_new: %s\n", ecx_strerror(rc)), 1;
    for (int i = first; i < argc; i++) {
        if (i - first == kill_at) {
            kill_children(kill_sig);
            usleep(200000);
        }
        json_t *o = json_object_get(all, argv[i]);
        char *a = o ? json_dumps(o, JSON_COMPACT) : NULL;
        int reason = 0, st;
        for (int k = 0; k < 6000; k++) { /* 60 s */
            st = ecx_fetch(ctx, argv[i], a, 0, &reason);
            if (st != ECX_FETCH_PENDING) break;
            ecx_poll(ctx, 10);
        }
        free(a);
        if (st == ECX_FETCH_READY) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[2], argv[i]);
            static char buf[64u << 20];
            int64_t n = ecx_read(ctx, argv[i], buf, sizeof buf);
            FILE *f = fopen(path, "wb");
            if (n < 0 || !f || fwrite(buf, 1, (size_t)n, f) != (size_t)n) return perror(path), 1;
            fclose(f);
            printf("%s ready\n", argv[i]);
        } else {
            printf("%s local %s\n", argv[i], st == ECX_FETCH_LOCAL ? ecx_reason_name(reason) : "?");
        }
        fflush(stdout);
    }
    static char m[1 << 20];
    size_t ml;
    if (ecx_metrics(ctx, m, sizeof m, &ml) == 0) {
        const char *r = strstr(m, "\necx_nixl_agent_restarts_total ");
        if (r) printf("restarts %s", r + strlen("\necx_nixl_agent_restarts_total "));
    }
    ecx_free(ctx);
    json_decref(all);
    return 0;
}

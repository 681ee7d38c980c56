/* SPDX-License-Identifier: Apache-2.0 */
/* bench_ctx — waiting for a context's region; see bench_ctx.h. */
#include "bench_ctx.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#define POLL_NS 2000000L /* 2 ms between looks */

/* The value of the metric `name` (a line "name value" of ecx_metrics), or
 * -1 if there is none. */
static double metric(ecx_ctx *ctx, const char *name)
{
    char buf[65536];
    size_t len;
    if (ecx_metrics(ctx, buf, sizeof buf, &len) != 0) return -1;
    size_t nl = strlen(name);
    for (const char *p = buf; (p = strstr(p, name)); p += nl)
        if ((p == buf || p[-1] == '\n') && p[nl] == ' ') return strtod(p + nl + 1, NULL);
    return -1;
}

double bench_wait_backed(ecx_ctx *ctx, double limit_s)
{
    const char *pf = getenv("ECX_PREFAULT");
    if (pf && !strcmp(pf, "0")) return 0;
    uint64_t t0 = bench_now_ns(), limit = t0 + (uint64_t)(limit_s * 1e9);
    while (metric(ctx, "ecx_region_backed_bytes") < metric(ctx, "ecx_region_bytes") &&
           bench_now_ns() < limit) {
        struct timespec ts = {0, POLL_NS};
        nanosleep(&ts, NULL);
    }
    return (double)(bench_now_ns() - t0) / 1e9;
}

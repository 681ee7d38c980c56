/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_ctx — what `ecx bench data` and `ecx bench stall` ask of a
 * context besides fetches: one of its metrics, and waiting until its
 * region is faulted in (as an engine's is by its first request), so that
 * a timed fetch does not share the machine with the region's background
 * fault-in.
 */
#ifndef ECX_BENCH_CTX_H
#define ECX_BENCH_CTX_H

#include "ecx.h"

/* The value of the metric `name` (a line "name value" of ecx_metrics), or
 * -1 if there is none. */
double bench_metric(ecx_ctx *ctx, const char *name);

/* Wait, at most limit_s, until ctx's region is all faulted in; the seconds
 * waited (0 at once with ECX_PREFAULT=0: nothing faults it in). */
double bench_wait_backed(ecx_ctx *ctx, double limit_s);

#endif

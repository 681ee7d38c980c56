/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_ctx — what `ecx bench data` and `ecx bench stall` (and test_api,
 * for metrics that stay put) ask of a context besides fetches: waiting until its region is faulted in (as an
 * engine's is by its first request; its metrics say how far that got), so
 * that a timed fetch does not share the machine with the region's
 * background fault-in.
 */
#ifndef ECX_BENCH_CTX_H
#define ECX_BENCH_CTX_H

#include "ecx.h"

/* Wait, at most limit_s, until ctx's region is all faulted in; the seconds
 * waited (0 at once with ECX_PREFAULT=0: nothing faults it in). */
double bench_wait_backed(ecx_ctx *ctx, double limit_s);

#endif

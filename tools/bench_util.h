/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_util — what `ecx bench data` and `ecx bench stall` share: medians
 * (`ecx get --rounds` uses them too), block rounding, the content every
 * benchmark item carries (and its check, so a verification reads nothing
 * but the bytes checked), and a timed memcpy as the baseline.
 */
#ifndef ECX_BENCH_UTIL_H
#define ECX_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Median of v[0..n) (n >= 1); sorts v. */
double bench_median(double *v, int n);
/* bytes rounded up to whole blocks of bs. */
uint64_t bench_blocks_of(uint64_t bytes, uint64_t bs);
/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t bench_now_ns(void);

/* The content of a benchmark item of `total` bytes: 8-byte little-endian
 * words (i + 1) * 0x9e3779b97f4a7c15 for word i, then (uint8_t)offset for
 * the bytes past the last whole word. bench_fill writes bytes
 * [off, off + len) of it to dst; bench_check says whether p holds them. */
void bench_fill(uint8_t *dst, uint64_t off, uint64_t len, uint64_t total);
bool bench_check(const uint8_t *p, uint64_t off, uint64_t len, uint64_t total);

/* Overwrite dst, then time one memcpy of size bytes from src into it;
 * seconds. The caller verifies dst. */
double bench_time_memcpy(uint8_t *dst, const uint8_t *src, uint64_t size);

/* Send (wr) or receive exactly n bytes on a blocking socket: 0, or -1 on an
 * error or a close. */
int bench_io_all(int fd, void *b, size_t n, bool wr);
/* Answer raw TCP requests on the connection c until the peer closes: each
 * an 8-byte size, answered with content's first size bytes. 0, or 1 after
 * a message if a size is 0 or over max. */
int bench_raw_serve(int c, const uint8_t *content, uint64_t max);

/* Raw TCP, the tcp path's baseline: one loopback connection to a sender
 * process of its own (forked: it holds a copy of content, max bytes). Each
 * transfer writes a size (8 bytes); the sender answers with content's
 * first size bytes in one send loop; they are read with plain blocking
 * recv()s straight into dst (no header, no checksum, no slices): the most
 * one TCP connection moves. */
typedef struct bench_raw_tcp {
    int fd;
    int pid;
} bench_raw_tcp;

/* 0, or -1 (errno set). */
int bench_raw_tcp_open(bench_raw_tcp *r, const uint8_t *content, uint64_t max);
/* One timed transfer of size bytes into dst, then checked against expect;
 * seconds, or < 0. */
double bench_raw_tcp_once(bench_raw_tcp *r, uint8_t *dst, const uint8_t *expect, uint64_t size);
/* Ends the sender (idempotent; r zeroed by open or memset first). */
void bench_raw_tcp_close(bench_raw_tcp *r);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * file — opening the files an operator names (keys, allow-lists, params,
 * preloaded items) as what they claim to be: regular files of a bounded
 * size, so a FIFO, a device, a directory or a huge file is an error with a
 * message instead of a hang, a spin or an allocation without bound.
 */
#ifndef ECX_FILE_H
#define ECX_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Size limits of the small files. */
#define FILE_MAX_KEY (64 << 10)      /* a key file: one key and comments */
#define FILE_MAX_ALLOW (4 << 20)     /* an allow-list: ~100k keys */
#define FILE_MAX_PARAMS (256 << 20)  /* an announcements file */

/* Open path for reading without blocking on it (O_NONBLOCK), and keep it
 * only if it is a regular file of at most max bytes; with nofollow, a
 * symbolic link is refused too. Returns the fd (its size in *size), or -1
 * after printing "ecx: WHAT 'PATH': PROBLEM" to stderr. */
int file_open(const char *what, const char *path, uint64_t max, bool nofollow, uint64_t *size);

/* Read all n bytes of fd into buf, which may stop short only at an error
 * or a file that shrank: 0, or -1 after printing a message. */
int file_read_fd(const char *what, const char *path, int fd, void *buf, size_t n);

/* The whole of a regular file of at most max bytes, NUL-terminated, in a
 * malloc'd buffer (length in *len), or NULL after printing a message. */
char *file_read(const char *what, const char *path, size_t max, size_t *len);

#endif

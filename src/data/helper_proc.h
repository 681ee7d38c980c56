/* SPDX-License-Identifier: Apache-2.0 */
/*
 * helper_proc — what the library's helper processes share: the NIXL agent
 * process (nixl_proc.h, `ecx-nixl-agent`) and the UCX process of the ucx
 * data path (ucx_proc.h, `ecx-ucx-agent`). UCX runs only in them, never in
 * the process that uses the library: a crash, an abort or a bloat there
 * costs the transfers in flight and a restart, not the host.
 *
 * Finding: $ENV alone if set; else next to the object holding this code
 * (libecx.so, or a program linking it statically), in its install's
 * libexec (ECX_NIXL_AGENT_RELDIR, relative to the library's directory),
 * next to the program.
 *
 * Starting: socketpair(AF_UNIX, SOCK_SEQPACKET, CLOEXEC), posix_spawn of
 * `path ARG` with the socket as fd 3 and the region file as fd 4, nothing
 * else inherited, signals at their defaults. Ending: SIGKILL (or its own
 * exit) and waitpid of that pid only; no signal handler is installed.
 *
 * Messages start with one header (every field little-endian):
 *   u32 magic, u16 version, u16 type, u64 id
 *
 * Restarts: at most ECXI_HELPER_RESTARTS starts per ECXI_HELPER_WINDOW_MS
 * (ecxi_helper_may_start); past that the path fails fast until the window
 * has passed.
 */
#ifndef ECXI_HELPER_PROC_H
#define ECXI_HELPER_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define ECXI_HELPER_HDR 16
#define ECXI_HELPER_SOCK_FD 3
#define ECXI_HELPER_REGION_FD 4
#define ECXI_HELPER_RESTARTS 5
#define ECXI_HELPER_WINDOW_MS 10000

void ecxi_helper_hdr_put(uint8_t *b, uint32_t magic, uint16_t version, uint16_t type, uint64_t id);
/* 0, or ECX_EDATA_PEER for a datagram that is not one of (magic, version). */
int ecxi_helper_hdr_get(const uint8_t *b, size_t len, uint32_t magic, uint16_t version,
                        uint16_t *type, uint64_t *id);

/* The helper program `prog` (see Finding) into path (PATH_MAX bytes): 0,
 * or ECX_EDATA_NOPATH with a log line naming what was tried. */
int ecxi_helper_find(const char *prog, const char *env, char *path);

/* Start `path arg` with region_fd as its fd 4: 0 and *sock (ours, CLOEXEC,
 * blocking) and *pid; ECX_ESYS, ECX_ENOMEM, ECX_EDATA_NOPATH. */
int ecxi_helper_spawn(const char *path, const char *arg, int region_fd, int *sock, pid_t *pid);

/* Wait for one datagram on sock into buf (cap bytes) until end_ms: its
 * length, 0 on EOF, -1 on an error, a datagram longer than cap, or the
 * time passing. */
long ecxi_helper_recv_wait(int sock, void *buf, size_t cap, int64_t end_ms);

/* Reap pid: SIGKILL first if kill_first, else up to wait_ms for it to end
 * by itself, then SIGKILL. What happened goes into why. */
void ecxi_helper_reap(pid_t pid, bool kill_first, int64_t wait_ms, char *why, size_t cap);

/* The latest starts, for the restart bound. */
typedef struct ecxi_helper_starts {
    int64_t ms[ECXI_HELPER_RESTARTS];
    size_t n;
} ecxi_helper_starts;
/* 0 if another start is allowed now, else the ms to wait. */
int64_t ecxi_helper_may_start(const ecxi_helper_starts *s, int64_t now_ms);
void ecxi_helper_started(ecxi_helper_starts *s, int64_t now_ms);

#endif

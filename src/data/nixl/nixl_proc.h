/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nixl_proc — the NIXL agent process: ecx's NIXL peer (nixl_agent.c, on
 * Debian's UCX 1.13.1, which aborts the whole process on some peer
 * behaviour) runs in a helper program, `ecx-nixl-agent`
 * (nixl_agent_main.c), never in the process that uses the library. This
 * file owns the parent's side and the messages between the two; helper_proc.h
 * finds, starts and reaps the helper and bounds its restarts. Its start,
 * death, restarts and the verdicts on metadata that killed one:
 * docs/NIXL.md §5. Single-threaded like nixl_agent.h: every call from one
 * thread (the data context's, under its lock); every wait is bounded.
 */
#ifndef ECXI_NIXL_PROC_H
#define ECXI_NIXL_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "helper_proc.h"
#include "nixl_format.h"

#define ECXI_NIXL_PROC_VERSION 1
#define ECXI_NIXL_PROC_MAGIC 0x50584e45u /* "ENXP" */
#define ECXI_NIXL_PROC_MSG_MAX (96u << 10)
#define ECXI_NIXL_PROC_HDR 16
/* READ pieces in one message; a READ of more goes in several messages. */
#define ECXI_NIXL_PROC_PIECES                                                                       \
    ((ECXI_NIXL_PROC_MSG_MAX - ECXI_NIXL_PROC_HDR - 20 - ECXI_NIXL_MSG_MAX) / 24)
/* Pieces in one READ, all messages together. */
#define ECXI_NIXL_PROC_PIECES_MAX (1u << 22)
#define ECXI_NIXL_PROC_RESTARTS ECXI_HELPER_RESTARTS
#define ECXI_NIXL_PROC_WINDOW_MS ECXI_HELPER_WINDOW_MS
/* The helper's start (UCX set up, HELLO answered) and an ADD's answer. */
#define ECXI_NIXL_PROC_START_MS 10000
#define ECXI_NIXL_PROC_ADD_MS 5000
/* A message the helper does not take within this is a hang. */
#define ECXI_NIXL_PROC_SEND_MS 5000
/* The helper's fds. */
#define ECXI_NIXL_PROC_SOCK_FD ECXI_HELPER_SOCK_FD
#define ECXI_NIXL_PROC_REGION_FD ECXI_HELPER_REGION_FD

/* Messages (helper_proc.h's header "ENXP"; one per datagram, every field
 * little-endian, every length checked against the datagram). The helper's
 * messages are untrusted like a peer's (it parses peer input): anything
 * out of bounds or unexpected is handled like its death.
 *   parent -> helper
 *     HELLO    id = its generation (1, 2, ...), u32 role (1 producer,
 *              2 consumer), u64 region bytes, agent name
 *     ADD      metadata bytes                         -> ADDED
 *     DROP     id = remote handle
 *     READ     u64 handle, u32 flags (ECXI_NIXL_READ_MORE: more pieces follow
 *              in another READ of this id), u32 n, u32 msg_len, n x (u64
 *              remote addr, u64 local offset, u64 len), msg (last message
 *              only)                                  -> READ_END
 *     RELEASE  id = a READ that is no longer wanted
 *   helper -> parent
 *     HELLO    i32 rc, u64 base of its mapping, metadata bytes (producer)
 *     ADDED    i32 rc, u64 handle
 *     READ_END i32 rc (0 done: read, notified; else failed)
 *     NOTIF    u32 name_len, u32 msg_len, name, msg */
enum {
    ECXI_NIXL_P_HELLO = 1,
    ECXI_NIXL_P_ADD,
    ECXI_NIXL_P_DROP,
    ECXI_NIXL_P_READ,
    ECXI_NIXL_P_RELEASE,
    ECXI_NIXL_H_HELLO = 64,
    ECXI_NIXL_H_ADDED,
    ECXI_NIXL_H_READ_END,
    ECXI_NIXL_H_NOTIF,
};
enum { ECXI_NIXL_ROLE_PRODUCER = 1, ECXI_NIXL_ROLE_CONSUMER = 2 };
#define ECXI_NIXL_READ_MORE 1u

/* Header codec (both sides): 0, or ECX_EPROTO for a datagram that is not
 * one of this version's. */
void ecxi_nixl_proc_hdr_put(uint8_t *b, uint16_t type, uint64_t id);
int ecxi_nixl_proc_hdr_get(const uint8_t *b, size_t len, uint16_t *type, uint64_t *id);

typedef struct ecxi_nixl_proc ecxi_nixl_proc;
typedef struct ecxi_nixl_proc_read ecxi_nixl_proc_read;

/* Start the helper over the region file region_fd (dup'ed; the proc keeps its own) of
 * region_bytes: a producer's helper maps it read-only and offers it whole,
 * a consumer's maps it read-write and READs into it. Waits for the
 * helper's HELLO (bounded). ECX_EINVAL, ECX_ENOMEM, ECX_ESYS,
 * ECX_EDATA_NOPATH (no helper), ECX_EDATA_UCX (it could not start). */
int ecxi_nixl_proc_new(int region_fd, uint64_t region_bytes, bool producer, ecxi_nixl_proc **out);
/* Close the socket, wait for the helper (bounded), then SIGKILL; reap. */
void ecxi_nixl_proc_free(ecxi_nixl_proc *p);

/* One descriptor for the caller's epoll set, the same for the proc's
 * life (the helpers' sockets come and go inside it). */
int ecxi_nixl_proc_fd(const ecxi_nixl_proc *p);
/* 1 if there is work without waiting (queued notifications), else 0. */
int ecxi_nixl_proc_arm(ecxi_nixl_proc *p);
/* Read what the helper sent (bounded), handle its death, start a new one
 * when due. Events handled, or >= 0 always. */
int ecxi_nixl_proc_progress(ecxi_nixl_proc *p);

/* The current helper: generation (1 for the first, +1 per start; 0 while
 * down), and for a producer its metadata and the base address of its
 * mapping (valid until the next progress call that changes the
 * generation). */
uint64_t ecxi_nixl_proc_generation(const ecxi_nixl_proc *p);
const uint8_t *ecxi_nixl_proc_metadata(const ecxi_nixl_proc *p, size_t *len, uint64_t *base);
/* The current helper's agent name: "ecx-" and 32 random hex digits, new
 * for every helper (a vLLM process refuses a second remote agent of one
 * name). */
const char *ecxi_nixl_proc_name(const ecxi_nixl_proc *p);
/* Helpers started again after a death. */
uint64_t ecxi_nixl_proc_restarts(const ecxi_nixl_proc *p);
/* The helper's pid, for tests and logs (0 while down). */
int ecxi_nixl_proc_pid(const ecxi_nixl_proc *p);

/* Oldest notification (as ecxi_nixl_agent_notif_pop). */
int ecxi_nixl_proc_notif_pop(ecxi_nixl_proc *p, char *name, char *msg);

/* A remote agent from its metadata (parsed here first: ECX_EDATA_META),
 * added in the helper (waits for its answer, bounded): *handle. Refused
 * bytes (see Verdicts) and the helper's refusal: ECX_EDATA_META; helper
 * down: ECX_EDATA_PEER. */
int ecxi_nixl_proc_remote_add(ecxi_nixl_proc *p, const uint8_t *md, size_t md_len,
                              uint64_t *handle);
void ecxi_nixl_proc_remote_drop(ecxi_nixl_proc *p, uint64_t handle);
/* False once the helper that added it is gone: add the metadata again. */
bool ecxi_nixl_proc_remote_live(const ecxi_nixl_proc *p, uint64_t handle);

/* One READ (as ecxi_nixl_read_post) of n pieces remote[i] -> the region's
 * bytes [local[i], local[i] + len[i]). ECX_EDATA_PEER if the handle is of
 * a helper that died. */
int ecxi_nixl_proc_read_post(ecxi_nixl_proc *p, uint64_t handle, const uint64_t *remote,
                             const uint64_t *local, const uint64_t *len, size_t n, const char *msg,
                             size_t msg_len, ecxi_nixl_proc_read **out);
/* 0 running, 1 done, negative: failed. */
int ecxi_nixl_proc_read_poll(const ecxi_nixl_proc_read *x);
/* Give it back; a READ still running is released in the helper too. */
void ecxi_nixl_proc_read_release(ecxi_nixl_proc *p, ecxi_nixl_proc_read *x);

#endif

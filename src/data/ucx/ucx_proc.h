/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ucx_proc — the ucx data path with UCX in its own process (issue 20 #5).
 *
 * UCX 1.13.1 crashes or grows without bound on some peer input: a flood
 * of active messages kills a consumer (SIGSEGV in its AM reply handler),
 * eager messages under tags nobody receives pile up in its unexpected
 * queue (1 GiB sent: 2 GiB grown), and hundreds of connections from one
 * address abort a producer (an assertion in its TCP connection manager).
 * None of that can be bounded before UCX sees it. So the library never
 * runs UCX: its `ucx` path (this file, the parent's side, an ecxi_data
 * like the others) drives data_ucx.c in a helper process, `ecx-ucx-agent`
 * (ucx_agent_main.c), over the region file it maps (read-only in a
 * producer's helper, read-write in a consumer's). A crash, an abort or a
 * bloat of the helper fails the transfers in flight (a READ: FAILED; a
 * producer's send: its end reported as failed, after the helper is
 * reaped, so nothing reads the blocks any more) and a new helper starts
 * (helper_proc.h: at most ECX_HELPER_RESTARTS per ECX_HELPER_WINDOW_MS).
 * The helper's memory is bounded: RLIMIT_DATA (private memory: UCX's
 * heap, queues and pools; the region mapping is shared and not counted)
 * at what it maps at start plus ECX_UCX_AGENT_DATA_MB
 * ($ECX_UCX_AGENT_DATA_MB if set; 0: no bound); past it UCX's
 * allocations fail and UCX drops what it cannot hold, or the helper dies.
 *
 * What stays as data_ucx.c describes: no rkey published, the producer
 * decides what leaves (the grant check is the parent session's, asked for
 * every request, with ECX_DATA_GRANT_CLAIM), the pin is held until the
 * send has ended or the helper is gone, a cut closes the send's
 * connection, the consumer checks length and checksum (in the helper,
 * over the same shared pages).
 *
 * A consumer refuses a producer whose READs alone were in flight at two
 * deaths of its helper within a minute, for the rest of that minute: one
 * hostile producer cannot spend the restart bound of every other one.
 *
 * A producer's helper listens on the port of the first one (so its
 * agent_metadata never changes; UCX_TCP_CM_REUSEADDR and
 * UCX_RDMA_CM_REUSEADDR let the new listener bind past the old one's
 * closed connections); a consumer's
 * registers its peers again after a restart.
 *
 * Protocol (helper_proc.h's header, magic "EUXP", ECX_UCX_PROC_VERSION;
 * one message per datagram, little-endian, every length checked):
 *   parent -> helper
 *     HELLO   id = generation; u32 role (1 producer, 2 consumer),
 *             u64 block bytes, u16 port (network order; 0: any), bind host
 *     ANSWER  id = an ASK's; i32 rc, u64 nbytes, u32 nruns,
 *             nruns x (u32 first block, u32 count)       (producer)
 *     CUT     16B token, key                               (producer)
 *     ADD     id = peer; the producer's UCX address bytes  -> ADDED
 *     DROP    id = peer
 *     READ    id = xfer; u64 peer, u64 nbytes, u64 checksum, 16B token,
 *             u32 key_len, u32 nruns, key, runs (local)    -> READ_END
 *     RELEASE id = xfer
 *   helper -> parent
 *     HELLO    i32 rc, UCX address bytes (producer)
 *     ASK      id; 16B token, key         (a request to serve: claim?)
 *     END      i32 status, 16B token, key (a claimed send ended)
 *     ADDED    id = peer; i32 rc
 *     READ_END id = xfer; i32 state (enum ecxi_xfer_state)
 *     STATS    u64 x 4: its path counters (data.h, ecxi_data_counts), at
 *              most once a second when they changed
 * The helper's messages are untrusted: anything out of bounds or not
 * asked for (an END of no claim) is handled like its death.
 * A grant or READ of more than ECX_UCX_PROC_RUNS runs of blocks does not
 * fit one message and is refused (the item falls back).
 */
#ifndef ECX_UCX_PROC_H
#define ECX_UCX_PROC_H

#include "helper_proc.h"

#define ECX_UCX_PROC_MAGIC 0x50585545u /* "EUXP" */
#define ECX_UCX_PROC_VERSION 1
#define ECX_UCX_PROC_MSG_MAX (128u << 10)
#define ECX_UCX_PROC_RUNS ((ECX_UCX_PROC_MSG_MAX - ECX_HELPER_HDR - 64 - 512) / 8)
#define ECX_UCX_AGENT_DATA_MB 512
/* The helper's start, and an ADD's answer. */
#define ECX_UCX_PROC_START_MS 10000
#define ECX_UCX_PROC_ADD_MS 5000
/* A message the helper does not take within this is a hang. */
#define ECX_UCX_PROC_SEND_MS 5000
/* An ANSWER the helper's request no longer wants is given back after this. */
#define ECX_UCX_PROC_ANSWER_MS 5000

enum {
    ECX_UCX_P_HELLO = 1,
    ECX_UCX_P_ANSWER,
    ECX_UCX_P_CUT,
    ECX_UCX_P_ADD,
    ECX_UCX_P_DROP,
    ECX_UCX_P_READ,
    ECX_UCX_P_RELEASE,
    ECX_UCX_H_HELLO = 64,
    ECX_UCX_H_ASK,
    ECX_UCX_H_END,
    ECX_UCX_H_ADDED,
    ECX_UCX_H_READ_END,
    ECX_UCX_H_STATS,
};
enum { ECX_UCX_ROLE_PRODUCER = 1, ECX_UCX_ROLE_CONSUMER = 2 };

#endif

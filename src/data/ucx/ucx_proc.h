/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ucx_proc — the library's `ucx` data path, an ecxi_data like the others,
 * whose UCX runs in a helper process, `ecx-ucx-agent` (ucx_agent_main.c
 * drives data_ucx.c there), never in the engine: UCX 1.13.1 crashes or
 * grows without bound on some peer input that cannot be bounded before
 * UCX sees it. This file owns the parent's side and the messages between
 * the two; helper_proc.h starts, reaps and bounds the restarts. What a
 * helper's death costs, its memory bound and the restart rules:
 * docs/PROTOCOL.md §6.10.
 */
#ifndef ECXI_UCX_PROC_H
#define ECXI_UCX_PROC_H

#include "data.h"
#include "helper_proc.h"

#define ECXI_UCX_PROC_MAGIC 0x50585545u /* "EUXP" */
/* 2: DECLINE and DECLINED. The two ship together; a pair of another
 * version fails at the HELLO rather than at its first decline. */
#define ECXI_UCX_PROC_VERSION 2
#define ECXI_UCX_PROC_MSG_MAX (128u << 10)
#define ECXI_UCX_PROC_RUNS ((ECXI_UCX_PROC_MSG_MAX - ECXI_HELPER_HDR - 64 - 512) / 8)
#define ECXI_UCX_AGENT_DATA_MB 512
/* The helper's start, and an ADD's answer. */
#define ECXI_UCX_PROC_START_MS 10000
#define ECXI_UCX_PROC_ADD_MS 5000
/* A message the helper does not take within this is a hang. */
#define ECXI_UCX_PROC_SEND_MS 5000
/* An ANSWER the helper's request no longer wants is given back after this. */
#define ECXI_UCX_PROC_ANSWER_MS 5000
/* Ends and DECLINEDs waiting for poll_notifs, at most: a DECLINED past it
 * is dropped (the lease releases its grant). */
#define ECXI_UCX_PROC_ENDS_MAX 4096

/* Messages (helper_proc.h's header; one per datagram, little-endian,
 * every length checked). The helper's messages are untrusted: anything out
 * of bounds or not asked for (an END of no claim) is handled like its
 * death. A grant or READ of more than ECXI_UCX_PROC_RUNS runs of blocks does
 * not fit one message and is refused (the item falls back).
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
 *     DECLINE id = peer; 16B token, key (the consumer will not read that
 *             grant: the helper tells the producer; no answer)
 *   helper -> parent
 *     HELLO    i32 rc, UCX address bytes (producer)
 *     ASK      id; 16B token, key         (a request to serve: claim?)
 *     END      i32 status, 16B token, key (a claimed send ended)
 *     DECLINED 16B token, key  (a consumer declined that grant: for the
 *              session, which checks the token, as a completion)
 *     ADDED    id = peer; i32 rc
 *     READ_END id = xfer; i32 state (enum ecxi_xfer_state)
 *     STATS    u64 x 4: its path counters (data.h, ecxi_data_counts), within
 *              100 ms of a change (at most every 100 ms) */
enum {
    ECXI_UCX_P_HELLO = 1,
    ECXI_UCX_P_ANSWER,
    ECXI_UCX_P_CUT,
    ECXI_UCX_P_ADD,
    ECXI_UCX_P_DROP,
    ECXI_UCX_P_READ,
    ECXI_UCX_P_RELEASE,
    ECXI_UCX_P_DECLINE,
    ECXI_UCX_H_HELLO = 64,
    ECXI_UCX_H_ASK,
    ECXI_UCX_H_END,
    ECXI_UCX_H_ADDED,
    ECXI_UCX_H_READ_END,
    ECXI_UCX_H_STATS,
    ECXI_UCX_H_DECLINED,
};
enum { ECXI_UCX_ROLE_PRODUCER = 1, ECXI_UCX_ROLE_CONSUMER = 2 };

/* A "16B token, key" body of n bytes: the key and its length, or false if
 * the key is empty or longer than a grant key can be. */
static inline bool ecxi_ucx_proc_token_key(const uint8_t *b, size_t n, const char **key,
                                           size_t *key_len)
{
    if (n <= ECXI_DATA_TOKEN_LEN || n > ECXI_DATA_TOKEN_LEN + ECXI_DATA_NOTIF_MAX) return false;
    *key = (const char *)b + ECXI_DATA_TOKEN_LEN;
    *key_len = n - ECXI_DATA_TOKEN_LEN;
    return true;
}

#endif

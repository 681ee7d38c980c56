/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nixl_agent — a NIXL peer (UCX backend) made with our own UCX (Debian's
 * 1.13.1), no NIXL library: it publishes NIXL agent metadata for a memory
 * range, READs from a NIXL agent's memory with the READ's notification,
 * and collects the notifications NIXL agents send it (docs/NIXL.md).
 *
 * Runs only in the NIXL agent process (ecx-nixl-agent, nixl_agent_main.c;
 * the `nixl` data path talks to it through nixl_proc.c), never inside
 * libecx's host process: UCX 1.13.1 aborts the process on some peer
 * behaviour (docs/NIXL.md §5, §6). Also used by tests/support/nixl_peer.c (both
 * sides, against real nixl agents).
 *
 * UCX settings (docs/NIXL.md §5): on ecx's own UCX the context uses UCX's
 * tcp transport only, and the metadata carries the software-RMA rkey (no
 * md entries): that is what lets UCX 1.13.1 and the UCX 1.23.0 inside
 * nixl_cu12 1.5.1 read from each other. On the peers' UCX (peer_ucx
 * below), none of that. The context has UCP_FEATURE_RMA, which the ucx
 * data path (data_ucx.c) avoids on purpose: with it, UCP answers software
 * GET/PUT requests for any address of this process from anyone holding an
 * endpoint. NIXL's transfers are one-sided; this is for trusted networks
 * only, like NIXL itself (README, threat model).
 *
 * Single-threaded: every call from one thread. Nothing blocks except
 * ecxi_nixl_agent_wait (bounded).
 */
#ifndef ECXI_NIXL_AGENT_H
#define ECXI_NIXL_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nixl_format.h"

typedef struct ecxi_nixl_agent ecxi_nixl_agent;
typedef struct ecxi_nixl_remote ecxi_nixl_remote;
typedef struct ecxi_nixl_read ecxi_nixl_read;

/* Notifications held until collected; past it they are dropped (counted). */
#define ECXI_NIXL_NOTIF_QUEUE 1024

/* An agent named name (1..ECXI_NIXL_NAME_MAX bytes) whose metadata offers
 * [base, base + len) as one DRAM range (len 0: offers nothing; a consumer).
 * peer_ucx: this process runs on the UCX its peers run (ECX_NIXL_UCX,
 * agents/peer_ucx.h), so none of the settings above is needed: UCX picks
 * its transports, the range is registered (read-only) and its real rkey
 * published, endpoints have no peer failure handling (one of the two modes of
 * NIXL's own UCX backend).
 * ECX_EINVAL, ECX_ENOMEM, ECX_EDATA_UCX. */
int ecxi_nixl_agent_new(const char *name, const void *base, size_t len, bool peer_ucx,
                        ecxi_nixl_agent **out);
void ecxi_nixl_agent_free(ecxi_nixl_agent *a);

/* Its metadata (NIXL's getLocalMD bytes); NULL for a consumer. */
const uint8_t *ecxi_nixl_agent_metadata(const ecxi_nixl_agent *a, size_t *len);

/* UCX's event descriptor, and the arm before sleeping on it: 0 = safe to
 * sleep, 1 = progress first. */
int ecxi_nixl_agent_fd(const ecxi_nixl_agent *a);
int ecxi_nixl_agent_arm(ecxi_nixl_agent *a);
/* Progress UCX; returns >= 0 (events) or a negative error. */
int ecxi_nixl_agent_progress(ecxi_nixl_agent *a);
/* Progress until cond(arg) or timeout_ms, sleeping on UCX's event fd. */
bool ecxi_nixl_agent_wait(ecxi_nixl_agent *a, bool (*cond)(void *), void *arg, int timeout_ms);

/* The oldest notification not yet collected: copies of the sender's name
 * and the text, NUL-terminated (buffers of ECXI_NIXL_NAME_MAX + 1 and
 * ECXI_NIXL_MSG_MAX + 1 bytes). 1 if one was returned, 0 if none. */
int ecxi_nixl_agent_notif_pop(ecxi_nixl_agent *a, char *name, char *msg);
/* Notifications refused (malformed) or dropped (queue full). */
uint64_t ecxi_nixl_agent_notifs_dropped(const ecxi_nixl_agent *a);

/* A remote agent from its metadata (NIXL's add_remote_agent): parsed and
 * bounded, an endpoint from its worker address, its ranges' rkeys
 * unpacked. ECX_EDATA_META if any of that fails (UCX refusing the address
 * or an rkey included), ECX_ENOMEM. UCX 1.13.1 aborts the process on some
 * malformed addresses (docs/NIXL.md §6). */
int ecxi_nixl_remote_add(ecxi_nixl_agent *a, const uint8_t *md, size_t md_len,
                         ecxi_nixl_remote **out);
/* Its READs still running fail (ECX_EDATA_PEER); their handles stay valid
 * until released. */
void ecxi_nixl_remote_drop(ecxi_nixl_remote *r);
/* True if [addr, addr + len) lies inside one of its ranges. */
bool ecxi_nixl_remote_covers(const ecxi_nixl_remote *r, uint64_t addr, uint64_t len);
/* Its agent name (NUL-terminated). */
const char *ecxi_nixl_remote_name(const ecxi_nixl_remote *r);

/* One READ, as NIXL's make_prepped_xfer("READ", ..., notif_msg) does it:
 * n pieces remote[i] -> local[i] of len[i] bytes (each piece inside one of
 * the remote's ranges, else ECX_EDATA_INDEX; consecutive pieces that
 * continue each other on both sides go as one ucp_get), then a flush, then
 * the notification msg (1..ECXI_NIXL_MSG_MAX bytes). */
int ecxi_nixl_read_post(ecxi_nixl_remote *r, const uint64_t *remote, void *const *local,
                        const uint64_t *len, size_t n, const char *msg, size_t msg_len,
                        ecxi_nixl_read **out);
/* 0 running, 1 done (data read, notification sent), negative: failed. */
int ecxi_nixl_read_poll(ecxi_nixl_read *x);
/* Give it back (a READ still running is waited for, bounded, then left to
 * UCX). */
void ecxi_nixl_read_release(ecxi_nixl_read *x);

#endif

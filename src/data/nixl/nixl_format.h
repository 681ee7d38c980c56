/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nixl_format — the bytes a NIXL peer (vLLM's ECCPUConnector, NIXL's UCX
 * backend) exchanges with us, and their codec (docs/NIXL.md):
 *   - the agent metadata (`get_agent_metadata()`: a nixlSerDes string with
 *     the agent's name, its UCX worker address and its registered DRAM
 *     sections with their packed rkeys),
 *   - vLLM's mem_descriptor (msgspec msgpack of [(addr, len, dev_id), ...],
 *     one tuple per block),
 *   - the notification a READ ends with (a nixlSerDes of the sender's agent
 *     name and the text "{session_id}:{mm_hash}").
 * One file says what the bytes are, one encoder writes them, one strict
 * parser reads them, and the fuzzer (tests/fuzz/fuzz_nixl.c) targets exactly
 * that. Everything parsed comes from a peer: malformed input is
 * ECX_EDATA_META / ECX_EDATA_DESC / ECX_EDATA_NOTIF, never a crash; every
 * length is checked against the bytes received before anything is read,
 * and the UCX blobs (worker address, rkeys) are bounded here before UCX
 * sees them. The parsed forms hold views into the bytes parsed, which must
 * outlive them.
 */
#ifndef ECXI_NIXL_FORMAT_H
#define ECXI_NIXL_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ecx.h"

/* Bounds on what we accept (and produce). A worker address with RDMA
 * devices runs to a few KiB, an rkey to a few hundred bytes. */
#define ECXI_NIXL_META_MAX (64u << 10)
#define ECXI_NIXL_NAME_MAX 256      /* agent name */
#define ECXI_NIXL_BACKEND_MAX 64    /* backend name ("UCX") */
#define ECXI_NIXL_CONN_MAX (16u << 10) /* one backend's connection info */
#define ECXI_NIXL_RKEY_MAX 4096
#define ECXI_NIXL_CONNS_MAX 16      /* backends in one metadata */
#define ECXI_NIXL_SECS_MAX 16       /* sections in one metadata */
#define ECXI_NIXL_SEC_DESCS_MAX 64  /* descriptors in one section */
#define ECXI_NIXL_REGS_MAX 64       /* UCX DRAM descriptors we keep */
#define ECXI_NIXL_MSG_MAX 1024      /* notification text */

/* nixl_mem_t values (nixl_types.h). */
#define ECXI_NIXL_DRAM_SEG 0u

/* One registered DRAM range of the UCX backend, with its packed rkey. */
typedef struct ecxi_nixl_reg {
    uint64_t addr, len, dev_id; /* len > 0, addr + len does not wrap */
    const uint8_t *rkey;        /* 1..ECXI_NIXL_RKEY_MAX bytes */
    size_t rkey_len;
} ecxi_nixl_reg;

/* Agent metadata, parsed: what a READ from this agent needs. Backends
 * other than UCX and memory other than DRAM are skipped (checked for
 * bounds like everything else); exactly one UCX connection and at least
 * one UCX DRAM range are required. */
typedef struct ecxi_nixl_meta {
    const char *name; /* 1..ECXI_NIXL_NAME_MAX bytes, not NUL-terminated */
    size_t name_len;
    const uint8_t *ucx_addr; /* packed ucp worker address, 1..ECXI_NIXL_CONN_MAX */
    size_t ucx_addr_len;
    size_t nregs; /* 1..ECXI_NIXL_REGS_MAX */
    ecxi_nixl_reg regs[ECXI_NIXL_REGS_MAX];
} ecxi_nixl_meta;

/* Strict parse; ECX_EDATA_META. Trailing bytes are refused. */
int ecxi_nixl_meta_decode(const uint8_t *buf, size_t len, ecxi_nixl_meta *m);
/* What getLocalMD writes for one UCX backend and m->regs as one DRAM
 * section: byte-identical to a real agent's. Length or ECX_ERANGE /
 * ECX_EINVAL. */
long ecxi_nixl_meta_encode(const ecxi_nixl_meta *m, uint8_t *buf, size_t cap);

/* True if [addr, addr + len) lies inside one of m's ranges. */
bool ecxi_nixl_meta_covers(const ecxi_nixl_meta *m, uint64_t addr, uint64_t len);

/* vLLM's mem_descriptor: one (addr, len, dev_id) per block. */
typedef struct ecxi_nixl_block {
    uint64_t addr, len, dev_id;
} ecxi_nixl_block;

/* Count the blocks of a descriptor list and check its form: a msgpack
 * array of 3-integer arrays, nothing after it; at most max_blocks (and
 * len / 4: each tuple takes at least 4 bytes). 0 and *n, or
 * ECX_EDATA_DESC. */
int ecxi_nixl_desc_count(const uint8_t *buf, size_t len, size_t max_blocks, size_t *n);
/* Decode it into out[0..cap) (cap >= the count); ECX_EDATA_DESC. */
int ecxi_nixl_desc_decode(const uint8_t *buf, size_t len, ecxi_nixl_block *out, size_t cap,
                          size_t *n);
/* msgspec's own encoding of n blocks (shortest integer forms): bytes
 * written, or ECX_ERANGE. ecxi_nixl_desc_size(n blocks) bounds it. */
long ecxi_nixl_desc_encode(const ecxi_nixl_block *b, size_t n, uint8_t *buf, size_t cap);
size_t ecxi_nixl_desc_size(size_t n);

/* A notification's AM payload: sender name and text, both non-empty
 * (name <= ECXI_NIXL_NAME_MAX, text <= ECXI_NIXL_MSG_MAX). Decode:
 * ECX_EDATA_NOTIF; encode: length or ECX_ERANGE / ECX_EINVAL. */
int ecxi_nixl_notif_decode(const uint8_t *buf, size_t len, const char **name, size_t *name_len,
                           const char **msg, size_t *msg_len);
long ecxi_nixl_notif_encode(const char *name, size_t name_len, const char *msg, size_t msg_len,
                            uint8_t *buf, size_t cap);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_format — the two blobs the data plane puts in an XferAck, and their
 * codec: agent_metadata (how to reach a producer context: its paths) and
 * mem_descriptor (its block layout plus one grant's *ticket*). The format
 * is the data plane's wire contract between producer and consumer builds,
 * so it lives apart from both the front (data.c) and the backends: one
 * file says what the bytes are, one encoder writes them, one strict parser
 * reads them, and the fuzzer (tests/fuzz/fuzz_data.c) targets exactly that.
 *
 * Both formats are versioned (ECXI_DATA_FORMAT_VERSION), length-checked and
 * a few hundred bytes at most whatever the region size; data_format.c
 * describes the layout. Everything parsed comes from a peer: malformed
 * input is ECX_EDATA_META / ECX_EDATA_DESC / ECX_EDATA_VERSION, never a
 * crash. The parsed forms hold views into the bytes parsed, which must
 * outlive them.
 */
#ifndef ECXI_DATA_FORMAT_H
#define ECXI_DATA_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ecx.h"

#define ECXI_DATA_FORMAT_VERSION 2
/* Length of a grant's token. */
#define ECXI_DATA_TOKEN_LEN 16
/* Largest agent_metadata / mem_descriptor we produce or accept. */
#define ECXI_DATA_META_MAX 4096
#define ECXI_DATA_DESC_MAX 4096
/* Longest region file path and abstract socket name in a shm section. */
#define ECXI_DATA_PATH_MAX 1024
#define ECXI_DATA_SOCK_MAX 100

/* One grant as the data plane carries it (inside the mem_descriptor). */
typedef struct ecxi_data_ticket {
    uint8_t token[ECXI_DATA_TOKEN_LEN]; /* random per grant: its credential */
    uint64_t checksum;                 /* XXH3-64 of the item's bytes */
    uint64_t nbytes;                   /* the item's size */
    uint32_t lease_ms;                 /* the producer's pin lease */
} ecxi_data_ticket;

/* agent_metadata, parsed. Pointers are views into the bytes parsed. */
typedef struct ecxi_data_meta {
    uint64_t nonce; /* random per producer context; ties meta and desc */
    bool has_shm;
    uint8_t boot_id[16];
    uint64_t dev, ino; /* of the region file, as the producer sees it */
    const char *path;  /* region file path (not NUL-terminated) */
    size_t path_len;   /* 1..ECXI_DATA_PATH_MAX */
    const char *sock;  /* abstract unix socket name for notifications */
    size_t sock_len;   /* 1..ECXI_DATA_SOCK_MAX */
    bool has_ucx;
    const uint8_t *ucx_addr; /* packed ucp worker address */
    size_t ucx_addr_len;
    bool has_tcp;
    uint8_t tcp_family;   /* 4 or 6 */
    uint16_t tcp_port;    /* host order, never 0 */
    uint8_t tcp_addr[16]; /* network order: 4 or 16 bytes, a unicast address */
} ecxi_data_meta;

/* mem_descriptor, parsed (self-contained: no views). A consumer parses an
 * ack's descriptor once and hands this to ecxi_data_peer_add() and
 * ecxi_data_read_post(). */
typedef struct ecxi_data_desc {
    uint64_t nonce;
    uint64_t block_bytes; /* > 0 */
    uint64_t num_blocks;  /* 1..ECXI_REGION_MAX_BLOCKS, block_bytes * num_blocks fits size_t */
    bool has_ticket;      /* the grant this descriptor came with */
    /* nixl only (data.h, ecxi_data_ack_register; never encoded): vLLM's list,
     * base + i * block_bytes, and no checksum came with the grant (the
     * READ's own is the item's: ecxi_data_read_checksum) */
    bool unverified;
    uint64_t remote_base;
    ecxi_data_ticket ticket; /* if has_ticket: 0 < nbytes <= block_bytes * num_blocks,
                                lease_ms > 0 */
} ecxi_data_desc;

/* Encode into buf (cap bytes); returns the length or a negative error
 * (ECX_ERANGE if it does not fit, ECX_EINVAL for a field out of range). */
long ecxi_data_meta_encode(const ecxi_data_meta *m, uint8_t *buf, size_t cap);
long ecxi_data_desc_encode(const ecxi_data_desc *d, uint8_t *buf, size_t cap);
/* Strict parse; ECX_EDATA_META / ECX_EDATA_DESC / ECX_EDATA_VERSION. */
int ecxi_data_meta_decode(const uint8_t *buf, size_t len, ecxi_data_meta *m);
int ecxi_data_desc_decode(const uint8_t *buf, size_t len, ecxi_data_desc *d);
/* True if the bytes start like ecx's agent_metadata / mem_descriptor (their
 * magic; nothing else is checked): how a nixl consumer tells ecx's form from
 * NIXL's (whose metadata starts "nixlSerDes|", its descriptor a msgpack
 * array). */
bool ecxi_data_meta_is_ecx(const uint8_t *buf, size_t len);
bool ecxi_data_desc_is_ecx(const uint8_t *buf, size_t len);

#endif

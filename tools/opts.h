/* SPDX-License-Identifier: Apache-2.0 */
/*
 * opts — option parsing the ecx subcommands share: sizes with K/M/G
 * (powers of 1000) and Ki/Mi/Gi (powers of 1024) suffixes, bounded
 * integers, the compatibility factors and data-path options that serve,
 * get and bench all take, and the synthetic content they agree on.
 */
#ifndef ECX_OPTS_H
#define ECX_OPTS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ecx.h"

/* "4096", "1Mi", "4.7M", "2G". 0 and an error message on stderr if s is
 * not a size; *out receives the bytes. Fractions must come to whole bytes. */
int parse_size(const char *opt, const char *s, uint64_t *out);
/* The same, without a message: -1 if s is not a size. */
int parse_size_quiet(const char *s, uint64_t *out);
/* A decimal integer in [lo, hi]. */
int parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);

/* Options shared by serve, get and bench (each describes --region-bytes
 * itself: its default differs). */
enum {
    OPT_BLOCK_BYTES = 1000,
    OPT_REGION_BYTES,
    OPT_VLLM_VERSION,
    OPT_MODEL,
    OPT_DTYPE,
    OPT_DATA,
    OPT_CONNECTOR_VERSION,
};
#define COMMON_LONG_OPTS                                                                           \
    {"block-bytes", required_argument, 0, OPT_BLOCK_BYTES},                                        \
        {"region-bytes", required_argument, 0, OPT_REGION_BYTES},                                  \
        {"vllm-version", required_argument, 0, OPT_VLLM_VERSION},                                  \
        {"model", required_argument, 0, OPT_MODEL}, {"dtype", required_argument, 0, OPT_DTYPE},   \
        {"data", required_argument, 0, OPT_DATA},                                                  \
        {"connector-version", required_argument, 0, OPT_CONNECTOR_VERSION}

#define COMMON_HELP                                                                                \
    "  --block-bytes SIZE     block size (default 8Ki: one row of llava-1.5's 4096\n"          \
    "                         bf16, as vLLM >= 0.32 sizes it); peers must agree\n"            \
    "  --vllm-version TEXT    compatibility factor (default " ECX_DEFAULT_VLLM_VERSION ")\n"      \
    "  --model TEXT           compatibility factor (default " ECX_DEFAULT_MODEL ")\n"             \
    "  --dtype NAME           compatibility factor (default " ECX_DEFAULT_DTYPE "), hashed\n" \
    "                         as vLLM does: bfloat16, bf16, torch.bfloat16 are one dtype\n" \
    "  --connector-version 1|2  protocol version (default: the one --vllm-version\n" \
    "                         speaks, 2 from vLLM 0.32 on, else 1); 2 speaks to vLLM >= 0.32:\n" \
    "                         announcements carry shape [rows, block-bytes / element\n"         \
    "                         size of --dtype] (serve: or [rows, --width]) and items are\n"     \
    "                         whole blocks; peers must agree\n"                                 \
    "  --data PATH            data path: " ECX_DATA_PATHS " (default auto: shm\n" \
    "                         on the same host,\n" \
    "                         else tcp). tcp moves the bytes unencrypted: trusted network\n"      \
    "                         or IPsec/WireGuard. ucx (RDMA fabrics): trusted network ONLY,\n"    \
    "                         UCX's tcp transport lets any peer write the memory of\n"          \
    "                         ecx's UCX process (ecx-ucx-agent; it maps the region).\n"         \
    "                         nixl: auto for ecx peers, NIXL's one-sided data plane for\n"      \
    "                         vLLM's own connector; trusted network ONLY: a NIXL peer can\n"     \
    "                         read the whole region and more, no checksum (docs/NIXL.md)\n"      \
    "  SIZE takes K/M/G (x1000) and Ki/Mi/Gi (x1024) suffixes, e.g. 4.7M, 64Mi.\n"

/* Apply one common option to cfg. Returns 1 if c was one of them, 0 if
 * not, -1 on a bad value (message printed). */
int common_opt(int c, const char *arg, ecx_config *cfg, bool *region_given);

/* After the options: connector_version 0 made the one --vllm-version speaks;
 * -1 (message printed: a usage error) if --connector-version 1 was given with a
 * vLLM that speaks 2. */
int common_finish(ecx_config *cfg);
/* Under protocol version 2 an item is whole blocks: 0 if bytes is (or the
 * version is 1), else -1 with a usage message naming OPT, the whole-block
 * size to give instead and --vllm-version 0.31.0 for version 1 (as serve
 * --synthetic says). Call after common_finish. */
int whole_blocks_ok(const char *opt, const ecx_config *cfg, uint64_t bytes);
/* True if s is one of ECX_DATA_PATHS. */
bool data_path_ok(const char *s);
/* "ecx: WHO: vllm-version V, model M, dtype D, block-bytes B, protocol version P,
 * compat hash H" on stderr: what a peer must match. */
void print_factors(const char *who, const ecx_config *cfg);

/* An mm_hash that can be a file name as is: 1..ECX_MM_HASH_MAX (255) of
 * [A-Za-z0-9._-], not "." or "..". serve --preload and get --out DIR use it. */
bool item_name_ok(const char *s);

/* Synthetic encodings, so a consumer can verify what `serve --synthetic`
 * serves: item i (0-based) of COUNT:BYTES has mm_hash = lowercase hex
 * SHA-256 of "ecx-synthetic:<i>:<bytes>", and its content is the
 * little-endian byte stream of splitmix64 seeded with the first 8 bytes of
 * that SHA-256 (read little-endian). */
void synthetic_hash(uint64_t i, uint64_t bytes, char out[65]);
void synthetic_fill(const char *mm_hash, uint8_t *dst, uint64_t offset, size_t len);
/* The seed of an mm_hash made by synthetic_hash (0 if it is not 64 hex). */
uint64_t synthetic_seed(const char *mm_hash);

/* Small helpers the subcommands share (tools-local; the library keeps its
 * own). */

/* Lowercase hex of n bytes into out (2n characters + NUL). */
void hex_encode(const void *in, size_t n, char *out);
/* Parse len hex digits (either case) into len/2 bytes; the byte count, or
 * -1 on an odd length or a non-hex digit. */
long hex_decode(const char *hex, size_t len, uint8_t *out);
/* Split "HOST:PORT" / "[V6]:PORT" into host (no brackets, at most 255
 * bytes) and port (0..65535). 0, or -1 if addr is not of that form. */
int parse_host_port(const char *addr, char host[256], int *port);
/* CLOCK_MONOTONIC in seconds. */
double mono_s(void);
/* The directory region files live in: $ECX_SHM_DIR if set and non-empty,
 * else /dev/shm (as ecx.h documents). */
const char *shm_dir(void);

#endif

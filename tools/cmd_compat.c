/* SPDX-License-Identifier: Apache-2.0 */
/* ecx compat-hash — print the peer-compatibility hash of four factors. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ecx.h"
#include "opts.h"

static const char HELP[] =
    "usage: ecx compat-hash VLLM_VERSION MODEL DTYPE BLOCK_SIZE_BYTES\n"
    "\n"
    "Print the lowercase hex SHA-256 that peers compare before a transfer:\n"
    "the hash of Python's json.dumps([VLLM_VERSION, MODEL, DTYPE,\n"
    "BLOCK_SIZE_BYTES], separators=(\",\", \":\")). The strings must be UTF-8;\n"
    "BLOCK_SIZE_BYTES is an int64, or a size with K/M/G or Ki/Mi/Gi (8Ki).\n"
    "DTYPE is hashed as given, as the reference does. vLLM hashes str(torch.dtype),\n"
    "e.g. torch.bfloat16, and so do serve and get for any spelling of it (bf16,\n"
    "bfloat16): `ecx serve` prints the hash it uses at start.\n";

int cmd_compat_hash(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(HELP, stdout);
        return EXIT_OK;
    }
    if (argc != 5) return usage_error("compat-hash takes 4 arguments (try 'ecx compat-hash --help')");
    const char *num = argv[4];
    char *end;
    errno = 0;
    long long bs = strtoll(num, &end, 10);
    uint64_t size;
    if (*end && *num != '-' && !parse_size_quiet(num, &size) && size <= INT64_MAX)
        bs = (long long)size, end = "", errno = 0;
    if (!*num || (*num != '-' && (*num < '0' || *num > '9')) || *end || errno == ERANGE)
        return usage_error("BLOCK_SIZE_BYTES must be an int64 or a size like 8Ki, got '%s'",
                           num);
    char hex[ECX_COMPAT_HASH_HEX + 1];
    int rc = ecx_compat_hash(argv[1], strlen(argv[1]), argv[2], strlen(argv[2]), argv[3],
                             strlen(argv[3]), (int64_t)bs, hex);
    if (rc) {
        fprintf(stderr, "error: %s\n", ecx_strerror(rc));
        return EXIT_FAIL;
    }
    puts(hex);
    return EXIT_OK;
}

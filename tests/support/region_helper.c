/* SPDX-License-Identifier: Apache-2.0 */
/* region_helper — a second (and third) real process for test_region.
 *
 *   region_helper create DIR INSTANCE RANK TOTAL BLOCK
 *       creates the region, fills block 0 with 0xA5, prints "ready PATH"
 *       and waits for EOF on stdin, then frees it (clean shutdown) and
 *       exits 0. The test kills it with SIGKILL to play a crash.
 *   region_helper join DIR INSTANCE RANK BLOCK
 *       joins, checks block 0 is all 0xA5, fills block 1 with 0x5A, exits 0.
 * Any failure prints why on stderr and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "region.h"

static int fail(const char *what, int rc)
{
    fprintf(stderr, "region_helper: %s: %s\n", what, ecx_strerror(rc));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 7 && strcmp(argv[1], "create") == 0) {
        ecxi_region *r;
        int rc = ecxi_region_create_in(argv[2], argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 10),
                                      strtoull(argv[6], NULL, 10), &r);
        if (rc) return fail("create", rc);
        memset(ecxi_region_base(r), 0xa5, ecxi_region_block_bytes(r));
        printf("ready %s\n", ecxi_region_path(r));
        fflush(stdout);
        char buf[64];
        while (read(0, buf, sizeof buf) > 0) {
        }
        ecxi_region_free(r);
        return 0;
    }
    if (argc == 6 && strcmp(argv[1], "join") == 0) {
        ecxi_region *r;
        uint64_t bs = strtoull(argv[5], NULL, 10);
        int rc = ecxi_region_join_in(argv[2], argv[3], atoi(argv[4]), bs, &r);
        if (rc) return fail("join", rc);
        const uint8_t *b = ecxi_region_base(r);
        for (uint64_t i = 0; i < bs; i++)
            if (b[i] != 0xa5) {
                fprintf(stderr, "region_helper: byte %llu is %02x\n", (unsigned long long)i, b[i]);
                return 1;
            }
        if (ecxi_region_num_blocks(r) < 2) return fail("join: too few blocks", ECX_ERANGE);
        memset(ecxi_region_base(r) + bs, 0x5a, bs);
        ecxi_region_free(r);
        return 0;
    }
    fprintf(stderr,
            "usage: region_helper create DIR INST RANK TOTAL BLOCK | join DIR INST RANK BLOCK\n");
    return 2;
}

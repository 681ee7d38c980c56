/* SPDX-License-Identifier: Apache-2.0 */
/*
 * speak_v1 — the one place the C tests name protocol version 1. The library's
 * defaults speak version 2 (vLLM 0.34.0, 8 KiB blocks: one row of llava-1.5's
 * 4096 bf16), where every item is whole blocks. A test that speaks version 1
 * on purpose (hand-written version-1 frames, its 2 s ack timeout, items of
 * any byte count) starts from ecxt_config_v1: the defaults with vLLM 0.31.0's
 * version and 1 MiB blocks (the defaults before version 2), then sets its own.
 * (tests/shell/lib.sh's V1 is the same for the shell tests.)
 */
#ifndef ECX_TEST_SPEAK_V1_H
#define ECX_TEST_SPEAK_V1_H

#include "ecx.h"

#define ECXT_V1_VLLM_VERSION "0.31.0"
#define ECXT_V1_BLOCK_BYTES (1ull << 20)

static inline void ecxt_config_v1(ecx_config *c)
{
    ecx_config_init(c);
    c->vllm_version = ECXT_V1_VLLM_VERSION;
    c->block_bytes = ECXT_V1_BLOCK_BYTES; /* connector_version 0: 0.31.0 speaks 1 */
}

#endif

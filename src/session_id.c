/* SPDX-License-Identifier: Apache-2.0 */
/*
 * session_id — ecx's marked UUID4 session ids (session_id.h).
 */
#include "session_id.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

void ecxi_session_id_new(char out[ECXI_SESSION_ID_LEN + 1])
{
    unsigned char b[10]; /* the 80 bits before the marker */
    randombytes_buf(b, sizeof b);
    b[6] = (b[6] & 0x0f) | 0x40; /* version 4 */
    b[8] = (b[8] & 0x3f) | 0x80; /* RFC 4122 variant */
    char hex[21];
    ecxi_hex_encode(b, sizeof b, hex);
    snprintf(out, ECXI_SESSION_ID_LEN + 1, "%.8s-%.4s-%.4s-%.4s-%s", hex, hex + 8, hex + 12,
             hex + 16, ECXI_SESSION_ID_MARK);
}

/* Lowercase hex digits. */
static const bool hex_digit[256] = {
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
    ['8'] = 1, ['9'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1};

/* Asked once per request of a nixl-mode producer: the marker first (any
 * other id, vLLM's, is told apart in one compare), then the rest without a
 * branch per character. */
bool ecxi_session_id_is_ecx(const char *sid, size_t n)
{
    if (!sid || n != ECXI_SESSION_ID_LEN || memcmp(sid + 24, ECXI_SESSION_ID_MARK, 12) != 0 ||
        sid[8] != '-' || sid[13] != '-' || sid[18] != '-' || sid[23] != '-' || sid[14] != '4' ||
        !(sid[19] == '8' || sid[19] == '9' || sid[19] == 'a' || sid[19] == 'b'))
        return false;
    const unsigned char *u = (const unsigned char *)sid;
    bool ok = true;
    for (size_t i = 0; i < 8; i++) ok &= hex_digit[u[i]];
    for (size_t i = 9; i < 13; i++) ok &= hex_digit[u[i]];
    for (size_t i = 15; i < 18; i++) ok &= hex_digit[u[i]];
    for (size_t i = 20; i < 23; i++) ok &= hex_digit[u[i]];
    return ok;
}

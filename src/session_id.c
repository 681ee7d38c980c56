/* SPDX-License-Identifier: Apache-2.0 */
/*
 * session_id — ecx's marked UUID4 session ids (session_id.h).
 */
#include "session_id.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

void ecxi_session_id_new(char out[ECX_SESSION_ID_LEN + 1])
{
    unsigned char b[10]; /* the 80 bits before the marker */
    randombytes_buf(b, sizeof b);
    b[6] = (b[6] & 0x0f) | 0x40; /* version 4 */
    b[8] = (b[8] & 0x3f) | 0x80; /* RFC 4122 variant */
    char hex[21];
    ecxi_hex_encode(b, sizeof b, hex);
    snprintf(out, ECX_SESSION_ID_LEN + 1, "%.8s-%.4s-%.4s-%.4s-%s", hex, hex + 8, hex + 12,
             hex + 16, ECX_SESSION_ID_MARK);
}

bool ecxi_session_id_is_ecx(const char *sid, size_t n)
{
    if (!sid || n != ECX_SESSION_ID_LEN) return false;
    for (size_t i = 0; i < n; i++) {
        char c = sid[i];
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return sid[14] == '4' && strchr("89ab", sid[19]) &&
           memcmp(sid + 24, ECX_SESSION_ID_MARK, 12) == 0;
}

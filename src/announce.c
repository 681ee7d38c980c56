/* SPDX-License-Identifier: Apache-2.0 */
/*
 * announce — the reference's announcement JSON, written and read, and the
 * consumer's checks on an announcement (announce.h).
 */
#include "announce.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

bool ecxi_announce_host_ok(const char *h)
{
    if (!h) return false;
    size_t n = strnlen(h, ECXI_HOST_MAX + 1);
    if (n == 0 || n > ECXI_HOST_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (!(h[i] == '.' || h[i] == '-' || h[i] == ':' || h[i] == '_' ||
              (h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'z') ||
              (h[i] >= 'A' && h[i] <= 'Z')))
            return false;
    return true;
}

#define HELD_FMT "{\"peer_host\":\"%s\",\"peer_port\":%d,\"size_bytes\":%llu,%s\"metadata\":{}}"
#define NOT_HELD "{\"metadata\":{}}"

bool ecxi_announce_shape_bytes(const ecxi_announce_rows *r, uint64_t rows, uint64_t width,
                               uint64_t *out)
{
    uint64_t bytes;
    if (r->elem_size <= 0 || r->block_bytes == 0 || __builtin_mul_overflow(rows, width, &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)r->elem_size, &bytes) ||
        bytes > UINT64_MAX - r->block_bytes)
        return false;
    *out = (bytes + r->block_bytes - 1) / r->block_bytes * r->block_bytes;
    return true;
}

int ecxi_announce_json(char *buf, size_t cap, size_t *len, const ecx_announcement *a,
                       const ecxi_announce_rows *rows)
{
    return ecxi_announce_json_shape(buf, cap, len, a, rows, 0, 0);
}

int ecxi_announce_json_shape(char *buf, size_t cap, size_t *len, const ecx_announcement *a,
                             const ecxi_announce_rows *rows, uint64_t shape_rows,
                             uint64_t shape_width)
{
    if (!len) return ECX_EINVAL;
    *len = 0;
    if (a && (!ecxi_announce_host_ok(a->peer_host) || a->peer_port < 1 || a->peer_port > 65535))
        return ECX_EINVAL;
    char shape[64] = "";
    if (a && rows) {
        if (rows->elem_size <= 0 || rows->block_bytes == 0 || a->size_bytes % rows->block_bytes)
            return ECX_EINVAL;
        uint64_t r = a->size_bytes / rows->block_bytes,
                 w = rows->block_bytes / (uint64_t)rows->elem_size, bytes;
        if (shape_rows && shape_width) {
            if (!ecxi_announce_shape_bytes(rows, shape_rows, shape_width, &bytes) ||
                bytes != a->size_bytes)
                return ECX_EINVAL;
            r = shape_rows, w = shape_width;
        }
        snprintf(shape, sizeof shape, "\"shape\":[%llu,%llu],", (unsigned long long)r,
                 (unsigned long long)w);
    }
    /* The host needs no escaping: host_ok admits no quote, backslash or
     * control character. */
    int n = a ? snprintf(NULL, 0, HELD_FMT, a->peer_host, a->peer_port,
                         (unsigned long long)a->size_bytes, shape)
              : (int)strlen(NOT_HELD);
    if (n < 0) return ECX_EINVAL;
    *len = (size_t)n;
    if (!buf || (size_t)n >= cap) return ECX_ERANGE;
    if (a)
        snprintf(buf, cap, HELD_FMT, a->peer_host, a->peer_port,
                 (unsigned long long)a->size_bytes, shape);
    else
        memcpy(buf, NOT_HELD, (size_t)n + 1);
    return 0;
}

/* Version 2: the whole blocks shape's rows x width elements take, as
 * vLLM's scheduler sizes them (_num_blocks x block_size_bytes); false if
 * shape is not two integers >= 0 or the product overflows. */
static bool shape_bytes(const json_t *shape, const ecxi_announce_rows *rows, uint64_t *out)
{
    if (!json_is_array(shape) || json_array_size(shape) != 2) return false;
    json_t *r = json_array_get(shape, 0), *w = json_array_get(shape, 1);
    if (!json_is_integer(r) || !json_is_integer(w) || json_integer_value(r) < 0 ||
        json_integer_value(w) < 0)
        return false;
    return ecxi_announce_shape_bytes(rows, (uint64_t)json_integer_value(r),
                                     (uint64_t)json_integer_value(w), out);
}

/* The checks after "is there a peer_host at all": host, port, size, and
 * (version 2, rows given) the bytes the shape takes: shape_size NULL = no
 * usable shape; for the struct, which has none, the caller passes size
 * rounded up to whole blocks, so only whole blocks pass. */
static int check(const char *host, bool port_given, long long port, bool size_given, long long size,
                 uint64_t expected_size, uint64_t max_bytes, const ecxi_announce_rows *rows,
                 const uint64_t *shape_size, ecxi_announce_peer *out)
{
    if (!ecxi_announce_host_ok(host)) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement: peer_host is not a host name or address");
        return ECX_REASON_INVALID;
    }
    if (!port_given) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement: peer_port is missing or not a JSON "
                            "integer (a string?)");
        return ECX_REASON_INVALID;
    }
    if (port < 1 || port > 65535) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement: peer_port %lld is not a port (1..65535)",
                            port);
        return ECX_REASON_INVALID;
    }
    if (!size_given || size <= 0) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement: size_bytes is missing or not a "
                            "positive JSON integer");
        return ECX_REASON_INVALID;
    }
    if (rows && !shape_size) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement: no usable shape (version 2)");
        return ECX_REASON_INVALID;
    }
    memcpy(out->host, host, strlen(host) + 1);
    out->port = (int)port;
    out->size_bytes = (uint64_t)size;
    if (expected_size && expected_size != out->size_bytes) return ECX_REASON_SIZE_MISMATCH;
    if (rows && *shape_size != out->size_bytes) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement: size_bytes %llu is not the %llu bytes "
                            "of whole blocks its shape (or size) takes: version 2 moves whole rows", (unsigned long long)out->size_bytes,
                            (unsigned long long)*shape_size);
        return ECX_REASON_SIZE_MISMATCH;
    }
    if (max_bytes && out->size_bytes > max_bytes) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement: size_bytes %llu is beyond any region",
                            (unsigned long long)out->size_bytes);
        return ECX_REASON_INVALID;
    }
    return ECX_REASON_NONE;
}

int ecxi_announce_parse(const char *json, const ecx_announcement *from, uint64_t expected_size,
                        uint64_t max_bytes, const ecxi_announce_rows *rows,
                        ecxi_announce_peer *out)
{
    memset(out, 0, sizeof *out);
    if (json && from) return ECX_REASON_INVALID;
    if (from) {
        if (!from->peer_host || !*from->peer_host) return ECX_REASON_NO_PEER;
        /* A size beyond what a JSON integer (and a region) can hold is
         * refused as INVALID by max_bytes, or here when there is none. */
        long long size = from->size_bytes > (uint64_t)INT64_MAX ? -1 : (long long)from->size_bytes;
        uint64_t bb = rows ? rows->block_bytes : 1;
        uint64_t whole = from->size_bytes / bb * bb + (from->size_bytes % bb ? bb : 0);
        return check(from->peer_host, true, from->peer_port, true, size, expected_size, max_bytes, rows,
                     &whole, out);
    }
    if (!json) return ECX_REASON_NO_PEER;
    json_error_t err;
    json_t *j = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    int why;
    if (!j) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement is not JSON: %s (column %d)", err.text,
                            err.column);
        why = ECX_REASON_INVALID;
    } else if (!json_is_object(j)) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement is not a JSON object");
        why = ECX_REASON_INVALID;
    } else {
        json_t *h = json_object_get(j, "peer_host"), *p = json_object_get(j, "peer_port"),
               *s = json_object_get(j, "size_bytes");
        uint64_t shape_size = 0;
        bool shape_ok = rows && shape_bytes(json_object_get(j, "shape"), rows, &shape_size);
        if (!h || (json_is_string(h) && json_string_length(h) == 0))
            why = ECX_REASON_NO_PEER; /* {"metadata":{}}: not held there */
        else if (!json_is_string(h)) {
            ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "announcement: peer_host is not a JSON string");
            why = ECX_REASON_INVALID;
        }
        else if (strlen(json_string_value(h)) != json_string_length(h))
            why = ECX_REASON_INVALID; /* a NUL inside */
        else
            why = check(json_string_value(h), json_is_integer(p),
                        json_is_integer(p) ? json_integer_value(p) : -1,
                        json_is_integer(s), json_is_integer(s) ? json_integer_value(s) : 0,
                        expected_size, max_bytes, rows, shape_ok ? &shape_size : NULL, out);
    }
    json_decref(j);
    return why;
}

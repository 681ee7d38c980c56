/* error — names of ecx error codes and of ack statuses, in one table each. */
#include "ecx.h"

const char *ecx_strerror(int err)
{
    switch (err) {
    case ECX_OK: return "success";
    case ECX_EINVAL: return "invalid argument";
    case ECX_ENOMEM: return "out of memory";
    case ECX_ERANGE: return "value out of range";
    case ECX_EUTF8: return "string is not valid UTF-8";
    case ECX_ECRYPTO: return "crypto library failure";
    case ECX_ESYS: return "system call failed";
    case ECX_EWIRE_EMPTY: return "empty frame";
    case ECX_EWIRE_TRUNCATED: return "frame truncated inside a value";
    case ECX_EWIRE_TRAILING: return "trailing bytes after the message";
    case ECX_EWIRE_NOT_MAP: return "message is not a msgpack map";
    case ECX_EWIRE_TYPE: return "field or key has the wrong msgpack type";
    case ECX_EWIRE_UTF8: return "str field is not valid UTF-8";
    case ECX_EWIRE_MISSING: return "required field missing";
    case ECX_EWIRE_TAG: return "type tag names another message";
    case ECX_EWIRE_STATUS: return "status is not a known XferStatus";
    case ECX_EWIRE_INT: return "integer out of the accepted range";
    case ECX_EWIRE_INVALID: return "byte 0xc1 is not msgpack";
    case ECX_EWIRE_TOO_LARGE: return "frame or field too large";
    case ECX_EDATA_META: return "agent_metadata malformed";
    case ECX_EDATA_DESC: return "mem_descriptor malformed";
    case ECX_EDATA_VERSION: return "data-plane format version not supported";
    case ECX_EDATA_MISMATCH: return "descriptor does not match the producer or block sizes differ";
    case ECX_EDATA_INDEX: return "block index out of range";
    case ECX_EDATA_COUNT: return "block count is zero or differs between the sides";
    case ECX_EDATA_NOPATH: return "no data path reaches the peer";
    case ECX_EDATA_UCX: return "UCX call failed";
    case ECX_EDATA_PEER: return "data-plane peer unreachable or broken";
    case ECX_EDATA_FAULT: return "injected data-plane fault";
    case ECX_EDATA_ROLE: return "call not valid for this data-plane role";
    case ECX_EDATA_NOTIF: return "notification empty or too long";
    case ECX_EDATA_GRANT: return "no live grant with that key and token";
    case ECX_EREGION_SIZE: return "region size is zero, too large, or not whole blocks";
    case ECX_EREGION_EXISTS: return "region file already exists";
    case ECX_EREGION_NOTFOUND: return "region file not found";
    case ECX_EREGION_NOSPC: return "shared memory too small for the region";
    case ECX_EREGION_BADFILE: return "region file is a symlink, not regular, or not ours";
    case ECX_EREGION_BUSY: return "region file is being reclaimed";
    case ECX_ECACHE_FULL: return "cache full: not enough free or evictable blocks";
    case ECX_ECACHE_EXISTS: return "cache entry already exists";
    case ECX_ECACHE_MISSING: return "no cache entry for that key";
    case ECX_ECACHE_NOT_READY: return "cache entry is not ready";
    case ECX_ECACHE_STATE: return "operation not allowed in the cache entry's state";
    }
    return "unknown error";
}

const char *ecx_status_name(int status)
{
    switch (status) {
    case ECX_STATUS_OK: return "OK";
    case ECX_STATUS_NACK_MISSING: return "NACK_MISSING";
    case ECX_STATUS_NACK_INCOMPAT: return "NACK_INCOMPAT";
    case ECX_STATUS_NACK_VERSION: return "NACK_VERSION";
    case ECX_STATUS_NACK_INTERNAL: return "NACK_INTERNAL";
    case ECX_STATUS_NACK_NOT_READY: return "NACK_NOT_READY";
    }
    return "UNKNOWN";
}

const char *ecx_reason_name(int reason)
{
    static const char *const names[ECX_REASON_COUNT] = {
        [ECX_REASON_NONE] = "NONE",
        [ECX_REASON_NO_PEER] = "NO_PEER",
        [ECX_REASON_SIZE_MISMATCH] = "SIZE_MISMATCH",
        [ECX_REASON_INVALID] = "INVALID",
        [ECX_REASON_NO_ROOM] = "NO_ROOM",
        [ECX_REASON_NACK_MISSING] = "NACK_MISSING",
        [ECX_REASON_NACK_INCOMPAT] = "NACK_INCOMPAT",
        [ECX_REASON_NACK_VERSION] = "NACK_VERSION",
        [ECX_REASON_NACK_INTERNAL] = "NACK_INTERNAL",
        [ECX_REASON_NOT_READY_TIMEOUT] = "NOT_READY_TIMEOUT",
        [ECX_REASON_ACK_TIMEOUT] = "ACK_TIMEOUT",
        [ECX_REASON_BAD_ACK] = "BAD_ACK",
        [ECX_REASON_READ_FAILED] = "READ_FAILED",
        [ECX_REASON_QUARANTINED] = "QUARANTINED",
        [ECX_REASON_SEND_FAILED] = "SEND_FAILED",
        [ECX_REASON_CORRUPT] = "CORRUPT",
        [ECX_REASON_LEASE_EXPIRED] = "LEASE_EXPIRED",
    };
    return reason >= 0 && reason < ECX_REASON_COUNT ? names[reason] : "UNKNOWN";
}

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

/* SPDX-License-Identifier: Apache-2.0 */
/* error — names of error codes, ack statuses and fallback reasons, generated
 * from the one list of each in include/ecx.h. */
#include "ecx.h"

const char *ecx_errname(int err)
{
    switch (err) {
#define ECXI_ERRNAME_(name, code, msg)                                                              \
    case ECX_##name: return "ECX_" #name;
        ECX_ERRORS(ECXI_ERRNAME_)
#undef ECXI_ERRNAME_
    }
    return "ECX_EUNKNOWN";
}

const char *ecx_strerror(int err)
{
    switch (err) {
#define ECXI_STRERROR_(name, code, msg)                                                             \
    case ECX_##name: return msg;
        ECX_ERRORS(ECXI_STRERROR_)
#undef ECXI_STRERROR_
    }
    return "unknown error";
}

const char *ecx_status_name(int status)
{
    switch (status) {
#define ECXI_STATUS_NAME_(name, v)                                                                  \
    case ECX_STATUS_##name: return #name;
        ECX_STATUSES(ECXI_STATUS_NAME_)
#undef ECXI_STATUS_NAME_
    }
    return "UNKNOWN";
}

const char *ecx_reason_name(int reason)
{
    static const char *const names[ECX_REASON_COUNT] = {
#define ECXI_REASON_NAME_(name, meaning) #name,
        ECX_REASONS(ECXI_REASON_NAME_)
#undef ECXI_REASON_NAME_
    };
    return reason >= 0 && reason < ECX_REASON_COUNT ? names[reason] : "UNKNOWN";
}

const char *ecx_version(void) { return ECX_VERSION_STRING; }

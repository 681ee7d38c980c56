/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_fault — a data-plane backend for tests only: it wraps a real
 * context and makes chosen READs misbehave, so the session tests can drive
 * every failure path of docs/PROTOCOL.md §5 (read error, quarantine, corrupt bytes)
 * without a broken network.
 *
 * Faults apply to posts counted on the wrapper: after `skip` posts, the
 * next `count` posts (count < 0: all of them) get the fault.
 *   POST_FAIL  ecxi_data_read_post() returns ECX_EDATA_FAULT
 *   READ_FAIL  the post succeeds, moves nothing, and polls FAILED
 *   HANG       the post succeeds, moves nothing, and polls RUNNING forever
 *              (the quarantine path); release works as for any xfer
 *   DELAY      the real READ runs, but its end is held back (it polls
 *              RUNNING) until ecxi_data_fault_set() is called again: a
 *              READ that finishes late, as in a consumer stopped mid-read
 *   CORRUPT    the real READ runs; when it is done, the first byte of the
 *              first local block is flipped and the checksum is checked
 *              again over the local blocks, so the xfer polls CORRUPT
 * Everything else (peers, notifications, progress) passes through.
 */
#ifndef ECXI_DATA_FAULT_H
#define ECXI_DATA_FAULT_H

#include "data.h"

enum ecxi_data_fault_kind {
    ECXI_FAULT_NONE = 0,
    ECXI_FAULT_POST_FAIL = 1,
    ECXI_FAULT_READ_FAIL = 2,
    ECXI_FAULT_HANG = 3,
    ECXI_FAULT_CORRUPT = 4,
    ECXI_FAULT_DELAY = 5,
};

/* Wrap inner (taking ownership: ecxi_data_free(*out) frees it). */
int ecxi_data_fault_wrap(ecxi_data *inner, ecxi_data **out);

/* Arm a fault; ECX_EINVAL if d is not a fault wrapper or kind unknown. */
int ecxi_data_fault_set(ecxi_data *d, int kind, int skip, int count);

/* How many posts got a fault so far. */
unsigned ecxi_data_fault_hits(const ecxi_data *d);

#endif

/*
 * data — the data plane: one-sided READ of a producer's blocks into the
 * consumer's blocks, and the completion notification back (SPEC §2, §6).
 *
 * This is the one small interface the sessions use, whatever moves the
 * bytes. A producer context publishes two opaque byte strings that travel
 * in the XferAck: agent_metadata (how to reach it) and mem_descriptor (its
 * block layout). A consumer context registers a peer from them, posts a
 * READ of remote block indices into local block indices, polls it (running
 * / done / failed) and releases it; once a READ is done the backend sends
 * the notification "{session_id}:{mm_hash}" to the producer, which
 * collects it with ecx_data_poll_notifs().
 *
 * Backends (the vtable is in data_impl.h):
 *   ucx   UCX ucp_get from the producer's mapped region (data_ucx.c); works
 *         across hosts (TCP here, RDMA where the hardware has it) and
 *         across network namespaces; notification = UCX active message.
 *   shm   same host: memcpy straight from the producer's region file,
 *         mapped read-only; notification = datagram on the producer's
 *         abstract unix socket (data_shm.c).
 *   auto  (default) a producer publishes both; a consumer uses shm when the
 *         producer has the same boot id, its region file is visible (same
 *         device and inode) and its socket answers, else ucx (data.c).
 *   fault tests only: wraps another context and injects failures
 *         (data_fault.h).
 *
 * No hidden threads: everything advances in ecx_data_progress() (and the
 * poll calls), which ecx_poll() calls. ecx_data_fd() is a descriptor that
 * becomes readable when there may be something to progress; call
 * ecx_data_arm() first and sleep on it only if that returns 0.
 *
 * Formats (data.c, versioned, length-checked, a few hundred bytes at most
 * whatever the region size): see the comment above ecx_data_meta_encode().
 * Everything that comes from a peer is validated; malformed input is an
 * ECX_EDATA_* code, never a crash.
 */
#ifndef ECX_DATA_H
#define ECX_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ecx.h"
#include "region.h"

typedef struct ecx_data ecx_data;
typedef struct ecx_data_peer ecx_data_peer;
typedef struct ecx_data_xfer ecx_data_xfer;

/* Which path moves the bytes (`--data auto|shm|ucx`). */
enum ecx_data_backend { ECX_DATA_AUTO = 0, ECX_DATA_SHM = 1, ECX_DATA_UCX = 2 };

/* State of a posted READ. */
enum ecx_xfer_state { ECX_XFER_RUNNING = 0, ECX_XFER_DONE = 1, ECX_XFER_FAILED = 2 };

/* Longest completion notification, in bytes ("{session_id}:{mm_hash}"). */
#define ECX_DATA_NOTIF_MAX 512
/* Largest agent_metadata / mem_descriptor we produce or accept. */
#define ECX_DATA_META_MAX 4096
#define ECX_DATA_DESC_MAX 4096

typedef struct ecx_data_opts {
    int backend; /* enum ecx_data_backend; 0 = auto */
} ecx_data_opts;

/* Parse "auto" / "shm" / "ucx" into enum ecx_data_backend; ECX_EINVAL else. */
int ecx_data_backend_parse(const char *s, int *out);
const char *ecx_data_backend_name(int backend);

/* ---- producer ---------------------------------------------------------- */

/* A producer context serving `region` (which must outlive it). opts may be
 * NULL (auto: publish both paths; if one cannot start it is left out with a
 * warning, and only if none starts is it an error). */
int ecx_data_new_producer(ecx_region *region, const ecx_data_opts *opts, ecx_data **out);

/* The bytes to put in every OK ack; valid until ecx_data_free(). */
const uint8_t *ecx_data_agent_metadata(const ecx_data *d, size_t *len);
const uint8_t *ecx_data_mem_descriptor(const ecx_data *d, size_t *len);

/* Called once per notification; msg is NUL-terminated, len excludes it. */
typedef void (*ecx_data_notif_cb)(void *arg, const char *msg, size_t len);

/* Progress, then hand every notification received since the last call to
 * cb. Returns how many were delivered, or a negative error. */
int ecx_data_poll_notifs(ecx_data *d, ecx_data_notif_cb cb, void *arg);

/* ---- consumer ---------------------------------------------------------- */

/* A consumer context reading into `region` (which must outlive it). */
int ecx_data_new_consumer(ecx_region *region, const ecx_data_opts *opts, ecx_data **out);

/* Register the producer that sent these bytes. Errors: ECX_EDATA_META /
 * ECX_EDATA_DESC (malformed), ECX_EDATA_VERSION, ECX_EDATA_MISMATCH
 * (descriptor of another producer, or block sizes differ),
 * ECX_EDATA_NOPATH (no enabled backend reaches it), ECX_EDATA_UCX. */
int ecx_data_peer_add(ecx_data *d, const uint8_t *meta, size_t meta_len, const uint8_t *desc,
                      size_t desc_len, ecx_data_peer **out);

/* True if the peer was registered from exactly these bytes (an ack whose
 * metadata differs means the producer restarted: drop and add again). */
bool ecx_data_peer_same(const ecx_data_peer *p, const uint8_t *meta, size_t meta_len,
                        const uint8_t *desc, size_t desc_len);

/* Name of the path the peer uses ("shm" / "ucx"). */
const char *ecx_data_peer_backend(const ecx_data_peer *p);

/* Drop a registration. READs still running on it are failed (their xfers
 * stay valid until released). NULL is a no-op. */
void ecx_data_peer_drop(ecx_data_peer *p);

/* Post a READ of the peer's blocks remote[i] into our blocks local[i],
 * i < n; when it is done, notif (notif_len bytes, at most
 * ECX_DATA_NOTIF_MAX) is sent to the producer. Runs of consecutive blocks
 * on both sides move as one operation. nbytes is the encoding's size: the
 * bytes run through the blocks in list order, so only the first
 * nbytes - (n-1) * block_bytes bytes of the last block move; 0 means all
 * n whole blocks. Errors: ECX_EDATA_COUNT (n == 0, or nbytes not in
 * ((n-1) * block_bytes, n * block_bytes]), ECX_EDATA_INDEX (an index beyond
 * either side's block count), ECX_EDATA_NOTIF (notification empty or too
 * long), ECX_EDATA_PEER (peer broken), ECX_ENOMEM, ECX_EDATA_UCX. */
int ecx_data_read_post(ecx_data_peer *p, const uint64_t *remote, const uint64_t *local, size_t n,
                       uint64_t nbytes, const char *notif, size_t notif_len, ecx_data_xfer **out);

/* enum ecx_xfer_state. Cheap; call ecx_data_progress() to move things on. */
int ecx_data_read_poll(ecx_data_xfer *x);

/* Give the xfer back. A READ still running is cancelled; its memory may be
 * written until the backend confirms (at the latest when its peer is
 * dropped). NULL is a no-op. */
void ecx_data_read_release(ecx_data_xfer *x);

/* ---- both -------------------------------------------------------------- */

/* Advance everything; returns how many events it handled (>= 0) or a
 * negative error. Never blocks. */
int ecx_data_progress(ecx_data *d);

/* A descriptor that becomes readable when progress may have work, or -1
 * if the context has none (then poll it on a timer). */
int ecx_data_fd(ecx_data *d);

/* Prepare to sleep on ecx_data_fd(): 0 = safe to sleep, 1 = work is
 * already pending (progress again first), negative = error. */
int ecx_data_arm(ecx_data *d);

/* Backend actually in use: "auto", "shm", "ucx", "fault". */
const char *ecx_data_name(const ecx_data *d);

void ecx_data_free(ecx_data *d);

#endif

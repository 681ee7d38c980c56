/* SPDX-License-Identifier: Apache-2.0 */
/* metrics — Prometheus text rendering of the counters; see metrics.h. */
#include "metrics.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef struct out {
    char *buf;
    size_t cap, len;
    bool full;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Once the text outgrows the buffer, lines are only counted, so the caller
 * learns the length it needs. */
static void put(out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = o->full ? vsnprintf(NULL, 0, fmt, ap)
                    : vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if (!o->full && (size_t)n >= o->cap - o->len) o->full = true;
    o->len += (size_t)n;
}

static void counter(out *o, const char *name, const char *help, unsigned long long v)
{
    put(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, v);
}

static void gauge(out *o, const char *name, const char *help, unsigned long long v)
{
    put(o, "# HELP %s %s\n# TYPE %s gauge\n%s %llu\n", name, help, name, name, v);
}

static void producer(out *o, const ecxi_producer_stats *p, const ecxi_ctrl_stats *c,
                     const ecxi_data_stats *d)
{
    counter(o, "ecx_producer_requests_total", "XferReq frames received.", p->requests);
    counter(o, "ecx_producer_malformed_total", "Requests dropped because they did not decode.",
            p->malformed);
    counter(o, "ecx_producer_bad_framing_total", "Messages dropped for their ZeroMQ framing.",
            c ? c->bad_framing : 0);
    counter(o, "ecx_producer_auth_failures_total",
            "CURVE handshakes refused: client key not in the allow-list.",
            c ? c->auth_failures : 0);
    counter(o, "ecx_producer_pending_drops_total",
            "Connections shut down for holding too many bytes of unfinished messages.",
            c ? c->pending_drops : 0);
    counter(o, "ecx_producer_refused_connections_total",
            "Control connections refused: a connection cap, and nobody holds more than the "
            "peer's address or prefix.",
            c ? c->refused_conns : 0);
    counter(o, "ecx_producer_evicted_connections_total",
            "Control connections closed (the heaviest peer's idlest) to make room for a "
            "newcomer.",
            c ? c->evicted_conns : 0);
    counter(o, "ecx_producer_accept_failures_total", "Connections that could not be accepted.",
            c ? c->accept_failed : 0);
    counter(o, "ecx_producer_grants_total", "OK acks: entries pinned for a consumer.", p->grants);
    put(o, "# HELP ecx_producer_nacks_total NACKs sent, by status.\n"
           "# TYPE ecx_producer_nacks_total counter\n");
    for (int s = 1; s <= ECX_STATUS_MAX; s++)
        put(o, "ecx_producer_nacks_total{status=\"%s\"} %llu\n", ecx_status_name(s),
            (unsigned long long)p->nacks[s]);
    counter(o, "ecx_producer_regrants_total", "Repeated requests that replaced a grant.",
            p->regrants);
    gauge(o, "ecx_producer_active_grants", "Grants holding a pin now.", p->active_grants);
    counter(o, "ecx_producer_expired_leases_total", "Grants unpinned because the lease expired.",
            p->expired_leases);
    counter(o, "ecx_producer_completions_total", "Completion notifications that released a grant.",
            p->completions);
    counter(o, "ecx_producer_unknown_notifications_total",
            "Completion notifications that matched no grant.", p->unknown_notifs);
    counter(o, "ecx_producer_forged_notifications_total",
            "Completion notifications for a grant with a wrong token (nothing released).",
            p->forged_notifs);
    counter(o, "ecx_producer_foreign_requests_total",
            "Requests refused: the grant is held by another connection.", p->foreign_requests);
    counter(o, "ecx_producer_refused_reads_total",
            "Data-plane requests refused: no live grant, wrong token, or already served.",
            p->refused_reads);
    counter(o, "ecx_producer_send_failed_total", "Grants whose bytes could not be sent.",
            p->send_failed);
    counter(o, "ecx_producer_bytes_served_total", "Bytes of completed transfers.",
            p->bytes_served);
    counter(o, "ecx_producer_reply_failed_total", "Acks that could not be sent.", p->reply_failed);
    if (d) {
        static const struct {
            const char *name, *help;
            size_t off;
        } dc[] = {
            {"ecx_producer_data_connections_refused_total",
             "Data-plane connections refused at a bound or for their uid, by path.",
             offsetof(ecxi_data_counts, conns_refused)},
            {"ecx_producer_data_connections_evicted_total",
             "Data-plane connections closed to make room for a newcomer from a lighter "
             "address, by path.",
             offsetof(ecxi_data_counts, conns_evicted)},
            {"ecx_producer_data_connections_dropped_total",
             "Data-plane connections closed for garbage, silence or a stalled send, by path.",
             offsetof(ecxi_data_counts, conns_dropped)},
            {"ecx_producer_data_requests_dropped_total",
             "Data-plane requests dropped: malformed, or past a queue bound, by path.",
             offsetof(ecxi_data_counts, requests_dropped)},
        };
        static const int paths[] = {ECX_DATA_SHM, ECX_DATA_TCP, ECX_DATA_UCX};
        for (size_t k = 0; k < sizeof dc / sizeof *dc; k++) {
            put(o, "# HELP %s %s\n# TYPE %s counter\n", dc[k].name, dc[k].help, dc[k].name);
            for (size_t j = 0; j < sizeof paths / sizeof *paths; j++) {
                uint64_t v;
                memcpy(&v, (const char *)&d->path[paths[j]] + dc[k].off, sizeof v);
                put(o, "%s{path=\"%s\"} %llu\n", dc[k].name, ecxi_data_backend_name(paths[j]),
                    (unsigned long long)v);
            }
        }
    }
    counter(o, "ecx_producer_refused_conn_grants_total",
            "Requests refused: the connection held its cap of grants, or its share of a full "
            "table.",
            p->refused_conn_grants);
    counter(o, "ecx_producer_refused_conn_pins_total",
            "Requests refused: the connection's pins would pass its share of the region.",
            p->refused_conn_pins);
    counter(o, "ecx_producer_refused_pins_total",
            "Requests answered NOT_READY: pins in all would pass max_pin_pct of the region.",
            p->refused_pins);
    counter(o, "ecx_producer_cut_sends_total",
            "Grants let go (lease, replacement, completion) while their send ran: the send "
            "was cut before the unpin.",
            p->cut_sends);
    gauge(o, "ecx_producer_draining_grants",
          "Grants whose cut send has not ended yet (their blocks stay pinned).",
          p->draining_grants);
    counter(o, "ecx_producer_evicted_grants_total",
            "Grants released from the heaviest connection to make room in a full table.",
            p->evicted_grants);
    counter(o, "ecx_producer_nixl_grants_total",
            "OK acks in NIXL's form (--data nixl, to a session id without ecx's marker).",
            p->nixl_grants);
}

static void consumer(out *o, const ecxi_consumer_stats *c)
{
    put(o, "# HELP ecx_consumer_fetches_total Items answered, by outcome (ready, or the reason "
           "for encoding locally).\n# TYPE ecx_consumer_fetches_total counter\n");
    put(o, "ecx_consumer_fetches_total{outcome=\"ready\"} %llu\n", (unsigned long long)c->ready);
    for (int r = 1; r < ECX_REASON_COUNT; r++)
        put(o, "ecx_consumer_fetches_total{outcome=\"%s\"} %llu\n", ecx_reason_name(r),
            (unsigned long long)c->fallbacks[r]);
    counter(o, "ecx_consumer_requests_total", "XferReqs sent.", c->requests);
    counter(o, "ecx_consumer_retries_total", "Requests repeated after NOT_READY or a lost peer.",
            c->retries);
    counter(o, "ecx_consumer_quarantines_total", "READs that overran their deadline.",
            c->quarantines);
    counter(o, "ecx_consumer_settled_total", "Quarantined transfers whose blocks came back.",
            c->settled);
    counter(o, "ecx_consumer_bytes_total", "Bytes fetched.", c->bytes);
    counter(o, "ecx_consumer_stale_acks_total", "Acks for no waiting transfer.", c->stale_acks);
    counter(o, "ecx_consumer_malformed_acks_total", "Acks dropped because they did not decode.",
            c->malformed_acks);
    counter(o, "ecx_consumer_peer_restarts_total", "Producers seen restarting (new metadata).",
            c->peer_restarts);
    counter(o, "ecx_consumer_relayed_registrations_total",
            "OK acks refused (BAD_ACK): their data-plane registration is another producer "
            "session's.",
            c->relayed_registrations);
    counter(o, "ecx_consumer_peers_lost_total", "Producer connections lost.", c->peers_lost);
    counter(o, "ecx_consumer_ack_floods_total",
            "Producer sessions closed for sending more acks than requests.", c->ack_floods);
    gauge(o, "ecx_consumer_sessions_open", "Producer sessions (sockets) open.", c->sessions_open);
    counter(o, "ecx_consumer_sessions_idle_closed_total",
            "Sessions closed after the idle timeout with no transfer waiting, reading or "
            "quarantined.",
            c->sessions_idle_closed);
    counter(o, "ecx_consumer_sessions_evicted_total",
            "Idle sessions closed early to make room at the session cap.", c->sessions_evicted);
    counter(o, "ecx_consumer_sessions_unreached_total",
            "Sessions closed at the session cap because no handshake completed in time "
            "(their waiting items fell back: ACK_TIMEOUT).",
            c->sessions_unreached);
    counter(o, "ecx_consumer_session_cap_waits_total",
            "Times an item waited for a session: cap reached and every session busy.",
            c->session_cap_waits);
    counter(o, "ecx_consumer_session_cap_refusals_total",
            "Items that fell back (SEND_FAILED): no session free within the cap wait.",
            c->session_cap_refusals);
    gauge(o, "ecx_consumer_in_flight", "Transfers not yet settled.", c->in_flight);
    put(o, "# HELP ecx_consumer_transfers Transfers by state.\n"
           "# TYPE ecx_consumer_transfers gauge\n");
    put(o, "ecx_consumer_transfers{state=\"waiting_ack\"} %llu\n",
        (unsigned long long)c->waiting_ack);
    put(o, "ecx_consumer_transfers{state=\"reading\"} %llu\n", (unsigned long long)c->reading);
    put(o, "ecx_consumer_transfers{state=\"retrying\"} %llu\n", (unsigned long long)c->retrying);
    put(o, "ecx_consumer_transfers{state=\"quarantined\"} %llu\n",
        (unsigned long long)c->quarantined);
    put(o, "ecx_consumer_transfers{state=\"tombstone\"} %llu\n", (unsigned long long)c->tombstones);
    put(o, "# HELP ecx_consumer_fetch_latency_seconds Time from first request to the bytes in "
           "place.\n# TYPE ecx_consumer_fetch_latency_seconds histogram\n");
    unsigned long long cum = 0;
    for (int b = 0; b < ECXI_LATENCY_BUCKETS; b++) {
        cum += c->latency_count[b];
        if (b < ECXI_LATENCY_BUCKETS - 1)
            put(o, "ecx_consumer_fetch_latency_seconds_bucket{le=\"%g\"} %llu\n",
                ecxi_latency_bounds_ms[b] / 1000.0, cum);
        else
            put(o, "ecx_consumer_fetch_latency_seconds_bucket{le=\"+Inf\"} %llu\n", cum);
    }
    put(o, "ecx_consumer_fetch_latency_seconds_sum %.6f\n", c->latency_sum_ms / 1000.0);
    put(o, "ecx_consumer_fetch_latency_seconds_count %llu\n", cum);
}

static void cache(out *o, const ecxi_cache_stats *c, unsigned long long block_bytes)
{
    gauge(o, "ecx_region_block_bytes", "Size of one block.", block_bytes);
    put(o, "# HELP ecx_region_blocks Blocks of the region, by state.\n"
           "# TYPE ecx_region_blocks gauge\n");
    /* Four disjoint states: free; not ready (being written or fetched);
     * ready and evictable; ready and pinned (granted or being loaded). */
    put(o, "ecx_region_blocks{state=\"free\"} %llu\n", (unsigned long long)c->free_blocks);
    put(o, "ecx_region_blocks{state=\"not_ready\"} %llu\n",
        (unsigned long long)c->not_ready_blocks);
    put(o, "ecx_region_blocks{state=\"ready\"} %llu\n", (unsigned long long)c->evictable_blocks);
    put(o, "ecx_region_blocks{state=\"pinned\"} %llu\n",
        (unsigned long long)(c->owned_blocks - c->not_ready_blocks - c->evictable_blocks));
    /* Three disjoint states, as the blocks': not ready (pinned or not); ready
     * and evictable; ready and pinned. */
    put(o, "# HELP ecx_cache_entries Entries, by state (disjoint).\n"
           "# TYPE ecx_cache_entries gauge\n");
    put(o, "ecx_cache_entries{state=\"not_ready\"} %llu\n", (unsigned long long)c->not_ready);
    put(o, "ecx_cache_entries{state=\"ready\"} %llu\n", (unsigned long long)c->evictable);
    put(o, "ecx_cache_entries{state=\"pinned\"} %llu\n",
        (unsigned long long)(c->ready - c->evictable));
    counter(o, "ecx_cache_evictions_total", "Entries evicted to make room.", c->evictions);
    counter(o, "ecx_cache_evicted_by_engine_total", "Ready entries the engine removed (ecx_evict).",
            c->dropped);
    counter(o, "ecx_cache_reserve_full_total", "Reservations refused for lack of room.",
            c->reserve_full);
}

static void events(out *o, const ecxi_events_stats *e)
{
    counter(o, "ecx_events_batches_total", "Event batches published (docs/EVENTS.md).",
            e->batches);
    counter(o, "ecx_events_total", "Events published.", e->events);
    counter(o, "ecx_events_hwm_drops_total",
            "Batches a subscriber missed at its high-water mark (it recovers them by replay).",
            e->hwm_drops);
    counter(o, "ecx_events_lost_total",
            "Events dropped before publishing (pending bound; subscribers resync).", e->lost);
    counter(o, "ecx_events_replays_total", "Replay requests answered.", e->replays);
    counter(o, "ecx_events_resyncs_total", "Replay requests older than the ring (told to resync).",
            e->resyncs);
    counter(o, "ecx_events_snapshots_total", "Snapshot requests answered.", e->snapshots);
    counter(o, "ecx_events_bad_requests_total", "Malformed replay requests.", e->bad_requests);
    counter(o, "ecx_events_replies_truncated_total",
            "Replay replies cut at the asker's high-water mark.", e->reply_truncated);
    gauge(o, "ecx_events_held_items", "Items the events say are held (a snapshot's size).",
          e->held);
}

int ecxi_metrics_render(const ecxi_metrics_src *m, char *buf, size_t cap, size_t *len)
{
    out o = {buf, cap, 0, cap == 0};
    if (m->info_labels)
        put(&o, "# HELP ecx_info What this context is: the compatibility factors, their hash "
                "and the protocol version (peers must agree on all).\n# TYPE ecx_info gauge\n"
                "ecx_info{%s} 1\n", m->info_labels);
    if (m->producer) producer(&o, m->producer, m->ctrl, m->data);
    if (m->consumer) consumer(&o, m->consumer);
    if (m->cache) cache(&o, m->cache, m->block_bytes);
    gauge(&o, "ecx_region_bytes", "Size of the shared-memory region.", m->region_bytes);
    gauge(&o, "ecx_region_backed_bytes",
          "Bytes of the region allocated and faulted in so far, by the background fault-in "
          "and by reservations; the region's size once all are (ECX_PREFAULT).",
          m->region_backed_bytes);
    if (m->events) events(&o, m->events);
    counter(&o, "ecx_nixl_agent_restarts_total",
            "NIXL agent processes started again after one died (--data nixl; docs/NIXL.md §5).",
            m->nixl_agent_restarts);
    counter(&o, "ecx_ucx_agent_restarts_total",
            "UCX processes started again after one died (--data ucx; src/data/ucx/ucx_proc.h).",
            m->ucx_agent_restarts);
    *len = o.len;
    if (!o.full) return 0;
    if (cap) buf[0] = '\0'; /* never a truncated text */
    return ECX_ERANGE;
}

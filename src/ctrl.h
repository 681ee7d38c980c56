/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctrl — the control plane's sockets: one ROUTER per producer, one DEALER
 * per (consumer, producer) pair, and nothing else. It owns framing,
 * liveness and the bounds on what a peer can make us hold (frames,
 * unfinished messages, connections), not meaning: payloads go up as views
 * into zmq messages, so nothing is allocated per request. Threads: a
 * watchdog for DEALERs' inflow (libzmq reads while the application is
 * busy). The rules, bounds and CURVE: docs/PROTOCOL.md §3.8, the DEALER's
 * socket options and re-dial §5.4, the constants §7.
 */
#ifndef ECXI_CTRL_H
#define ECXI_CTRL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

/* Heartbeats are the control plane's own (no ecx_config knob, so no
 * ECX_DEFAULT_* in ecx.h): a DEALER pings every IVL ms, gives up on a peer
 * silent for TIMEOUT ms, and asks the other end to give up after TTL ms. */
#define ECXI_CTRL_HEARTBEAT_IVL_MS 2000
#define ECXI_CTRL_HEARTBEAT_TIMEOUT_MS 4000
#define ECXI_CTRL_HEARTBEAT_TTL_MS 8000

/* Socket options both ends share; zero fields take the defaults of docs/PROTOCOL.md §7. */
typedef struct ecxi_ctrl_opts {
    int64_t max_frame_bytes;  /* inbound frame cap; default ECXI_CTRL_MAX_REQUEST (server),
                                 ECXI_CTRL_MAX_FRAME (peer) */
    int heartbeat_ivl_ms;     /* DEALER only; default ECXI_CTRL_HEARTBEAT_IVL_MS */
    int heartbeat_timeout_ms; /* default ECXI_CTRL_HEARTBEAT_TIMEOUT_MS */
    int heartbeat_ttl_ms;     /* default ECXI_CTRL_HEARTBEAT_TTL_MS */
    int64_t max_pending_bytes; /* per connection, bytes of unfinished messages; default
                                  twice the frame cap */
    int64_t max_pending_total; /* all connections of the socket; ECXI_CTRL_MAX_PENDING_TOTAL */
    int max_connections;       /* server only; default the soft fd limit less
                                  ECXI_CTRL_FD_RESERVE */
    /* CURVE; all NULL: plaintext, byte for byte as without these fields. */
    const char *curve_secret_key;   /* server: its secret key (turns CURVE on); peer: its own
                                       secret key (NULL: a fresh keypair per socket) */
    const char *curve_server_key;   /* peer: the server's public key (turns CURVE on) */
    const char *const *curve_allow; /* server: client public keys let in; 0 of them: any */
    size_t n_curve_allow;
} ecxi_ctrl_opts;

/* Length of a Z85 CURVE key, without NUL. */
#define ECXI_CTRL_KEY_Z85 40

/* Check a Z85 key (exactly 40 Z85 characters) and decode it into out
 * (may be NULL). Returns 0 or ECX_EINVAL. */
int ecxi_ctrl_key_parse(const char *z85, uint8_t out[32]);

/* Default inbound frame caps. A request is a few hundred bytes: 1 MiB
 * leaves room. An ack from the Python reference carries ~14 B per block of
 * the producer's region (≈0.85 MB for 2 GB), so 16 MiB leaves room and
 * still bounds memory. */
#define ECXI_CTRL_MAX_REQUEST (1 << 20)
#define ECXI_CTRL_MAX_FRAME (16 << 20)
/* Default bounds of unfinished messages: two full frames per connection,
 * 256 MiB for all connections of one socket; checked every 20 ms (one
 * getsockopt per connection). */
#define ECXI_CTRL_MAX_PENDING_TOTAL (256 << 20)
#define ECXI_CTRL_GUARD_IVL_MS 20
/* A connection that has not finished its ZMTP (or CURVE) handshake this
 * long after it was accepted is closed: a handshake takes a few round
 * trips, and connections that never speak must not hold the connection cap
 * (libzmq's default is 30 s). */
#define ECXI_CTRL_HANDSHAKE_MS 2000
/* The server takes monitor events and CURVE handshakes whenever its socket
 * runs dry (so a poll woken by the monitor or the guard's timer takes them)
 * and at least once per this many requests received in between. */
#define ECXI_CTRL_EVENTS_EVERY 64
/* A DEALER that has not completed a handshake dials again this long after
 * a failed attempt, doubling up to the max (ctrl.c). */
#define ECXI_CTRL_REDIAL_MIN_MS 100
#define ECXI_CTRL_REDIAL_MAX_MS 5000
/* A TCP connection to a producer that has not completed the ZeroMQ
 * handshake this long after it connected: the peer sent no ZeroMQ
 * greeting (an HTTP server, a metrics port, a silent TCP server); a
 * ZeroMQ peer's I/O thread answers in a round trip, whatever its
 * application does. */
#define ECXI_CTRL_GREETING_MS 1000
/* Requests a DEALER keeps copies of until its first handshake, to send
 * again after a re-dial (beyond it, the rest go with the failed attempt). */
#define ECXI_CTRL_UNSENT_MAX 256
/* Badly framed replies one ecxi_ctrl_peer_recv() call drops at most. */
#define ECXI_CTRL_BAD_PER_RECV 64
/* File descriptors the default connection cap leaves for everything else,
 * and for the data plane (the tcp and shm paths' connection caps). */
#define ECXI_CTRL_FD_RESERVE 64
#define ECXI_CTRL_DATA_FD_RESERVE 512
/* Connections the server holds from one address, and from one /24 (IPv4)
 * or /64 (IPv6). A newcomer at any cap takes the slot of the heaviest
 * holder's idlest connection (never a message first, then the longest
 * without one), if that holder has more than the newcomer's address or
 * prefix; else it is refused (conn_budget.h). */
#define ECXI_CTRL_MAX_PER_ADDR 64
#define ECXI_CTRL_MAX_PER_PREFIX 256

/* Counters of what ctrl dropped, for metrics. */
typedef struct ecxi_ctrl_stats {
    uint64_t bad_framing;      /* messages with the wrong number or shape of frames */
    uint64_t send_failed;      /* replies that could not be queued (peer gone, HWM) */
    uint64_t auth_failures;    /* server: CURVE clients the ZAP handler turned away */
    uint64_t handshake_failed; /* peer: connections dropped before the handshake ended */
    uint64_t pending_drops;    /* connections shut down for unfinished messages over the bounds */
    uint64_t refused_conns;    /* server: connections refused at a cap (conn_budget.h) */
    uint64_t evicted_conns;    /* server: connections closed to make room for a newcomer */
    uint64_t accept_failed;    /* server: accepts that failed (fd limit) */
} ecxi_ctrl_stats;

/* Split "HOST:PORT" / "[V6]:PORT" into host (no brackets) and port.
 * Returns 0 or ECX_EINVAL. host must hold at least 256 bytes. */
int ecxi_ctrl_parse_addr(const char *addr, char host[256], int *port);

/* ---------- producer: ROUTER ---------- */

typedef struct ecxi_ctrl_server ecxi_ctrl_server;

/* One received request: the asker's identity and the payload, valid until
 * the next receive into the same msg or ecxi_ctrl_msg_fini(). One msg is
 * reused for every receive, so nothing is allocated per request. */
typedef struct ecxi_ctrl_msg {
    zmq_msg_t parts[3];
    const void *identity;
    size_t identity_len;
    const void *payload;
    size_t payload_len;
} ecxi_ctrl_msg;

/* Bind a ROUTER on host:port (port 0 picks a free one). With
 * opts->curve_allow, the context's ZAP endpoint is bound too: one such
 * server per ZeroMQ context (ECX_ESYS otherwise). Bad keys: ECX_EINVAL. */
int ecxi_ctrl_server_new(void *zctx, const char *host, int port, const ecxi_ctrl_opts *opts,
                        ecxi_ctrl_server **out);
void ecxi_ctrl_server_free(ecxi_ctrl_server *s);
/* The port actually bound. */
int ecxi_ctrl_server_port(const ecxi_ctrl_server *s);
/* Receive one well-framed request without blocking: 1 got one, 0 none
 * waiting. Badly framed messages are drained, counted and skipped. Pending
 * ZAP requests are answered and monitor events taken (connection cap,
 * guard) when no request is waiting, and every ECXI_CTRL_EVENTS_EVERY
 * calls in between. */
int ecxi_ctrl_server_recv(ecxi_ctrl_server *s, ecxi_ctrl_msg *m);
void ecxi_ctrl_msg_init(ecxi_ctrl_msg *m);
void ecxi_ctrl_msg_fini(ecxi_ctrl_msg *m);
/* Reply to the sender of m, which ecxi_ctrl_server_recv() filled: its own
 * identity and delimiter frames go back as they are (moved, not copied:
 * m->identity is not valid afterwards; m->payload still is), then payload.
 * Never blocks; 0 or ECX_ESYS (counted). */
int ecxi_ctrl_server_reply(ecxi_ctrl_server *s, ecxi_ctrl_msg *m, const void *payload, size_t len);
/* Reply [identity, "", payload]. Never blocks; 0 or ECX_ESYS (counted). */
int ecxi_ctrl_server_send(ecxi_ctrl_server *s, const void *identity, size_t identity_len,
                         const void *payload, size_t len);
void *ecxi_ctrl_server_socket(const ecxi_ctrl_server *s); /* for zmq_poll */
/* The ZAP handler's socket, for zmq_poll beside the ROUTER; NULL if none. */
void *ecxi_ctrl_server_zap_socket(const ecxi_ctrl_server *s);

/* A waiter must also wake for the inflow guard: on its monitor socket (a
 * connection opened or closed) and, while a connection is open, every
 * ECXI_CTRL_GUARD_IVL_MS (a message still arriving wakes nobody). The
 * timeouts are in ms, -1 when nothing is open. */
void *ecxi_ctrl_server_monitor_socket(const ecxi_ctrl_server *s);
int64_t ecxi_ctrl_server_next_timeout(const ecxi_ctrl_server *s);
/* Answer pending ZAP requests; returns how many were answered. */
int ecxi_ctrl_server_serve_zap(ecxi_ctrl_server *s);
ecxi_ctrl_stats ecxi_ctrl_server_stats(const ecxi_ctrl_server *s);

/* ---------- consumer: DEALER to one producer ---------- */

typedef struct ecxi_ctrl_peer ecxi_ctrl_peer;

/* Bad CURVE keys in opts: ECX_EINVAL. */
int ecxi_ctrl_peer_new(void *zctx, const char *host, int port, const ecxi_ctrl_opts *opts,
                      ecxi_ctrl_peer **out);
void ecxi_ctrl_peer_free(ecxi_ctrl_peer *p);
/* Send ["", payload] without blocking: 0, or ECX_ESYS if it cannot be queued. */
int ecxi_ctrl_peer_send(ecxi_ctrl_peer *p, const void *payload, size_t len);
/* Receive one ["", payload] reply without blocking: 1 got one (view valid
 * until the next call or ecxi_ctrl_peer_free), 0 none waiting, or
 * ECXI_CTRL_BAD_PER_RECV badly framed ones dropped (counted in bad_framing;
 * more may wait), so a flood of them cannot hold the caller. */
int ecxi_ctrl_peer_recv(ecxi_ctrl_peer *p, const void **payload, size_t *len);
/* True once the connection to the producer was lost (disconnect seen by the
 * monitor after a completed handshake, which includes a heartbeat
 * timeout). A connection refused in its handshake is not lost: the
 * request just goes unanswered. Sticky. */
bool ecxi_ctrl_peer_lost(ecxi_ctrl_peer *p);
/* True once a ZMTP (or CURVE) handshake with the producer has completed. */
bool ecxi_ctrl_peer_handshaken(ecxi_ctrl_peer *p);
/* True if the last TCP connect failed at once (the socket monitor's CLOSED
 * before CONNECTED: refused, nothing listening) and none has succeeded
 * since. ctrl still dials again with its backoff. */
bool ecxi_ctrl_peer_refused(ecxi_ctrl_peer *p);
/* True if the last dial's TCP connection has been up ECXI_CTRL_GREETING_MS
 * without a ZMTP handshake (and no handshake ever completed): not a
 * ZeroMQ peer. ecxi_ctrl_peer_next_timeout() includes that moment. */
bool ecxi_ctrl_peer_silent(ecxi_ctrl_peer *p);
/* True if the peer closed a connection before any ZMTP handshake with it
 * completed: CURVE keys or modes differ (one side encrypts, the server key
 * is wrong, the client is not in the allow-list), an ecx producer refused
 * it at its connection cap, or it is not a ZeroMQ peer and hung up on our
 * greeting. ctrl still dials again. */
bool ecxi_ctrl_peer_hung_up(ecxi_ctrl_peer *p);
void *ecxi_ctrl_peer_socket(const ecxi_ctrl_peer *p); /* for zmq_poll */
/* The peer's inflow guard, as for the server above. */
void *ecxi_ctrl_peer_monitor_socket(const ecxi_ctrl_peer *p);
int64_t ecxi_ctrl_peer_next_timeout(const ecxi_ctrl_peer *p);
ecxi_ctrl_stats ecxi_ctrl_peer_stats(const ecxi_ctrl_peer *p);

#endif

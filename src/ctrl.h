/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctrl — the control plane's sockets (docs/PROTOCOL.md §3, §5): one ROUTER per producer,
 * one DEALER per (consumer, producer) pair, and nothing else.
 *
 * It owns framing and liveness, not meaning: the producer's ROUTER accepts
 * exactly [identity, "", payload] and drops (and counts) any other framing;
 * the consumer's DEALER sends ["", payload] and accepts exactly ["", payload]
 * back. Payloads are handed up as views into zmq messages, so nothing is
 * allocated per request.
 *
 * Memory a peer can make us hold is bounded per connection and in total.
 * Every socket caps inbound frame size (ZMQ_MAXMSGSIZE; libzmq drops the
 * connection on a bigger frame). That alone bounds nothing: libzmq buffers
 * the frames of a multipart message until its last one arrives, however
 * many there are, and no socket option limits that. So ctrl watches each
 * TCP connection (socket monitor for its fd, TCP_INFO for the bytes that
 * arrived, ZMQ_SRCFD for the whole messages read from it; TCP_INFO is read
 * at a whole message only every eighth of max_pending_bytes of them,
 * ctrl.c "the inflow guard") and shuts down a
 * connection holding more than max_pending_bytes not yet delivered as whole
 * messages, and the heaviest one while all together hold more than
 * max_pending_total; it looks every ECX_CTRL_GUARD_IVL_MS, in the receive
 * calls and, for DEALERs, on a watchdog thread too (libzmq reads while the
 * application is busy elsewhere). A connection that only sends heartbeats counts them as undelivered
 * too (a PING is 9 bytes every 2 s, ~390 KB a day): an idle connection
 * reaches the producer's 2 MiB cap after about five days and is dropped
 * and reconnected; ecx consumers close sessions idle for 30 s long
 * before. The server also budgets connections (the monitor's accepted fd,
 * getpeername): max_connections in all, ECX_CTRL_MAX_PER_PREFIX per /24 or
 * /64, ECX_CTRL_MAX_PER_ADDR per address; a newcomer at a cap shuts down
 * the idlest connection of a heavier holder, or is itself shut down
 * (conn_budget.h). The default total leaves descriptors to the data plane,
 * and libzmq does not spin on a failed accept at the fd limit. All of it is
 * counted in ecxi_ctrl_stats.
 *
 * DEALERs carry ZMQ heartbeats
 * (2000 / 4000 / 8000 ms) and a socket monitor, so a dead producer shows up
 * as a disconnect event the consumer session can act on. They have no
 * receive HWM: libzmq 4.3.4 can abort on a connection that stopped reading
 * (ctrl.c, "a DEALER never stops reading").
 *
 * Addresses are "HOST:PORT" with HOST an IPv4 or IPv6 address ([::1] or
 * ::1), or a host name. Binding resolves names here (libzmq binds only to
 * numeric addresses and interfaces); connecting leaves the name to libzmq,
 * which resolves it on its own I/O thread, so the caller never blocks on DNS.
 *
 * Authentication (opt-in, docs/PROTOCOL.md §8): with CURVE keys in the options the
 * ROUTER is a ZeroMQ CURVE server and every DEALER a CURVE client, so the
 * control plane is encrypted and the consumer knows it talks to the key it
 * was given; the frames inside are the same bytes as in plaintext. Clients
 * are checked against an allow-list by a ZAP handler: a REP socket on
 * inproc://zeromq.zap.01 that the server owns and answers from
 * ecxi_ctrl_server_recv() — no thread; put ecxi_ctrl_server_zap_socket() in
 * the zmq_poll set so handshakes finish promptly. Without an allow-list any
 * client that knows the server's public key gets in. A failed handshake
 * (wrong server key, client not allowed, plaintext against CURVE) drops the
 * connection before any request passes; a DEALER does not report that as
 * lost (lost means a producer that completed a handshake went away) but
 * counts it, and ctrl dials again (DEALERs do not reconnect through libzmq:
 * ctrl.c, "peer"), so the consumer's request goes
 * unanswered and times out, as with an unreachable producer. Keys are Z85
 * text, 40 characters, as zmq_curve_keypair makes.
 */
#ifndef ECX_CTRL_H
#define ECX_CTRL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

/* Socket options both ends share; zero fields take the defaults of docs/PROTOCOL.md §7. */
typedef struct ecxi_ctrl_opts {
    int64_t max_frame_bytes;  /* inbound frame cap; default ECX_CTRL_MAX_REQUEST (server),
                                 ECX_CTRL_MAX_FRAME (peer) */
    /* Heartbeats are the control plane's own (no ecx_config knob, so no
     * ECX_DEFAULT_* in ecx.h); their defaults live in ctrl.c. */
    int heartbeat_ivl_ms;     /* DEALER only; default 2000 */
    int heartbeat_timeout_ms; /* default 4000 */
    int heartbeat_ttl_ms;     /* default 8000 */
    int64_t max_pending_bytes; /* per connection, bytes of unfinished messages; default
                                  twice the frame cap */
    int64_t max_pending_total; /* all connections of the socket; ECX_CTRL_MAX_PENDING_TOTAL */
    int max_connections;       /* server only; default the soft fd limit less
                                  ECX_CTRL_FD_RESERVE */
    /* CURVE; all NULL: plaintext, byte for byte as without these fields. */
    const char *curve_secret_key;   /* server: its secret key (turns CURVE on); peer: its own
                                       secret key (NULL: a fresh keypair per socket) */
    const char *curve_server_key;   /* peer: the server's public key (turns CURVE on) */
    const char *const *curve_allow; /* server: client public keys let in; 0 of them: any */
    size_t n_curve_allow;
} ecxi_ctrl_opts;

/* Length of a Z85 CURVE key, without NUL. */
#define ECX_CTRL_KEY_Z85 40

/* Check a Z85 key (exactly 40 Z85 characters) and decode it into out
 * (may be NULL). Returns 0 or ECX_EINVAL. */
int ecxi_ctrl_key_parse(const char *z85, uint8_t out[32]);

/* Default inbound frame caps. A request is a few hundred bytes: 1 MiB
 * leaves room. An ack from the Python reference carries ~14 B per block of
 * the producer's region (≈0.85 MB for 2 GB), so 16 MiB leaves room and
 * still bounds memory. */
#define ECX_CTRL_MAX_REQUEST (1 << 20)
#define ECX_CTRL_MAX_FRAME (16 << 20)
/* Default bounds of unfinished messages: two full frames per connection,
 * 256 MiB for all connections of one socket; checked every 20 ms (one
 * getsockopt per connection). */
#define ECX_CTRL_MAX_PENDING_TOTAL (256 << 20)
#define ECX_CTRL_GUARD_IVL_MS 20
/* A connection that has not finished its ZMTP (or CURVE) handshake this
 * long after it was accepted is closed: a handshake takes a few round
 * trips, and connections that never speak must not hold the connection cap
 * (libzmq's default is 30 s). */
#define ECX_CTRL_HANDSHAKE_MS 2000
/* The server takes monitor events and CURVE handshakes whenever its socket
 * runs dry (so a poll woken by the monitor or the guard's timer takes them)
 * and at least once per this many requests received in between. */
#define ECX_CTRL_EVENTS_EVERY 64
/* A DEALER that has not completed a handshake dials again this long after
 * a failed attempt, doubling up to the max (ctrl.c). */
#define ECX_CTRL_REDIAL_MIN_MS 100
#define ECX_CTRL_REDIAL_MAX_MS 5000
/* Requests a DEALER keeps copies of until its first handshake, to send
 * again after a re-dial (beyond it, the rest go with the failed attempt). */
#define ECX_CTRL_UNSENT_MAX 256
/* Badly framed replies one ecxi_ctrl_peer_recv() call drops at most. */
#define ECX_CTRL_BAD_PER_RECV 64
/* File descriptors the default connection cap leaves for everything else,
 * and for the data plane (the tcp and shm paths' connection caps). */
#define ECX_CTRL_FD_RESERVE 64
#define ECX_CTRL_DATA_FD_RESERVE 512
/* Connections the server holds from one address, and from one /24 (IPv4)
 * or /64 (IPv6). A newcomer at any cap takes the slot of the heaviest
 * holder's idlest connection (never a message first, then the longest
 * without one), if that holder has more than the newcomer's address or
 * prefix; else it is refused (conn_budget.h). */
#define ECX_CTRL_MAX_PER_ADDR 64
#define ECX_CTRL_MAX_PER_PREFIX 256

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
 * guard) when no request is waiting, and every ECX_CTRL_EVENTS_EVERY
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
 * ECX_CTRL_GUARD_IVL_MS (a message still arriving wakes nobody). The
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
 * ECX_CTRL_BAD_PER_RECV badly framed ones dropped (counted in bad_framing;
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
void *ecxi_ctrl_peer_socket(const ecxi_ctrl_peer *p); /* for zmq_poll */
/* The peer's inflow guard, as for the server above. */
void *ecxi_ctrl_peer_monitor_socket(const ecxi_ctrl_peer *p);
int64_t ecxi_ctrl_peer_next_timeout(const ecxi_ctrl_peer *p);
ecxi_ctrl_stats ecxi_ctrl_peer_stats(const ecxi_ctrl_peer *p);

#endif

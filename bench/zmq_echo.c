/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zmq_echo — the floor bench/ctrl_instr.sh compares ecx's producer with: a
 * bare ZeroMQ ROUTER that answers each [identity, "", payload] message with
 * a fixed frame, doing no other work. The frame is a valid XferAck (status
 * OK, no blocks) for the one item the announcements file names, encoded
 * once at start, so `ecx bench ctrl` can drive it unchanged.
 *
 * usage: zmq_echo ANNOUNCE_OUT [ACK_BYTES]
 * ACK_BYTES: make the ack this large (its agent_metadata padded), as large
 * as the producer's real acks, so that ZeroMQ moves the same bytes for
 * both (default: the bare ack, 92 bytes).
 * Binds 127.0.0.1 on a free port, writes {mm_hash: announcement} for one
 * item to ANNOUNCE_OUT (atomically), serves until SIGTERM or SIGINT, then
 * prints "zmq_echo: requests=<n>" on stderr.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ecx.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv)
{
    char *end = NULL;
    long want = argc == 3 ? strtol(argv[2], &end, 10) : 0;
    if ((argc != 2 && argc != 3) || (argc == 3 && (*end || want < 1 || want > 65536))) {
        fprintf(stderr, "usage: zmq_echo ANNOUNCE_OUT [ACK_BYTES (1..65536)]\n");
        return 2;
    }
    static const char hash[] = "9e3779b97f4a7c15000000000000000000000000000000000000000000000000";
    static uint8_t frame[65536 + 256];
    static char pad[65536];
    size_t frame_len;
    ecx_ack a;
    ecx_ack_init(&a);
    a.mm_hash = (ecx_span){hash, sizeof hash - 1};
    a.status = ECX_STATUS_OK;
    if (ecx_wire_encode_ack(&a, frame, sizeof frame, &frame_len)) return 1;
    /* Pad: msgpack's bin header grows with the length, so step up to it. */
    for (size_t n = 0; want && (long)frame_len < want && n < sizeof pad; n++) {
        a.agent_metadata = (ecx_span){pad, n + 1};
        if (ecx_wire_encode_ack(&a, frame, sizeof frame, &frame_len)) return 1;
    }

    void *zctx = zmq_ctx_new(), *sock = zmq_socket(zctx, ZMQ_ROUTER);
    int zero = 0;
    char ep[64];
    size_t ep_len = sizeof ep;
    if (!sock || zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_bind(sock, "tcp://127.0.0.1:*") ||
        zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &ep_len)) {
        fprintf(stderr, "zmq_echo: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    const char *colon = strrchr(ep, ':');
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f,
                      "{\"%s\":{\"peer_host\":\"127.0.0.1\",\"peer_port\":%s,"
                      "\"size_bytes\":1,\"metadata\":{}}}\n",
                      hash, colon + 1) < 0 ||
        fclose(f) || rename(tmp, argv[1])) {
        fprintf(stderr, "zmq_echo: cannot write %s\n", argv[1]);
        return 1;
    }

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    zmq_msg_t id, delim, payload;
    zmq_msg_init(&id), zmq_msg_init(&delim), zmq_msg_init(&payload);
    zmq_pollitem_t pi = {.socket = sock, .events = ZMQ_POLLIN};
    unsigned long long served = 0;
    while (!stop) {
        /* Drain what is queued, then wait (at most 1 s, to see the flag). */
        if (zmq_msg_recv(&id, sock, ZMQ_DONTWAIT) < 0) {
            zmq_poll(&pi, 1, 1000);
            continue;
        }
        if (zmq_msg_recv(&delim, sock, ZMQ_DONTWAIT) < 0 ||
            zmq_msg_recv(&payload, sock, ZMQ_DONTWAIT) < 0)
            continue;
        if (zmq_send(sock, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
            zmq_send(sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
            zmq_send(sock, frame, frame_len, ZMQ_DONTWAIT) >= 0)
            served++;
    }
    fprintf(stderr, "zmq_echo: requests=%llu\n", served);
    zmq_msg_close(&id), zmq_msg_close(&delim), zmq_msg_close(&payload);
    zmq_close(sock);
    zmq_ctx_term(zctx);
    return 0;
}

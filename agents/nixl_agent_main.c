/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ecx-nixl-agent — the NIXL agent process (nixl_proc.h): one NIXL agent
 * (nixl_agent.c; Debian's UCX, or with ECX_NIXL_UCX the UCX its peers run:
 * peer_ucx.h) serving its parent, the library, over the
 * socket on fd 3, with the region file on fd 4. Started by libecx only.
 *
 * It ends when the socket says EOF (the parent closed it, or died) or its
 * parent changes (checked at least once a second). PR_SET_PDEATHSIG is not
 * used: it follows the thread that spawned us, and a library's caller
 * thread may end long before the process.
 *
 * Fault injection for tests (docs/NIXL.md §5): ECX_NIXL_AGENT_FAULT =
 * "abort-read:N" / "kill-read:N" raises SIGABRT (what UCX's assertion
 * does) / SIGKILL on itself when the Nth READ arrives; "abort-notif:N" /
 * "kill-notif:N" when the Nth notification is about to go to the parent.
 * In a context's first helper only; with ":every" appended, in every one.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "nixl_agent.h"
#include "nixl_proc.h"
#include "peer_ucx.h"
#include "util.h"

#define S ECXI_NIXL_PROC_SOCK_FD

typedef struct hread {
    struct hread *next;
    uint64_t id;
    ecxi_nixl_read *rd;
} hread;

static struct {
    bool peer_ucx; /* on ECX_NIXL_UCX's UCX (peer_ucx.h) */
    ecxi_nixl_agent *a;
    uint8_t *base;
    uint64_t size;
    ecxi_nixl_remote **remotes; /* handle - 1 */
    size_t nremotes;
    hread *reads;
    /* the READ being assembled from its messages */
    uint64_t as_id, as_handle;
    uint64_t *as_remote, *as_len;
    void **as_local;
    size_t as_n, as_cap;
    /* fault injection */
    int fault_sig;
    bool fault_on_read;
    long fault_at, reads_seen, notifs_seen;
    uint8_t buf[ECXI_NIXL_PROC_MSG_MAX];
} g;

static _Noreturn void bye(const char *why)
{
    if (why) ecxi_log(ECX_LOG_ERROR, "nixl agent process: %s", why);
    _exit(why ? 3 : 0);
}

static void send_msg(const uint8_t *b, size_t len)
{
    while (send(S, b, len, MSG_NOSIGNAL) < 0)
        if (errno != EINTR) bye(NULL); /* the parent is gone */
}

static void reply(uint16_t type, uint64_t id, int32_t rc, uint64_t v, const uint8_t *more,
                  size_t more_len)
{
    uint8_t *b = g.buf;
    ecxi_nixl_proc_hdr_put(b, type, id);
    ecxi_put_le32(b + ECXI_NIXL_PROC_HDR, (uint32_t)rc);
    size_t n = ECXI_NIXL_PROC_HDR + 4;
    if (type != ECXI_NIXL_H_READ_END) {
        ecxi_put_le64(b + n, v);
        n += 8;
    }
    if (more_len) memcpy(b + n, more, more_len);
    send_msg(b, n + more_len);
}

static void fault(bool on_read)
{
    long n = on_read ? ++g.reads_seen : ++g.notifs_seen;
    if (g.fault_sig && g.fault_on_read == on_read && n == g.fault_at) {
        ecxi_log(ECX_LOG_WARN, "nixl agent process: fault injection: signal %d", g.fault_sig);
        signal(g.fault_sig, SIG_DFL);
        raise(g.fault_sig);
    }
}

static ecxi_nixl_remote *remote_of(uint64_t h)
{
    return h && h <= g.nremotes ? g.remotes[h - 1] : NULL;
}

static void on_add(uint64_t id, const uint8_t *md, size_t len)
{
    ecxi_nixl_remote *r;
    int rc = ecxi_nixl_remote_add(g.a, md, len, &r);
    size_t slot = g.nremotes;
    for (size_t i = 0; i < g.nremotes && !rc; i++)
        if (!g.remotes[i]) slot = i;
    if (!rc && slot == g.nremotes) {
        ecxi_nixl_remote **m = g.nremotes < UINT32_MAX - 1
                                   ? realloc(g.remotes, (g.nremotes + 1) * sizeof *m)
                                   : NULL;
        if (!m) {
            ecxi_nixl_remote_drop(r);
            rc = ECX_ENOMEM;
        } else {
            g.remotes = m;
            g.nremotes++;
        }
    }
    if (!rc) g.remotes[slot] = r;
    reply(ECXI_NIXL_H_ADDED, id, rc, rc ? 0 : slot + 1, NULL, 0);
}

static void on_read(uint64_t id, const uint8_t *b, size_t len)
{
    if (len < 20) bye("a short READ");
    uint64_t h = ecxi_get_le64(b);
    uint32_t flags = ecxi_get_le32(b + 8), n = ecxi_get_le32(b + 12), ml = ecxi_get_le32(b + 16);
    bool more = flags & ECXI_NIXL_READ_MORE;
    if (flags & ~ECXI_NIXL_READ_MORE || n == 0 || n > ECXI_NIXL_PROC_PIECES ||
        ml > ECXI_NIXL_MSG_MAX || (more ? ml != 0 : ml == 0) || len != 20 + (size_t)n * 24 + ml)
        bye("a malformed READ");
    if (g.as_n && g.as_id != id) bye("a READ interleaved with another");
    if (g.as_n + n > ECXI_NIXL_PROC_PIECES_MAX) bye("a READ of too many pieces");
    if (g.as_n + n > g.as_cap) {
        size_t cap = (g.as_n + n) * 2;
        uint64_t *r = realloc(g.as_remote, cap * 8), *l = r ? realloc(g.as_len, cap * 8) : NULL;
        if (r) g.as_remote = r;
        if (l) g.as_len = l;
        void **p = l ? realloc(g.as_local, cap * sizeof *p) : NULL;
        if (!p) bye("out of memory");
        g.as_local = p;
        g.as_cap = cap;
    }
    g.as_id = id, g.as_handle = h;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *q = b + 20 + (size_t)i * 24;
        uint64_t off = ecxi_get_le64(q + 8), l = ecxi_get_le64(q + 16);
        if (!l || off > g.size || l > g.size - off) bye("a READ outside the region");
        g.as_remote[g.as_n] = ecxi_get_le64(q);
        g.as_local[g.as_n] = g.base + off;
        g.as_len[g.as_n++] = l;
    }
    if (more) return;
    size_t np = g.as_n;
    g.as_n = 0;
    fault(true);
    ecxi_nixl_remote *r = remote_of(h);
    hread *x = calloc(1, sizeof *x);
    int rc = !r ? ECX_EDATA_PEER : !x ? ECX_ENOMEM : 0;
    if (!rc)
        rc = ecxi_nixl_read_post(r, g.as_remote, g.as_local, g.as_len, np,
                                 (const char *)b + 20 + (size_t)n * 24, ml, &x->rd);
    if (rc) {
        free(x);
        reply(ECXI_NIXL_H_READ_END, id, rc, 0, NULL, 0);
        return;
    }
    x->id = id;
    x->next = g.reads;
    g.reads = x;
}

static void on_release(uint64_t id)
{
    for (hread **pp = &g.reads; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            hread *x = *pp;
            *pp = x->next;
            ecxi_nixl_read_release(x->rd);
            free(x);
            return;
        }
}

/* Everything the parent sent: false on EOF. */
static bool from_parent(void)
{
    for (;;) {
        ssize_t n = recv(S, g.buf, sizeof g.buf, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return true;
        if (n <= 0) return false;
        if (n > (ssize_t)sizeof g.buf) bye("a message too large");
        uint16_t type;
        uint64_t id;
        if (ecxi_nixl_proc_hdr_get(g.buf, (size_t)n, &type, &id))
            bye("a message not of the protocol");
        const uint8_t *b = g.buf + ECXI_NIXL_PROC_HDR;
        size_t len = (size_t)n - ECXI_NIXL_PROC_HDR;
        if (g.as_n && type != ECXI_NIXL_P_READ) bye("a READ left unfinished");
        switch (type) {
        case ECXI_NIXL_P_ADD: {
            uint8_t *md = malloc(len + 1); /* g.buf is reused by the reply */
            if (!md) bye("out of memory");
            memcpy(md, b, len);
            on_add(id, md, len);
            free(md);
            break;
        }
        case ECXI_NIXL_P_DROP: {
            ecxi_nixl_remote *r = remote_of(id);
            if (r) ecxi_nixl_remote_drop(r), g.remotes[id - 1] = NULL;
            break;
        }
        case ECXI_NIXL_P_READ:
            on_read(id, b, len);
            break;
        case ECXI_NIXL_P_RELEASE:
            on_release(id);
            break;
        default:
            bye("an unexpected message");
        }
    }
}

/* READs that ended, and notifications, to the parent. */
static void to_parent(void)
{
    for (hread **pp = &g.reads; *pp;) {
        hread *x = *pp;
        int st = ecxi_nixl_read_poll(x->rd);
        if (st == 0) {
            pp = &x->next;
            continue;
        }
        *pp = x->next;
        reply(ECXI_NIXL_H_READ_END, x->id, st > 0 ? 0 : st, 0, NULL, 0);
        ecxi_nixl_read_release(x->rd);
        free(x);
    }
    char name[ECXI_NIXL_NAME_MAX + 1], msg[ECXI_NIXL_MSG_MAX + 1];
    while (ecxi_nixl_agent_notif_pop(g.a, name, msg)) {
        fault(false);
        uint32_t nl = (uint32_t)strlen(name), ml = (uint32_t)strlen(msg);
        if (!nl || !ml) continue;
        uint8_t *b = g.buf;
        ecxi_nixl_proc_hdr_put(b, ECXI_NIXL_H_NOTIF, 0);
        ecxi_put_le32(b + ECXI_NIXL_PROC_HDR, nl);
        ecxi_put_le32(b + ECXI_NIXL_PROC_HDR + 4, ml);
        memcpy(b + ECXI_NIXL_PROC_HDR + 8, name, nl);
        memcpy(b + ECXI_NIXL_PROC_HDR + 8 + nl, msg, ml);
        send_msg(b, ECXI_NIXL_PROC_HDR + 8 + nl + ml);
    }
}

static void fault_setup(uint64_t gen)
{
    const char *f = getenv("ECX_NIXL_AGENT_FAULT");
    if (!f || (gen != 1 && !strstr(f, ":every"))) return;
    static const struct {
        const char *name;
        int sig;
        bool read;
    } kinds[] = {{"abort-read:", SIGABRT, true}, {"kill-read:", SIGKILL, true},
                 {"abort-notif:", SIGABRT, false}, {"kill-notif:", SIGKILL, false}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if (!strncmp(f, kinds[i].name, strlen(kinds[i].name))) {
            g.fault_sig = kinds[i].sig;
            g.fault_on_read = kinds[i].read;
            g.fault_at = atol(f + strlen(kinds[i].name));
        }
}

/* The HELLO: role, region size, agent name; then the mapping and the agent. */
static void hello(void)
{
    struct pollfd q = {.fd = S, .events = POLLIN};
    if (poll(&q, 1, ECXI_NIXL_PROC_START_MS) != 1) bye("no HELLO");
    ssize_t n = recv(S, g.buf, sizeof g.buf, MSG_TRUNC);
    uint16_t type;
    uint64_t id;
    if (n < ECXI_NIXL_PROC_HDR + 13 || n > ECXI_NIXL_PROC_HDR + 12 + ECXI_NIXL_NAME_MAX ||
        ecxi_nixl_proc_hdr_get(g.buf, (size_t)n, &type, &id) || type != ECXI_NIXL_P_HELLO)
        bye("a bad HELLO");
    const uint8_t *b = g.buf + ECXI_NIXL_PROC_HDR;
    uint32_t role = ecxi_get_le32(b);
    g.size = ecxi_get_le64(b + 4);
    char name[ECXI_NIXL_NAME_MAX + 1];
    size_t nl = (size_t)n - ECXI_NIXL_PROC_HDR - 12;
    memcpy(name, b + 12, nl);
    name[nl] = 0;
    bool producer = role == ECXI_NIXL_ROLE_PRODUCER;
    fault_setup(id);
    struct stat st;
    int rc = 0;
    if ((!producer && role != ECXI_NIXL_ROLE_CONSUMER) || fstat(ECXI_NIXL_PROC_REGION_FD, &st) ||
        g.size == 0 || (uint64_t)st.st_size < g.size || g.size > SIZE_MAX)
        rc = ECX_EINVAL;
    if (!rc) {
        void *m = mmap(NULL, (size_t)g.size, producer ? PROT_READ : PROT_READ | PROT_WRITE,
                       MAP_SHARED, ECXI_NIXL_PROC_REGION_FD, 0);
        if (m == MAP_FAILED) rc = ECX_ESYS;
        else g.base = m;
    }
    close(ECXI_NIXL_PROC_REGION_FD);
    if (!rc)
        rc = ecxi_nixl_agent_new(name, producer ? g.base : NULL, producer ? (size_t)g.size : 0,
                                 g.peer_ucx, &g.a);
    if (g.peer_ucx) ecxi_peer_ucx_done(); /* its UCX and modules are loaded */
    size_t ml = 0;
    const uint8_t *md = !rc && producer ? ecxi_nixl_agent_metadata(g.a, &ml) : NULL;
    uint8_t *copy = ml ? malloc(ml) : NULL;
    if (ml && !copy) rc = ECX_ENOMEM, ml = 0;
    if (ml) memcpy(copy, md, ml);
    reply(ECXI_NIXL_H_HELLO, 0, rc, (uintptr_t)g.base, copy, ml);
    free(copy);
    if (rc) bye(NULL);
}

int main(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[1], "--ecx-nixl-agent")) {
        fprintf(stderr, "ecx-nixl-agent: the NIXL agent process of libecx's nixl data path; "
                        "started by the library only (docs/NIXL.md §5)\n");
        return 2;
    }
    if ((g.peer_ucx = ecxi_peer_ucx_enter(argv)))
        ecxi_log(ECX_LOG_INFO, "nixl agent: on UCX %s from ECX_NIXL_UCX=%s", ucp_get_version_string(),
                 getenv("ECX_NIXL_UCX"));
    signal(SIGPIPE, SIG_IGN);
    pid_t parent = getppid();
    hello();
    int efd = ecxi_nixl_agent_fd(g.a);
    for (;;) {
        if (!from_parent()) break;
        ecxi_nixl_agent_progress(g.a);
        to_parent();
        if (getppid() != parent) break;
        int busy = ecxi_nixl_agent_arm(g.a);
        if (busy < 0) bye("UCX cannot arm its worker");
        struct pollfd q[2] = {{.fd = S, .events = POLLIN}, {.fd = efd, .events = POLLIN}};
        (void)poll(q, 2, busy ? 0 : g.reads ? 10 : 1000);
    }
    /* EOF: the parent is done or gone; no cleanup is owed to anyone */
    bye(NULL);
}

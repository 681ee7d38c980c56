/* SPDX-License-Identifier: Apache-2.0 */
/*
 * helper_proc — starting, finding and ending the library's helper
 * processes (helper_proc.h).
 */
#include "helper_proc.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

extern char **environ;

void ecxi_helper_hdr_put(uint8_t *b, uint32_t magic, uint16_t version, uint16_t type, uint64_t id)
{
    ecxi_put_le32(b, magic);
    ecxi_put_le16(b + 4, version);
    ecxi_put_le16(b + 6, type);
    ecxi_put_le64(b + 8, id);
}

int ecxi_helper_hdr_get(const uint8_t *b, size_t len, uint32_t magic, uint16_t version,
                        uint16_t *type, uint64_t *id)
{
    if (len < ECXI_HELPER_HDR || ecxi_get_le32(b) != magic || ecxi_get_le16(b + 4) != version)
        return ECX_EDATA_PEER;
    *type = ecxi_get_le16(b + 6);
    *id = ecxi_get_le64(b + 8);
    return 0;
}

/* Where the helper may be (helper_proc.h, Finding). */
static int helper_paths(const char *prog, const char *env_name, char (*out)[PATH_MAX], int max)
{
    const char *env = getenv(env_name);
    if (env && *env) return snprintf(out[0], PATH_MAX, "%s", env) < PATH_MAX;
    char dirs[2][PATH_MAX];
    int nd = 0, n = 0;
    Dl_info di;
    if (dladdr((void *)ecxi_helper_find, &di) && di.dli_fname && strchr(di.dli_fname, '/') &&
        realpath(di.dli_fname, dirs[nd]))
        nd++;
    ssize_t k = readlink("/proc/self/exe", dirs[nd], PATH_MAX - 1);
    if (k > 0) dirs[nd][k] = 0, nd++;
    for (int i = 0; i < nd; i++) {
        char *slash = strrchr(dirs[i], '/');
        if (!slash) continue;
        *slash = 0;
        if (i == 1 && !strcmp(dirs[0], dirs[1])) continue; /* the program's dir is the library's */
        /* (a path too long for PATH_MAX is skipped) */
        if (n < max && snprintf(out[n], PATH_MAX, "%s/%s", dirs[i], prog) < PATH_MAX) n++;
#ifdef ECX_NIXL_AGENT_RELDIR
        if (i == 0 && n < max &&
            snprintf(out[n], PATH_MAX, "%s/" ECX_NIXL_AGENT_RELDIR "/%s", dirs[i], prog) <
                PATH_MAX)
            n++;
#endif
    }
    return n;
}

int ecxi_helper_find(const char *prog, const char *env, char *path)
{
    char cand[4][PATH_MAX], tried[1024] = "";
    int n = helper_paths(prog, env, cand, 4);
    for (int i = 0; i < n; i++) {
        if (access(cand[i], X_OK) == 0) {
            memcpy(path, cand[i], PATH_MAX);
            return 0;
        }
        size_t l = strlen(tried);
        if (snprintf(tried + l, sizeof tried - l, "%s%s", l ? ", " : "", cand[i]) < 0) break;
    }
    ECXI_LOG_RATELIMITED(ECX_LOG_ERROR, "the helper program %s not found or not executable "
                        "(tried %s; set %s to its path): its data path cannot start", prog,
                        n ? tried : "nothing", env);
    return ECX_EDATA_NOPATH;
}

int ecxi_helper_spawn(const char *path, const char *arg, int region_fd, int *sock, pid_t *pid)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
        ecxi_log(ECX_LOG_ERROR, "helper: socketpair: %s", strerror(errno));
        return ECX_ESYS;
    }
    /* >= 10, like region_fd: the dup2s below cannot clobber each other;
     * everything else is close-on-exec. */
    int child = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
    close(sv[1]);
    int rfd = region_fd >= 10 ? region_fd : fcntl(region_fd, F_DUPFD_CLOEXEC, 10);
    if (child < 0 || rfd < 0) {
        close(sv[0]);
        if (child >= 0) close(child);
        return ECX_ESYS;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    int rc = 0;
    if (posix_spawn_file_actions_init(&fa)) rc = ECX_ENOMEM;
    else if (posix_spawnattr_init(&at)) {
        posix_spawn_file_actions_destroy(&fa);
        rc = ECX_ENOMEM;
    }
    if (!rc) {
        posix_spawn_file_actions_adddup2(&fa, child, ECXI_HELPER_SOCK_FD);
        posix_spawn_file_actions_adddup2(&fa, rfd, ECXI_HELPER_REGION_FD);
        posix_spawnattr_setsigmask(&at, &none);
        posix_spawnattr_setsigdefault(&at, &all);
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
        char *argv[] = {(char *)path, (char *)arg, NULL};
        int e = posix_spawn(pid, path, &fa, &at, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&at);
        if (e) {
            ECXI_LOG_RATELIMITED(ECX_LOG_ERROR, "helper: cannot start %s: %s", path, strerror(e));
            *pid = 0;
            rc = ECX_EDATA_NOPATH;
        }
    }
    close(child);
    if (rfd != region_fd) close(rfd);
    if (rc) {
        close(sv[0]);
        return rc;
    }
    *sock = sv[0];
    return 0;
}

void ecxi_helper_reap(pid_t pid, bool kill_first, int64_t wait_ms, char *why, size_t cap)
{
    int st = 0;
    pid_t r = 0;
    if (pid <= 0) { /* never kill(0) or kill(-1) */
        snprintf(why, cap, "no process");
        return;
    }
    if (kill_first) kill(pid, SIGKILL);
    for (int64_t end = ecxi_now_ms(NULL) + wait_ms; ecxi_now_ms(NULL) < end;) {
        r = waitpid(pid, &st, WNOHANG);
        if (r != 0 && !(r < 0 && errno == EINTR)) break;
        usleep(2000);
    }
    if (r == 0) {
        kill(pid, SIGKILL);
        while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
            ;
        snprintf(why, cap, "killed (it did not end)");
        return;
    }
    if (r < 0) snprintf(why, cap, "status unknown (%s)", strerror(errno)); /* SIGCHLD ignored */
    else if (WIFSIGNALED(st)) snprintf(why, cap, "signal %d (%s)%s", WTERMSIG(st),
                                       strsignal(WTERMSIG(st)), kill_first ? ", sent by ecx" : "");
    else snprintf(why, cap, "exit status %d", WEXITSTATUS(st));
}

int64_t ecxi_helper_may_start(const ecxi_helper_starts *s, int64_t now_ms)
{
    if (s->n < ECXI_HELPER_RESTARTS) return 0;
    int64_t oldest = s->ms[s->n % ECXI_HELPER_RESTARTS];
    int64_t left = oldest + ECXI_HELPER_WINDOW_MS - now_ms;
    return left > 0 ? left : 0;
}

void ecxi_helper_started(ecxi_helper_starts *s, int64_t now_ms)
{
    s->ms[s->n++ % ECXI_HELPER_RESTARTS] = now_ms;
}

long ecxi_helper_recv_wait(int sock, void *buf, size_t cap, int64_t end_ms)
{
    for (;;) {
        ssize_t n = recv(sock, buf, cap, MSG_DONTWAIT | MSG_TRUNC);
        if (n > (ssize_t)cap) return -1;
        if (n >= 0) return n;
        if (errno != EAGAIN && errno != EINTR) return -1;
        int64_t left = end_ms - ecxi_now_ms(NULL);
        if (left <= 0) return -1;
        struct pollfd q = {.fd = sock, .events = POLLIN};
        (void)poll(&q, 1, left > 100 ? 100 : (int)left);
    }
}

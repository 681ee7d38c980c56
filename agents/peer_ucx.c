/* SPDX-License-Identifier: Apache-2.0 */
/* peer_ucx — run ecx-nixl-agent on the UCX its NIXL peers run; see peer_ucx.h. */
#include "peer_ucx.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <ucs/type/status.h>
#include <unistd.h>

#define LINKS_ENV "ECX_NIXL_UCX_LINKS"
#define LINKS_PREFIX "ecx-nixl-ucx-"

static char g_links[PATH_MAX]; /* the link directory, once made or inherited */

/* Remove the link directory: its links, its ucx/ and their links. */
static void remove_links(void)
{
    const char *base = strrchr(g_links, '/');
    if (!base || strncmp(base + 1, LINKS_PREFIX, strlen(LINKS_PREFIX))) return; /* not ours */
    char sub[PATH_MAX + 8];
    const char *dirs[2] = {sub, g_links};
    snprintf(sub, sizeof sub, "%s/ucx", g_links);
    for (int i = 0; i < 2; i++) {
        DIR *d = opendir(dirs[i]);
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (e->d_type != DT_DIR) unlinkat(dirfd(d), e->d_name, 0); /* only links go here */
        if (d) closedir(d);
        rmdir(dirs[i]);
    }
    g_links[0] = 0;
}

static _Noreturn __attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ecx-nixl-agent: ECX_NIXL_UCX=%s: ", getenv("ECX_NIXL_UCX"));
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    remove_links();
    exit(2);
}

/* Whether name is library lib's file: "lib<lib>.so..." or, renamed by
 * auditwheel, "lib<lib>-<hash>.so...". */
static bool is_lib(const char *name, const char *lib)
{
    size_t n = strlen(lib);
    if (strncmp(name, "lib", 3) || strncmp(name + 3, lib, n)) return false;
    const char *rest = name + 3 + n;
    return (*rest == '.' || *rest == '-') && strstr(rest, ".so");
}

/* dir's file of library lib (the first in name order) into out. */
static void find_lib(const char *dir, const char *lib, char *out)
{
    struct dirent **list;
    int n = scandir(dir, &list, NULL, alphasort);
    if (n < 0) fail("cannot read the directory: %s", strerror(errno));
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!out[0] && is_lib(list[i]->d_name, lib))
            snprintf(out, PATH_MAX, "%s/%s", dir, list[i]->d_name);
        free(list[i]);
    }
    free(list);
    if (!out[0]) fail("no lib%s there (the directory of the UCX libraries to run)", lib);
}

static const char *const LIBS[] = {"ucp", "ucs", "uct", "ucm"};

/* Each UCX library this process has loaded (its path as loaded, and which
 * of LIBS it is) to fn, until fn returns false. */
typedef bool (*each_fn)(const char *path, const char *lib, void *arg);
struct each {
    each_fn fn;
    void *arg;
    bool stopped;
};
static int each_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct each *e = arg;
    const char *slash = strrchr(info->dlpi_name, '/');
    const char *base = slash ? slash + 1 : info->dlpi_name;
    for (size_t i = 0; i < sizeof LIBS / sizeof *LIBS; i++)
        if (is_lib(base, LIBS[i]) && !e->fn(info->dlpi_name, LIBS[i], e->arg)) {
            e->stopped = true;
            return 1;
        }
    return 0;
}
static bool each_ucx(each_fn fn, void *arg)
{
    struct each e = {fn, arg, false};
    dl_iterate_phdr(each_cb, &e);
    return !e.stopped;
}

static void link_to(const char *target, const char *dir, const char *name)
{
    char at[2 * PATH_MAX];
    snprintf(at, sizeof at, "%s/%s", dir, name);
    if (symlink(target, at) != 0 && errno != EEXIST)
        fail("cannot link %s: %s", at, strerror(errno));
}

/* The link for one loaded UCX library: its file name, to DIR's (arg). */
static bool link_loaded(const char *path, const char *lib, void *dir)
{
    char target[PATH_MAX];
    find_lib(dir, lib, target);
    const char *slash = strrchr(path, '/');
    link_to(target, g_links, slash ? slash + 1 : path);
    return true;
}

/* Whether a loaded UCX library is in DIR (arg: its real path). */
static bool in_dir(const char *path, const char *lib, void *dir)
{
    (void)lib;
    char real[PATH_MAX];
    size_t n = strlen(dir);
    return realpath(path, real) && !strncmp(real, dir, n) && real[n] == '/';
}

/* Link DIR/ucx's modules into links/ucx under the names UCX looks for: the
 * module's stem and the suffix of the name libucs was loaded under. */
static void link_modules(const char *dir, const char *ucs_name)
{
    const char *ext = strchr(ucs_name, '.');
    char src[PATH_MAX + 8], dst[PATH_MAX + 8];
    snprintf(src, sizeof src, "%s/ucx", dir);
    snprintf(dst, sizeof dst, "%s/ucx", g_links);
    if (mkdir(dst, 0700) != 0) fail("cannot make %s: %s", dst, strerror(errno));
    DIR *d = opendir(src);
    if (!d) return; /* no modules: UCX runs on what libuct has built in */
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *dot = strchr(e->d_name, '.');
        if (strncmp(e->d_name, "lib", 3) || !dot || strncmp(dot, ".so", 3)) continue;
        char target[2 * PATH_MAX], name[2 * NAME_MAX + 2]; /* a longer one fails to link */
        snprintf(target, sizeof target, "%s/%s", src, e->d_name);
        snprintf(name, sizeof name, "%.*s%s", (int)(dot - e->d_name), e->d_name, ext ? ext : "");
        link_to(target, dst, name);
    }
    closedir(d);
}

/* Whether lib loads, in a child (its constructors run there, not here): a
 * library that cannot would fail this program's next start in the dynamic
 * loader, before it could say why or remove its links. */
static void check_loads(const char *lib)
{
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) fail("fork: %s", strerror(errno));
    if (pid == 0) {
        /* a namespace of its own: not bound to the UCX this program loaded */
        void *h = dlmopen(LM_ID_NEWLM, lib, RTLD_NOW | RTLD_LOCAL);
        if (!h || !dlsym(h, "ucp_get_version")) {
            fprintf(stderr, "ecx-nixl-agent: ECX_NIXL_UCX=%s: %s: %s\n", getenv("ECX_NIXL_UCX"),
                    lib, h ? "not UCX's libucp (no ucp_get_version)" : dlerror());
            _exit(1);
        }
        _exit(0);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st)) fail("its libucp does not load (above)");
}

bool ecxi_peer_ucx_enter(char **argv)
{
    const char *dir = getenv("ECX_NIXL_UCX");
    if (!dir || !*dir) return false;
    char real_dir[PATH_MAX];
    if (!realpath(dir, real_dir)) fail("%s", strerror(errno));
    const char *inherited = getenv(LINKS_ENV);
    if (inherited) { /* run again: on DIR's UCX, or not at all */
        snprintf(g_links, sizeof g_links, "%s", inherited);
        if (!each_ucx(in_dir, real_dir)) fail("UCX was not all loaded from there");
        return true;
    }
    char ucp[PATH_MAX];
    find_lib(real_dir, "ucp", ucp);
    check_loads(ucp);
    const char *tmp = getenv("TMPDIR");
    snprintf(g_links, sizeof g_links, "%s/" LINKS_PREFIX "XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_links)) {
        int e = errno;
        g_links[0] = 0;
        fail("cannot make a directory for its links: %s", strerror(e));
    }
    if (strchr(real_dir, ':') || strchr(g_links, ':'))
        fail("a directory with ':' in its path cannot go in LD_LIBRARY_PATH");
    each_ucx(link_loaded, real_dir);
    Dl_info ucs;
    if (!dladdr((void *)ucs_status_string, &ucs) || !ucs.dli_fname)
        fail("cannot tell where UCX was loaded from");
    const char *slash = strrchr(ucs.dli_fname, '/');
    link_modules(real_dir, slash ? slash + 1 : ucs.dli_fname);
    const char *old = getenv("LD_LIBRARY_PATH");
    size_t cap = strlen(g_links) + strlen(real_dir) + (old ? strlen(old) : 0) + 3;
    char *path = malloc(cap);
    if (!path) fail("out of memory");
    snprintf(path, cap, "%s:%s%s%s", g_links, real_dir, old && *old ? ":" : "", old && *old ? old : "");
    if (setenv("LD_LIBRARY_PATH", path, 1) || setenv(LINKS_ENV, g_links, 1) ||
        (!getenv("UCX_LOG_LEVEL") && setenv("UCX_LOG_LEVEL", "error", 1)))
        fail("cannot set its environment: %s", strerror(errno));
    free(path);
    /* by its own file's name, so that it keeps its process name (ps, pgrep) */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) self[n] = 0;
    execv(n > 0 ? self : "/proc/self/exe", argv);
    fail("cannot run itself again: %s", strerror(errno));
}

void ecxi_peer_ucx_done(void)
{
    remove_links();
}

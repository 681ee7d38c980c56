/* SPDX-License-Identifier: Apache-2.0 */
/* test_region — the /dev/shm block file: create, join from a second real
 * process, SIGKILL the creator, reclaim its file on the next start; clean
 * shutdown unlinks; sizes, modes, names, symlinks and the reaper's limits;
 * backing (memory taken after creation, in the background or per
 * reservation) and a directory that fills up after creation (root only).
 * Every test works in its own directory under /dev/shm, so it never sees
 * (let alone touches) other processes' files. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "region.h"

#define BS 4096u

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/dev/shm/ecx-test-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                char p[512];
                snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
                if (unlink(p) != 0) rmdir(p);
            }
        closedir(d);
    }
    return rmdir(dir);
}

static char *path_of(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static bool exists(const char *name)
{
    struct stat st;
    return lstat(path_of(name), &st) == 0;
}

static int count_entries(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Run region_helper with args; for "create", wait for its "ready" line and
 * leave it running with its stdin pipe in *ctl. Returns the pid. */
static pid_t spawn(char *const args[], int *ctl)
{
    int in[2], out[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        execv(REGION_HELPER, args);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (ctl) {
        char line[600] = {0};
        size_t n = 0;
        while (n < sizeof line - 1) {
            ssize_t k = read(out[0], line + n, 1);
            if (k <= 0 || line[n] == '\n') break;
            n++;
        }
        assert_true(strncmp(line, "ready ", 6) == 0);
        *ctl = in[1];
    } else {
        close(in[1]);
    }
    close(out[0]);
    return pid;
}

static int wait_exit(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The test: create, join from a second process, SIGKILL the
 * creator, reclaim on the next start. */
static void test_create_join_kill_reap(void **state)
{
    (void)state;
    char total[32];
    snprintf(total, sizeof total, "%u", 8 * BS);
    char bs[32];
    snprintf(bs, sizeof bs, "%u", BS);
    int ctl;
    pid_t creator =
        spawn((char *[]){"region_helper", "create", dir, "inst1", "3", total, bs, NULL}, &ctl);
    const char *name = "ecx_inst1_3.mmap";
    assert_true(exists(name));
    struct stat st;
    assert_int_equal(stat(path_of(name), &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 8 * BS);
    assert_int_equal(count_entries(), 1); /* the temporary is gone */

    /* A second process joins and writes block 1. */
    pid_t joiner = spawn((char *[]){"region_helper", "join", dir, "inst1", "3", bs, NULL}, NULL);
    assert_int_equal(wait_exit(joiner), 0);

    /* So do we; we see both writes. */
    ecxi_region *r;
    assert_int_equal(ecxi_region_join_in(dir, "inst1", 3, BS, &r), 0);
    assert_false(ecxi_region_is_owner(r));
    assert_int_equal(ecxi_region_num_blocks(r), 8);
    assert_int_equal(ecxi_region_base(r)[0], 0xa5);
    assert_int_equal(ecxi_region_base(r)[BS - 1], 0xa5);
    assert_int_equal(ecxi_region_base(r)[BS], 0x5a);
    assert_int_equal(ecxi_region_base(r)[2 * BS], 0);
    /* The creator is alive: nothing to reap, even while we hold it too. */
    assert_int_equal(ecxi_region_reap(dir), 0);
    ecxi_region_free(r); /* a joiner never unlinks */
    assert_int_equal(ecxi_region_reap(dir), 0);
    assert_true(exists(name));

    /* Crash: the file stays behind, unlocked. */
    kill(creator, SIGKILL);
    assert_int_equal(wait_exit(creator), 128 + SIGKILL);
    close(ctl);
    assert_true(exists(name));

    /* Next start: creating any region in the directory reclaims it. */
    assert_int_equal(ecxi_region_create_in(dir, "inst2", 0, 4 * BS, BS, &r), 0);
    assert_false(exists(name));
    assert_true(exists("ecx_inst2_0.mmap"));
    assert_int_equal(count_entries(), 1);
    ecxi_region_free(r);
    assert_int_equal(count_entries(), 0);
}

/* A creator that shuts down cleanly unlinks its file; a joiner still
 * mapping it keeps its memory. */
static void test_clean_shutdown(void **state)
{
    (void)state;
    int ctl;
    pid_t creator =
        spawn((char *[]){"region_helper", "create", dir, "c", "0", "40960", "4096", NULL}, &ctl);
    ecxi_region *r;
    assert_int_equal(ecxi_region_join_in(dir, "c", 0, BS, &r), 0);
    close(ctl); /* EOF: the helper frees the region and exits */
    assert_int_equal(wait_exit(creator), 0);
    assert_false(exists("ecx_c_0.mmap"));
    assert_int_equal(ecxi_region_base(r)[100], 0xa5); /* still mapped */
    ecxi_region_base(r)[BS] = 7;
    ecxi_region_free(r);
    assert_int_equal(count_entries(), 0);
}

static void test_sizes(void **state)
{
    (void)state;
    ecxi_region *r = (ecxi_region *)1;
    assert_int_equal(ecxi_region_create_in(dir, "s", 0, 0, BS, &r), ECX_EREGION_SIZE);
    assert_null(r);
    assert_int_equal(ecxi_region_create_in(dir, "s", 0, BS, 0, &r), ECX_EREGION_SIZE);
    assert_int_equal(ecxi_region_create_in(dir, "s", 0, BS - 1, BS, &r), ECX_EREGION_SIZE);
    assert_int_equal(ecxi_region_create_in(dir, "s", 0, UINT64_MAX, 1, &r), ECX_EREGION_SIZE);
    assert_int_equal(ecxi_region_create_in(dir, "s", 0, UINT64_MAX, 1u << 20, &r), ECX_EREGION_SIZE);
    /* Whole blocks, but far more than the machine has: refused up front. */
    int rc = ecxi_region_create_in(dir, "s", 0, (uint64_t)1 << 46, (uint64_t)1 << 20, &r);
    assert_true(rc == ECX_EREGION_NOSPC || rc == ECX_ENOMEM);
    assert_int_equal(count_entries(), 0); /* no temporary left behind */

    /* Rounded down to whole blocks; odd block sizes are fine. */
    assert_int_equal(ecxi_region_create_in(dir, "s", 0, 10 * BS + 100, BS, &r), 0);
    assert_int_equal(ecxi_region_num_blocks(r), 10);
    assert_int_equal(ecxi_region_size(r), 10 * BS);
    assert_int_equal(ecxi_region_block_bytes(r), BS);
    struct stat st;
    assert_int_equal(stat(ecxi_region_path(r), &st), 0);
    assert_int_equal(st.st_size, 10 * BS);
    ecxi_region_free(r);
    assert_int_equal(ecxi_region_create_in(dir, "odd", 1, 10000, 1000, &r), 0);
    assert_int_equal(ecxi_region_num_blocks(r), 10);
    memset(ecxi_region_base(r), 1, 10000);
    ecxi_region_free(r);
    assert_int_equal(count_entries(), 0);
}

static void test_names(void **state)
{
    (void)state;
    ecxi_region *r;
    const char *bad[] = {"",
                         "../x",
                         "a/b",
                         ".hidden",
                         "sp ace",
                         "new\nline",
                         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(ecxi_region_create_in(dir, bad[i], 0, BS, BS, &r), ECX_EINVAL);
        assert_int_equal(ecxi_region_join_in(dir, bad[i], 0, BS, &r), ECX_EINVAL);
    }
    assert_int_equal(ecxi_region_create_in(dir, NULL, 0, BS, BS, &r), ECX_EINVAL);
    assert_int_equal(ecxi_region_create_in(dir, "ok", -1, BS, BS, &r), ECX_EINVAL);
    assert_int_equal(ecxi_region_create_in(dir, "ok", 0, BS, BS, NULL), ECX_EINVAL);
    assert_int_equal(count_entries(), 0);

    char a[ECXI_REGION_INSTANCE_ID_LEN + 1], b[ECXI_REGION_INSTANCE_ID_LEN + 1];
    assert_int_equal(ecxi_region_instance_id(a), 0);
    assert_int_equal(ecxi_region_instance_id(b), 0);
    assert_int_equal(strlen(a), ECXI_REGION_INSTANCE_ID_LEN);
    assert_string_not_equal(a, b);
    assert_int_equal(ecxi_region_create_in(dir, a, 7, BS, BS, &r), 0);
    char want[512];
    snprintf(want, sizeof want, "%s/ecx_%s_7.mmap", dir, a);
    assert_string_equal(ecxi_region_path(r), want);
    ecxi_region_free(r);

    /* The directory comes from $ECX_SHM_DIR when not given. */
    setenv("ECX_SHM_DIR", dir, 1);
    assert_string_equal(ecxi_region_default_dir(), dir);
    assert_int_equal(ecxi_region_create("env", 2, BS, BS, &r), 0);
    assert_true(exists("ecx_env_2.mmap"));
    ecxi_region *j;
    assert_int_equal(ecxi_region_join("env", 2, BS, &j), 0);
    ecxi_region_free(j);
    ecxi_region_free(r);
    unsetenv("ECX_SHM_DIR");
    assert_string_equal(ecxi_region_default_dir(), "/dev/shm");
    assert_int_equal(count_entries(), 0);
}

/* Mode 0600 whatever the umask; a second create of the name fails and
 * leaves the first alone. */
static void test_mode_and_exists(void **state)
{
    (void)state;
    mode_t old = umask(0277);
    ecxi_region *r, *r2 = (ecxi_region *)1;
    assert_int_equal(ecxi_region_create_in(dir, "m", 0, 4 * BS, BS, &r), 0);
    umask(old);
    struct stat st;
    assert_int_equal(stat(ecxi_region_path(r), &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_uid, geteuid());
    ecxi_region_base(r)[0] = 42;
    assert_int_equal(ecxi_region_create_in(dir, "m", 0, 4 * BS, BS, &r2), ECX_EREGION_EXISTS);
    assert_null(r2);
    assert_int_equal(count_entries(), 1);
    ecxi_region *j;
    assert_int_equal(ecxi_region_join_in(dir, "m", 0, BS, &j), 0);
    assert_int_equal(ecxi_region_base(j)[0], 42);
    ecxi_region_free(j);
    /* Join checks: wrong block size, missing name, wrong mode. */
    assert_int_equal(ecxi_region_join_in(dir, "m", 0, 3 * BS, &j), ECX_EREGION_SIZE);
    assert_int_equal(ecxi_region_join_in(dir, "m", 0, 0, &j), ECX_EREGION_SIZE);
    assert_int_equal(ecxi_region_join_in(dir, "m", 1, BS, &j), ECX_EREGION_NOTFOUND);
    assert_int_equal(chmod(ecxi_region_path(r), 0644), 0);
    assert_int_equal(ecxi_region_join_in(dir, "m", 0, BS, &j), ECX_EREGION_BADFILE);
    ecxi_region_free(r);
    assert_int_equal(count_entries(), 0);
}

static void test_symlinks(void **state)
{
    (void)state;
    /* A victim file and a symlink planted under a region's name. */
    int fd = open(path_of("victim"), O_RDWR | O_CREAT, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4 * BS), 0);
    close(fd);
    char target[512];
    snprintf(target, sizeof target, "%s", path_of("victim"));
    assert_int_equal(symlink(target, path_of("ecx_sym_0.mmap")), 0);
    ecxi_region *r;
    assert_int_equal(ecxi_region_join_in(dir, "sym", 0, BS, &r), ECX_EREGION_BADFILE);
    assert_int_equal(ecxi_region_create_in(dir, "sym", 0, 4 * BS, BS, &r), ECX_EREGION_EXISTS);
    assert_int_equal(ecxi_region_reap(dir), 0);
    assert_true(exists("ecx_sym_0.mmap"));
    assert_true(exists("victim"));
    struct stat st;
    assert_int_equal(stat(path_of("victim"), &st), 0);
    assert_int_equal(st.st_size, 4 * BS);
}

static void make_file(const char *name, off_t size)
{
    int fd = open(path_of(name), O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, size), 0);
    close(fd);
}

/* The reaper takes only unlocked regular files of ours with our names. */
static void test_reaper_limits(void **state)
{
    (void)state;
    make_file("ecx_dead_0.mmap", BS);                            /* orphan: reaped */
    make_file("ecx_dead_0.mmap.tmp.99.abcdef", BS);              /* orphan temporary: reaped */
    make_file("other.mmap", BS);                                 /* not our name */
    make_file("ecx_notes.txt", BS);                              /* not our name */
    make_file("ecx_held_0.mmap", BS);                            /* locked by a live process: us */
    assert_int_equal(mkdir(path_of("ecx_dir_0.mmap"), 0700), 0); /* not a file */
    int held = open(path_of("ecx_held_0.mmap"), O_RDONLY);
    assert_true(held >= 0);
    assert_int_equal(flock(held, LOCK_SH), 0);
    bool as_root = geteuid() == 0;
    if (as_root) {
        make_file("ecx_theirs_0.mmap", BS); /* another user's: never touched */
        assert_int_equal(chown(path_of("ecx_theirs_0.mmap"), 65534, 65534), 0);
    }
    assert_int_equal(ecxi_region_reap(dir), 2);
    assert_false(exists("ecx_dead_0.mmap"));
    assert_false(exists("ecx_dead_0.mmap.tmp.99.abcdef"));
    assert_true(exists("other.mmap"));
    assert_true(exists("ecx_notes.txt"));
    assert_true(exists("ecx_held_0.mmap"));
    assert_true(exists("ecx_dir_0.mmap"));
    if (as_root) assert_true(exists("ecx_theirs_0.mmap"));
    assert_int_equal(ecxi_region_reap(dir), 0);
    close(held); /* the holder is gone: now it is an orphan */
    assert_int_equal(ecxi_region_reap(dir), 1);
    assert_false(exists("ecx_held_0.mmap"));
    assert_int_equal(ecxi_region_reap(path_of("no-such-dir")), ECX_ESYS);
}

/* Bytes of the file the file system holds (allocated), not its size. */
static uint64_t held_bytes(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_blocks * 512;
}

/* Creating takes no memory; a reservation's blocks are backed when asked
 * (ecxi_region_back), whole 2 MiB pieces of the file at a time; without
 * ECX_PREFAULT=0 the creator's filler backs the whole region by itself. */
static void test_backing(void **state)
{
    (void)state;
    const uint64_t bs = 64 * 1024, mib2 = 2u << 20;
    ecxi_region *r;
    setenv("ECX_PREFAULT", "0", 1);
    assert_int_equal(ecxi_region_create_in(dir, "b", 0, 64 * bs, bs, &r), 0);
    unsetenv("ECX_PREFAULT");
    const char *path = ecxi_region_path(r);
    assert_int_equal(held_bytes(path), 0);
    assert_int_equal(ecxi_region_backed_bytes(r), 0);
    assert_int_equal(ecxi_region_back(r, 0, 1), 0);
    assert_int_equal(held_bytes(path), mib2); /* the first 2 MiB piece */
    assert_int_equal(ecxi_region_backed_bytes(r), mib2);
    assert_int_equal(ecxi_region_back(r, 31, 1), 0); /* in it: nothing more */
    assert_int_equal(held_bytes(path), mib2);
    assert_int_equal(ecxi_region_back(r, 31, 2), 0); /* reaches the second */
    assert_int_equal(held_bytes(path), 4 * (uint64_t)1 << 20);
    assert_int_equal(ecxi_region_backed_bytes(r), 4 * (uint64_t)1 << 20);
    assert_int_equal(ecxi_region_back(r, 0, 64), 0); /* all of it (4 MiB) */
    assert_int_equal(ecxi_region_backed_bytes(r), ecxi_region_size(r));
    assert_int_equal(ecxi_region_back(r, 64, 1), ECX_ERANGE);
    assert_int_equal(ecxi_region_back(r, 63, 2), ECX_ERANGE);
    assert_int_equal(ecxi_region_back(r, UINT64_MAX, 2), ECX_ERANGE);
    assert_int_equal(ecxi_region_back(r, 5, 0), 0);
    ecxi_region *j;
    assert_int_equal(ecxi_region_join_in(dir, "b", 0, bs, &j), 0);
    assert_int_equal(ecxi_region_back(j, 0, 64), 0); /* a joiner's: nothing to do */
    assert_int_equal(ecxi_region_backed_bytes(j), ecxi_region_size(j));
    ecxi_region_free(j);
    ecxi_region_free(r);

    /* The filler: a 64 MiB region is held whole within 20 s. */
    const uint64_t big = 64u << 20;
    assert_int_equal(ecxi_region_create_in(dir, "f", 0, big, 1u << 20, &r), 0);
    uint64_t held = 0;
    for (int i = 0; i < 2000 && (held = held_bytes(ecxi_region_path(r))) < big; i++)
        usleep(10000);
    assert_int_equal(held, big);
    assert_int_equal(ecxi_region_backed_bytes(r), big);
    ecxi_region_free(r);
    /* It pauses while the region is busy (a copy into it says so at each
     * chunk): 300 ms of calls every 100 us leave most of a 256 MiB region
     * unbacked (the filler alone backs it in ~0.1-0.3 s; what it does in
     * a moment this thread is not running is allowed for). */
    assert_int_equal(ecxi_region_create_in(dir, "p", 0, 256u << 20, 1u << 20, &r), 0);
    ecxi_region_busy(r);
    uint64_t at0 = ecxi_region_backed_bytes(r);
    for (int i = 0; i < 3000; i++) {
        ecxi_region_busy(r);
        usleep(100);
    }
    assert_true(ecxi_region_backed_bytes(r) - at0 < (128u << 20));
    for (int i = 0; i < 2000 && ecxi_region_backed_bytes(r) < (256u << 20); i++)
        usleep(10000); /* and goes on once it is quiet */
    assert_int_equal(ecxi_region_backed_bytes(r), 256u << 20);
    ecxi_region_free(r);
    /* Freed while its filler runs (a 1 GiB region, at once): the filler
     * stops and the file goes. */
    assert_int_equal(ecxi_region_create_in(dir, "g", 0, 1u << 30, 1u << 20, &r), 0);
    ecxi_region_free(r);
    assert_int_equal(count_entries(), 0);
}

/* Fill an open directory's file system up: write until ENOSPC. */
static int fill_up(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    static char chunk[65536];
    for (int i = 0; i < 1 << 16; i++)
        if (write(fd, chunk, sizeof chunk) < 0) break;
    int e = errno;
    close(fd);
    return e == ENOSPC ? 0 : -1;
}

/* The child of test_full_dir, in a mount namespace of its own: a 16 MiB
 * tmpfs, a context whose 8 MiB region fits it at creation, then the
 * directory fills up. A save must fail with ECX_EREGION_NOSPC (never a
 * SIGBUS), and work again once there is room. Exit 0, 77 (cannot mount),
 * or the step that failed. */
static int full_dir_child(const char *mnt)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, "size=16m,mode=0700") != 0)
        return 77;
    setenv("ECX_SHM_DIR", mnt, 1);
    setenv("ECX_PREFAULT", "0", 1); /* else the filler may take the room first */
    ecx_config cfg;
    ecx_config_init(&cfg);
    cfg.role = ECX_ROLE_PRODUCER;
    cfg.listen = "127.0.0.1:0";
    cfg.region_bytes = 8u << 20;
    cfg.block_bytes = 1u << 20;
    ecx_ctx *ctx;
    if (ecx_new(&cfg, &ctx) != 0) return 1;
    static uint8_t item[1u << 20];
    memset(item, 7, sizeof item);
    char filler[600];
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    if (fill_up(filler) != 0) return 2;
    int rc = ecx_save(ctx, "full-1", item, sizeof item);
    if (rc != ECX_EREGION_NOSPC) {
        fprintf(stderr, "save into a full directory: %s\n", ecx_errname(rc));
        return 3;
    }
    const ecx_segment *segs;
    size_t n_segs;
    uint64_t size;
    if (ecx_load(ctx, "full-1", &segs, &n_segs, &size) == 0) return 4; /* nothing was kept */
    unlink(filler);
    if (ecx_save(ctx, "full-1", item, sizeof item) != 0) return 5;
    static uint8_t back[sizeof item];
    if (ecx_read(ctx, "full-1", back, sizeof back) != (int64_t)sizeof item || memcmp(back, item, sizeof item))
        return 6;
    ecx_free(ctx);
    return 0;
}

static void test_full_dir(void **state)
{
    (void)state;
    if (geteuid() != 0) skip();
    char mnt[] = "/tmp/ecx-test-full-XXXXXX";
    assert_non_null(mkdtemp(mnt));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(full_dir_child(mnt));
    int rc = wait_exit(pid);
    rmdir(mnt);
    if (rc == 77) skip();
    assert_int_equal(rc, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_join_kill_reap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clean_shutdown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mode_and_exists, setup, teardown),
        cmocka_unit_test_setup_teardown(test_symlinks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reaper_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backing, setup, teardown),
        cmocka_unit_test(test_full_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keys — CURVE key files for the command line (docs/PROTOCOL.md §8's authenticated
 * control plane): `ecx keygen` writes a keypair, and serve / get read a
 * secret key, a public key or an allow-list from files, so keys never sit
 * on a command line (where ps would show them) and are never printed.
 *
 * Formats: a key file holds one Z85 key (40 characters) on a line of its
 * own; blank lines and lines starting with '#' are skipped. An allow file
 * holds any number of such keys, one per line. PREFIX.key (the secret) is
 * created with mode 0600 and never overwritten; PREFIX.pub is the public
 * key to hand to peers.
 */
#include "keys.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "cli.h"
#include "file.h"

bool key_z85_ok(const char *z85)
{
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";
    if (!z85 || strnlen(z85, KEY_Z85_LEN + 1) != KEY_Z85_LEN ||
        strspn(z85, alphabet) != KEY_Z85_LEN)
        return false;
    uint8_t key[32];
    bool ok = zmq_z85_decode(key, z85) != NULL;
    sodium_memzero(key, sizeof key);
    return ok;
}

static const char HELP[] =
    "usage: ecx keygen OUT_PREFIX\n"
    "\n"
    "Make a CURVE keypair for the encrypted, authenticated control plane:\n"
    "OUT_PREFIX.key holds the secret key (mode 0600; keep it private) and\n"
    "OUT_PREFIX.pub the public key (give it to peers). Existing files are never\n"
    "overwritten. A producer runs with `ecx serve --curve-secret P.key`, its\n"
    "consumers with `ecx get --curve-server-key P.pub`; to admit only known\n"
    "consumers, list their .pub keys in the producer's --curve-allow file.\n"
    "\n"
    "Exit status: 0 written, 1 failure, 2 usage error.\n";

/* Strip the line's trailing whitespace and leading blanks; NULL for a
 * blank or comment line. */
static char *trim(char *line)
{
    while (*line == ' ' || *line == '\t')
        line++;
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' ||
                 line[n - 1] == '\t'))
        line[--n] = '\0';
    return *line && *line != '#' ? line : NULL;
}

/* The comment `ecx keygen` heads each file with, by role. */
#define SECRET_HEADER "# ecx CURVE secret key"
#define PUBLIC_HEADER "# ecx CURVE public key"

/* Read path's keys (at most max bytes): each non-comment line must be one
 * Z85 key. Calls take(key, arg) for each; returns the count, or -1 (message
 * printed). A file whose keygen header names the other role (secret: a
 * secret key is expected) is refused, naming the file. */
static int read_keys(const char *opt, const char *path, size_t max, bool secret,
                     int (*take)(const char *, void *), void *arg)
{
    size_t len;
    char *text = file_read(opt, path, max, &len);
    if (!text) return -1;
    int n = 0, lineno = 0, rc = 0;
    for (char *line = text, *end; !rc && line < text + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end) end = text + len; /* the last line, without a newline */
        *end = '\0';
        lineno++;
        if (!strncmp(line, secret ? PUBLIC_HEADER : SECRET_HEADER, strlen(PUBLIC_HEADER))) {
            fprintf(stderr, "ecx: %s: '%s' is a %s key (`ecx keygen`'s %s); %s wants %s\n", opt,
                    path, secret ? "public" : "secret", secret ? ".pub" : ".key", opt,
                    secret ? "a secret key (.key)" : "public keys (.pub)");
            rc = -1;
            break;
        }
        char *k = trim(line);
        if (!k) continue;
        if (!key_z85_ok(k)) {
            /* Say where, never what: the line may be a secret. */
            fprintf(stderr, "ecx: %s: '%s' line %d is not a Z85 CURVE key (40 characters)\n", opt,
                    path, lineno);
            rc = -1;
        } else if (take(k, arg)) {
            rc = -1;
        } else {
            n++;
        }
    }
    sodium_memzero(text, len);
    free(text);
    return rc ? rc : n;
}

static int take_one(const char *k, void *arg)
{
    char *out = arg;
    if (out[0]) return -1; /* a second key: refused by the caller's count */
    memcpy(out, k, KEY_Z85_LEN + 1);
    return 0;
}

int key_file_read(const char *opt, const char *path, bool secret, char out[KEY_Z85_LEN + 1])
{
    out[0] = '\0';
    int n = read_keys(opt, path, FILE_MAX_KEY, secret, take_one, out);
    if (n != 1) {
        if (n == 0 || out[0])
            fprintf(stderr, "ecx: %s: '%s' must hold exactly one key\n", opt, path);
        sodium_memzero(out, KEY_Z85_LEN + 1);
        return -1;
    }
    return 0;
}

static int take_many(const char *k, void *arg)
{
    key_list *l = arg;
    char **v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v) return -1;
    l->v = v;
    if (!(v[l->n] = strdup(k))) return -1;
    l->n++;
    return 0;
}

int allow_file_read(const char *opt, const char *path, key_list *out)
{
    int n = read_keys(opt, path, FILE_MAX_ALLOW, false, take_many, out);
    if (n == 0) fprintf(stderr, "ecx: %s: '%s' holds no key\n", opt, path);
    return n > 0 ? 0 : -1;
}

void key_list_free(key_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL, l->n = 0;
}

/* Create path (O_EXCL, mode) and write text to it. */
static int write_new(const char *path, mode_t mode, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        fprintf(stderr, "ecx: keygen: cannot create '%s': %s\n", path, strerror(errno));
        return -1;
    }
    size_t len = strlen(text), off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    if (off < len || fsync(fd) || close(fd)) {
        fprintf(stderr, "ecx: keygen: cannot write '%s': %s\n", path, strerror(errno));
        if (off < len) close(fd);
        unlink(path);
        return -1;
    }
    return 0;
}

int cmd_keygen(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(HELP, stdout);
        return EXIT_OK;
    }
    if (argc != 2 || !argv[1][0] || argv[1][0] == '-')
        return usage_error("keygen takes one OUT_PREFIX (try 'ecx keygen --help')");
    char key_path[4096], pub_path[4096];
    if ((size_t)snprintf(key_path, sizeof key_path, "%s.key", argv[1]) >= sizeof key_path ||
        (size_t)snprintf(pub_path, sizeof pub_path, "%s.pub", argv[1]) >= sizeof pub_path)
        return usage_error("keygen: OUT_PREFIX is too long");
    struct stat st;
    if (!lstat(key_path, &st) || !lstat(pub_path, &st)) {
        fprintf(stderr, "ecx: keygen: '%s' or '%s' already exists; not overwriting\n", key_path,
                pub_path);
        return EXIT_FAIL;
    }
    char pub[KEY_Z85_LEN + 1], sec[KEY_Z85_LEN + 1];
    if (zmq_curve_keypair(pub, sec)) {
        fprintf(stderr, "ecx: keygen: %s\n", zmq_strerror(zmq_errno()));
        return EXIT_FAIL;
    }
    char text[200];
    snprintf(text, sizeof text, SECRET_HEADER ": keep private\n%s\n", sec);
    int rc = write_new(key_path, 0600, text);
    sodium_memzero(sec, sizeof sec);
    sodium_memzero(text, sizeof text);
    if (rc) return EXIT_FAIL;
    snprintf(text, sizeof text, PUBLIC_HEADER "\n%s\n", pub);
    if (write_new(pub_path, 0644, text)) {
        unlink(key_path);
        return EXIT_FAIL;
    }
    fprintf(stderr, "ecx: wrote %s (secret, 0600) and %s\n", key_path, pub_path);
    return EXIT_OK;
}

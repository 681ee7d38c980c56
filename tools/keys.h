/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keys — CURVE key files for the command line: `ecx keygen`, and reading
 * the key and allow files that serve and get take. See keys.c.
 */
#ifndef ECX_KEYS_H
#define ECX_KEYS_H

#include <stdbool.h>
#include <stddef.h>

/* Length of a Z85 CURVE key (32 bytes), without the NUL. */
#define KEY_Z85_LEN 40

/* True if z85 is exactly KEY_Z85_LEN Z85 characters that decode to a key. */
bool key_z85_ok(const char *z85);

/* Keys of an allow file, each a NUL-terminated Z85 string. */
typedef struct key_list {
    char **v;
    size_t n;
} key_list;

/* Read the one Z85 key in path into out: a secret key (secret) or a public
 * one; a file `ecx keygen` wrote for the other role is refused. 0, or -1 with
 * a message on stderr naming opt and path (never the key). */
int key_file_read(const char *opt, const char *path, bool secret, char out[KEY_Z85_LEN + 1]);
/* Read one or more public keys, one per line; 0 or -1 (message printed). */
int allow_file_read(const char *opt, const char *path, key_list *out);
void key_list_free(key_list *l);

int cmd_keygen(int argc, char **argv);

#endif

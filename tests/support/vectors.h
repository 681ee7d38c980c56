/* SPDX-License-Identifier: Apache-2.0 */
/* vectors — load the JSON test vectors of tests/vectors/ (a copy of
 * shared/vectors, so the project stands alone). Test-only helper. */
#ifndef ECXI_TEST_VECTORS_H
#define ECXI_TEST_VECTORS_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

static inline json_t *load_vectors(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", ECX_VECTORS, name);
    json_error_t err;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &err);
    if (!j) {
        fprintf(stderr, "cannot load %s: %s (line %d)\n", path, err.text, err.line);
        exit(1);
    }
    return j;
}

#endif

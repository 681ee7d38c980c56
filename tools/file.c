/* SPDX-License-Identifier: Apache-2.0 */
/* file — regular files of bounded size for the command line; see file.h. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int file_open(const char *what, const char *path, uint64_t max, bool nofollow, uint64_t *size)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
    struct stat st;
    const char *problem = NULL;
    if (fd < 0 || fstat(fd, &st))
        problem = errno == ELOOP && nofollow ? "is a symbolic link" : strerror(errno);
    else if (!S_ISREG(st.st_mode))
        problem = S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file";
    if (problem) {
        fprintf(stderr, "ecx: %s '%s': cannot read: %s\n", what, path, problem);
    } else if ((uint64_t)st.st_size > max) {
        fprintf(stderr, "ecx: %s '%s': larger than %llu bytes\n", what, path,
                (unsigned long long)max);
    } else {
        *size = (uint64_t)st.st_size;
        return fd;
    }
    if (fd >= 0) close(fd);
    return -1;
}

int file_read_fd(const char *what, const char *path, int fd, void *buf, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = read(fd, (char *)buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            fprintf(stderr, "ecx: %s '%s': %s\n", what, path,
                    k < 0 ? strerror(errno) : "changed while being read");
            return -1;
        }
        done += (size_t)k;
    }
    return 0;
}

char *file_read(const char *what, const char *path, size_t max, size_t *len)
{
    uint64_t size;
    int fd = file_open(what, path, max, false, &size);
    if (fd < 0) return NULL;
    char *buf = malloc((size_t)size + 1);
    if (!buf) fprintf(stderr, "ecx: %s '%s': out of memory\n", what, path);
    if (buf && file_read_fd(what, path, fd, buf, (size_t)size)) {
        free(buf);
        buf = NULL;
    }
    close(fd);
    if (buf) buf[size] = '\0', *len = (size_t)size;
    return buf;
}

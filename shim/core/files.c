/* SPDX-License-Identifier: Apache-2.0
 *
 * files.c: the files clc writes, reached without another user's hands on the way.
 *
 * A path is walked one component at a time from a directory descriptor (openat with O_NOFOLLOW):
 * a symbolic link on the way is followed only when this user or root owns it and no one else can
 * replace it (the directory holding it is this user's or root's, and writable by no one else or
 * sticky). clc-run's own check (clc/outputs.py) walks paths by the same rule. A link someone else
 * controls could point the capture at any file this user may write; a link in a directory others
 * can write could be swapped between two of clc's opens. The last component is never followed: the
 * caller opens it with O_NOFOLLOW.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

/* As the kernel's own limit on links in one lookup. */
#define MAX_LINKS 40

/* Whether a link found in directory `dir` may be followed. */
static int trusted_link(int dir, const struct stat *link) {
    struct stat d;
    uid_t me = geteuid();
    if (link->st_uid != me && link->st_uid != 0) return 0;
    if (fstat(dir, &d) != 0 || (d.st_uid != me && d.st_uid != 0)) return 0;
    /* Sticky: only the link's owner, the folder's and root may remove or rename it. */
    return (d.st_mode & S_ISVTX) || !(d.st_mode & (S_IWGRP | S_IWOTH));
}

int clc_open_parent(const char *path, char *last, size_t last_size) {
    char work[2 * PATH_MAX], target[PATH_MAX];
    size_t len = strlen(path);
    if (!len || len >= sizeof work) {
        errno = len ? ENAMETOOLONG : ENOENT;
        return -1;
    }
    memcpy(work, path, len + 1);
    int fd = open(work[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    char *p = work;
    for (int links = 0; fd >= 0;) {
        while (*p == '/') p++;
        char *end = strchr(p, '/');
        char *next = end ? end + 1 : p + strlen(p);
        while (*next == '/') next++;
        if (end) *end = '\0';
        if (!*next) { /* the last component: the caller's to open */
            if (!*p || strcmp(p, ".") == 0 || strcmp(p, "..") == 0 || strlen(p) >= last_size) {
                close(fd);
                errno = *p && strlen(p) >= last_size ? ENAMETOOLONG : EISDIR;
                return -1;
            }
            memcpy(last, p, strlen(p) + 1);
            return fd;
        }
        struct stat st;
        if (strcmp(p, ".") == 0) {
            p = next;
            continue;
        }
        if (fstatat(fd, p, &st, AT_SYMLINK_NOFOLLOW) != 0) break;
        if (S_ISLNK(st.st_mode)) {
            ssize_t n;
            if (++links > MAX_LINKS) {
                errno = ELOOP;
                break;
            }
            if (!trusted_link(fd, &st)) {
                errno = EPERM;
                break;
            }
            n = readlinkat(fd, p, target, sizeof target - 1);
            if (n <= 0 || (size_t)n + 1 + strlen(next) + 1 > sizeof work) {
                if (n > 0) errno = ENAMETOOLONG;
                break;
            }
            target[n] = '\0';
            /* The rest of the path after the link's target. */
            size_t rest = strlen(next);
            memmove(work + n + 1, next, rest + 1);
            memcpy(work, target, (size_t)n);
            work[n] = '/';
            p = work;
            if (target[0] == '/') {
                int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
                close(fd);
                fd = root;
            }
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            errno = ENOTDIR;
            break;
        }
        int sub = openat(fd, p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        fd = sub;
        p = next;
    }
    if (fd >= 0) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return -1;
}

int clc_create_file(const char *path, int force, struct stat *out) {
    char name[NAME_MAX + 1];
    int dir = clc_open_parent(path, name, sizeof name);
    if (dir < 0) return -1;
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    int fd = openat(dir, name, flags, 0600);
    if (fd < 0 && errno == EEXIST && force) {
        /* Replaced, never truncated in place: another process may hold the old file open. */
        struct stat st;
        if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            st.st_uid == geteuid() && unlinkat(dir, name, 0) == 0)
            fd = openat(dir, name, flags, 0600);
        else
            errno = EEXIST;
    }
    int e = errno;
    if (fd >= 0 && (fstat(fd, out) != 0 || !S_ISREG(out->st_mode))) {
        close(fd);
        fd = -1;
        e = EINVAL;
    }
    close(dir);
    errno = e;
    return fd;
}

int clc_reopen_file(const char *path, const struct stat *was) {
    char name[NAME_MAX + 1];
    struct stat st;
    int dir = clc_open_parent(path, name, sizeof name);
    if (dir < 0) return -1;
    /* Not O_APPEND: the capture's counts are overwritten in place, and Linux's pwrite on an
     * O_APPEND descriptor appends whatever the offset. */
    int fd = openat(dir, name, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int e = errno;
    close(dir);
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != was->st_dev || st.st_ino != was->st_ino)) {
        close(fd);
        fd = -1;
        e = ESTALE;
    }
    errno = e;
    return fd;
}

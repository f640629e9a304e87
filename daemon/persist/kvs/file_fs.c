/* file_fs: file-system chores of the embedded store (see file_fs.h). */
#include "persist/kvs/file_fs.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/errmsg.h"
#include "kvnode.h"

/* Free space below which a root is unhealthy: writes are about to fail. */
#define KVS_FS_MIN_FREE (UINT64_C(1) << 20)

int kvs_fs_mkdir_p(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, mode) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, mode) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

int kvs_fs_errno_code(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return -KVNODE_ENOSPC;
    case ENOMEM:
        return -KVNODE_ENOMEM;
    default:
        return -KVNODE_EIO;
    }
}

int kvs_fs_root(const char *path, char *real, char *err, size_t errlen)
{
    struct stat st;

    if (kvs_fs_mkdir_p(path, 0755) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: cannot create root directory %s: %s", path, strerror(e));
        return kvs_fs_errno_code(e);
    }
    if (!realpath(path, real) || stat(real, &st) < 0 || !S_ISDIR(st.st_mode)) {
        errmsg_set(err, errlen, "kvs file: root %s is not a directory", path);
        return -KVNODE_EIO;
    }
    if (access(real, W_OK | X_OK) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: root directory %s is not writable: %s", real, strerror(e));
        return -KVNODE_EIO;
    }
    return 0;
}

int kvs_fs_dir_health(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
        errmsg_set(err, errlen, "kvs file: root %s is gone or not a directory", path);
        return -KVNODE_EIO;
    }
    if (access(path, W_OK | X_OK) < 0) {
        int e = errno;
        errmsg_set(err, errlen, "kvs file: root %s is not writable: %s", path, strerror(e));
        return -KVNODE_EIO;
    }
    struct statvfs vfs;
    if (statvfs(path, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < KVS_FS_MIN_FREE) {
        errmsg_set(err, errlen, "kvs file: the file system of %s is full (%" PRIu64 " bytes free)", path,
                   (uint64_t)vfs.f_bavail * vfs.f_frsize);
        return -KVNODE_ENOSPC;
    }
    return 0;
}

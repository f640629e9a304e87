/* file_fs: the file-system chores of the embedded store (the segment log,
 * kvs/file.h): making and checking a root directory, its health, and what
 * an errno means as a KVNODE_E* code. */
#ifndef KVNODE_KVS_FILE_FS_H
#define KVNODE_KVS_FILE_FS_H

#include <stddef.h>
#include <sys/types.h>

/* mkdir -p; 0, or -1 with errno set. */
int kvs_fs_mkdir_p(const char *path, mode_t mode);
/* ENOSPC, EDQUOT, EFBIG -> -KVNODE_ENOSPC; ENOMEM -> -KVNODE_ENOMEM; else -KVNODE_EIO. */
int kvs_fs_errno_code(int e);
/* Create path (and its parents) when missing and check that it is a
 * writable directory; its resolved path into real (PATH_MAX bytes). 0 or a
 * negative KVNODE_E* code with err set. */
int kvs_fs_root(const char *path, char *real, char *err, size_t errlen);
/* The health of a root: it exists, is writable and its file system is not
 * full. 0 or a negative KVNODE_E* code with err set. */
int kvs_fs_dir_health(const char *path, char *err, size_t errlen);

#endif

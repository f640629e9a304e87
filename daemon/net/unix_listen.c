/* unix_listen: a listening unix socket at a path (see unix_listen.h). */
#include "net/unix_listen.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/errmsg.h"

int unix_listen(const char *path, unsigned mode, int backlog, const char *what, char *err, size_t errlen)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    struct stat st;
    size_t len = strlen(path);
    int fd;

    if (len == 0 || len >= sizeof sa.sun_path) {
        errmsg_set(err, errlen, "%s: a socket path must be 1 to %zu bytes", what, sizeof sa.sun_path - 1);
        return -1;
    }
    memcpy(sa.sun_path, path, len + 1);
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            errmsg_set(err, errlen, "%s: exists and is not a socket", what);
            return -1;
        }
        /* A live listener answers; a stale file (its owner died) does not. */
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            close(fd);
            errmsg_set(err, errlen, "%s: another process is listening there", what);
            return -1;
        }
        if (fd >= 0)
            close(fd);
        unlink(path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        errmsg_set(err, errlen, "%s: socket: %s", what, strerror(errno));
        return -1;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        errmsg_set(err, errlen, "%s: bind: %s", what, strerror(errno));
        close(fd);
        return -1;
    }
    if (chmod(path, mode) < 0 || listen(fd, backlog) < 0) {
        errmsg_set(err, errlen, "%s: %s", what, strerror(errno));
        close(fd);
        unlink(path);
        return -1;
    }
    return fd;
}

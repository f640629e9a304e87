/* fake_server_io: socket I/O for the fake kvnoded servers that unit tests of
 * libkvnode run (test_client_proto's thread, test_client_cuda's process):
 * bounded reads, and frames sent with descriptors attached. */
#ifndef KVNODE_TEST_FAKE_SERVER_IO_H
#define KVNODE_TEST_FAKE_SERVER_IO_H

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FAKE_IO_MAX_FDS 4

/* Reads exactly n bytes from fd into buf, waiting at most wait_ms for each
 * piece; 0, or -1 on a timeout, an error or EOF. */
static inline int fake_io_read_full(int fd, uint8_t *buf, size_t n, int wait_ms)
{
    while (n > 0) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        ssize_t r;

        if (poll(&p, 1, wait_ms) <= 0)
            return -1;
        r = read(fd, buf, n);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

/* One sendmsg of buf[0..len) on fd with nfds (<= FAKE_IO_MAX_FDS)
 * descriptors attached to its first byte (SCM_RIGHTS; none when nfds is
 * 0): what sendmsg returns, or -1 (EINVAL) for too many descriptors. */
static inline ssize_t fake_io_send_fds(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * FAKE_IO_MAX_FDS)];
        struct cmsghdr align;
    } u;
    struct iovec iov = { .iov_base = (void *)(uintptr_t)buf, .iov_len = len };
    struct msghdr mh = { 0 };

    if (nfds > FAKE_IO_MAX_FDS) {
        errno = EINVAL;
        return -1;
    }
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (nfds > 0) {
        struct cmsghdr *cm;

        memset(&u, 0, sizeof u);
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    return sendmsg(fd, &mh, MSG_NOSIGNAL);
}

#endif

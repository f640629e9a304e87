/* Readers (issue 15, item 5): a client that declares itself a reader at HELLO
 * (kvnode_connect_flags with KVNODE_CONNECT_READER) is lent its tenant's
 * memory through read-only descriptors, against a real daemon:
 *
 * - its mapping is read-only: a write to a lent block, in a forked child,
 *   dies with SIGSEGV and leaves the block's bytes as they were; mprotect
 *   cannot make it writable (EACCES); its reads (copying, in place, inline)
 *   are byte-exact what a writer put;
 * - its PUT_BEGIN, PUT_INLINE, put and DELETE are refused with
 *   KVNODE_EDENIED and a message saying it declared itself a reader; a writer
 *   of the same tenant still writes and deletes;
 * - an old-style client (no flag) still maps read-write: its forked child's
 *   write lands, and the reader sees it (clients of a tenant trust each other);
 * - on the wire: the HELLO reply says reader and passes an O_RDONLY fd that
 *   cannot be mapped PROT_WRITE; a HELLO without the field (an old client)
 *   gets an O_RDWR fd; a reader of another uid cannot reopen its fd for
 *   writing through /proc/self/fd (the memfd's mode is 0400; needs root to
 *   act as another user);
 * - bounded descriptors: one read-only descriptor per arena opened at start,
 *   so 50 reader connections add exactly their 50 sockets to the daemon;
 * - simulated HBM is lent to readers read-only the same way. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tenants_util.h"
#include "kvnode.pb-c.h"
#include "wire.h"

#define BLOCK   (64u << 10)          /* bytes per block */
#define NKEYS   8u
#define SEED    UINT64_C(0x5EED)
#define READERS 50
#define OTHER_UID 65534
#define CONF    "memory.host_bytes=16MiB\nmemory.slab_bytes=1MiB\nserver.socket_mode=0666\n"
#define SIM_CONF CONF "hbm.backend=sim\nhbm.bytes=1MiB\n"
#define DENIED_TEXT "declared itself a reader"

static kvnode_layout reader_layout(void)
{
    return kvh_layout("reader-model-7b", BLOCK, 1, 0);
}

static kvnode_client *connect_reader(const kvh_daemon *d, const kvnode_layout *l, int device)
{
    kvnode_client *c = NULL;
    int rc = kvnode_connect_flags(d->sock, l, device, KVNODE_CONNECT_READER, &c);
    ck_assert_msg(rc == 0 && c, "reader connect: %d (%s): %s", rc, kvnode_strerror(rc),
                  kvnode_connect_error());
    ck_assert_int_eq(kvnode_is_reader(c), 1);
    return c;
}

/* A daemon (CONF) and a writer connected to it with *l = reader_layout(). */
static kvnode_client *start_with_writer(kvh_daemon *d, kvnode_layout *l)
{
    kvnode_client *w;
    KVH_START(d, CONF);
    *l = reader_layout();
    KVH_CONNECT(d, l, &w);
    return w;
}

/* n keys of chain put by the writer. */
static void writer_puts(kvnode_client *w, kvnode_key *keys, size_t n, uint64_t chain)
{
    kvh_chain(keys, n, chain);
    ck_assert_msg(kvh_put(w, keys, n, SEED) == 0, "writer put: %s", kvh_error());
}

/* The end of a test: reader and writer closed, the daemon stopped. */
static void close_and_stop(kvh_daemon *d, kvnode_client *r, kvnode_client *w)
{
    kvnode_close(r);
    kvnode_close(w);
    KVH_STOP_DESTROY(d);
}

/* --- a write in a forked child ---------------------------------------------- */

/* Flip the first byte at arg. No core file: the reader's child is meant to die. */
static int poke_main(void *arg)
{
    struct rlimit none = { 0, 0 };
    setrlimit(RLIMIT_CORE, &none);
    signal(SIGSEGV, SIG_DFL);   /* die by the signal, also under ASan (which catches it) */
    volatile uint8_t *p = arg;
    p[0] = (uint8_t)~p[0];
    return 0;
}

/* The wait status of a child that flips the byte at p. */
static int poke(void *p)
{
    pid_t pid = proc_spawn(&(struct proc_opts){ .fn = poke_main, .arg = p }, NULL);
    ck_assert_msg(pid > 0, "%s", proc_error());
    int st = proc_wait(&pid, 10000);
    ck_assert_msg(st >= 0, "child: %s", proc_error());
    return st;
}

static void expect_segv(void *p, const char *what)
{
    int st = poke(p);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
                  "%s: the child's write did not fault: status %d (exited %d, signal %d)", what, st,
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* --- the HELLO on the wire ---------------------------------------------------- */

/* Send a HELLO for reader_layout() (reader: with the field set; else without
 * it, as a client that predates it) and receive the reply with its fds.
 * Returns the connected socket (the caller closes it), or -1 with msg set. */
static int raw_hello(const char *sock, bool reader, bool *granted, int *fds, size_t *nfds,
                     char *msg, size_t msglen)
{
    kvnode_layout l = reader_layout();
    Kvnode__Request req = KVNODE__REQUEST__INIT;
    Kvnode__HelloRequest h = KVNODE__HELLO_REQUEST__INIT;
    Kvnode__Layout lo = KVNODE__LAYOUT__INIT;
    uint8_t hdr[4], *buf = NULL;
    char cbuf[CMSG_SPACE(8 * sizeof(int))];
    struct timeval tv = { .tv_sec = 10 };

    *nfds = 0;
    lo.model = (char *)(uintptr_t)l.model;
    lo.dtype = (char *)(uintptr_t)l.dtype;
    lo.block_tokens = l.block_tokens;
    lo.block_bytes = l.block_bytes;
    lo.num_layers = l.num_layers;
    lo.kv_heads = l.kv_heads;
    lo.head_dim = l.head_dim;
    lo.tp_size = l.tp_size;
    lo.tp_rank = l.tp_rank;
    lo.extra = (char *)"";
    h.min_version = h.max_version = WIRE_PROTOCOL_VERSION;
    h.layout = &lo;
    h.cuda_device = -1;
    h.reader = reader;
    req.id = 1;
    req.op_case = KVNODE__REQUEST__OP_HELLO;
    req.hello = &h;
    size_t len = kvnode__request__get_packed_size(&req);
    uint8_t out[512];
    if (len > sizeof out) {
        snprintf(msg, msglen, "HELLO of %zu bytes", len);
        return -1;
    }
    kvnode__request__pack(&req, out);
    int s = kvh_raw_connect(sock);
    if (s < 0) {
        snprintf(msg, msglen, "connect: %s", kvh_error());
        return -1;
    }
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (kvh_raw_send_frame(s, out, (uint32_t)len) < 0) {
        snprintf(msg, msglen, "send: %s", strerror(errno));
        goto fail;
    }
    /* The fds come with the reply's first bytes. */
    struct iovec iov = { hdr, sizeof hdr };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                         .msg_controllen = sizeof cbuf };
    if (recvmsg(s, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC) != (ssize_t)sizeof hdr) {
        snprintf(msg, msglen, "recvmsg of the reply's header: %s", strerror(errno));
        goto fail;
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            memcpy(fds, CMSG_DATA(cm), n * sizeof(int));
            *nfds = n;
        }
    }
    uint32_t plen = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                    (uint32_t)hdr[3] << 24;
    if (plen == 0 || plen > (1u << 20) || !(buf = malloc(plen)) ||
        recv(s, buf, plen, MSG_WAITALL) != (ssize_t)plen) {
        snprintf(msg, msglen, "reply of %" PRIu32 " bytes not received: %s", plen, strerror(errno));
        goto fail;
    }
    Kvnode__Response *resp = kvnode__response__unpack(NULL, plen, buf);
    if (!resp || resp->result_case != KVNODE__RESPONSE__RESULT_HELLO) {
        snprintf(msg, msglen, "not a HELLO reply: %s", resp && resp->error && resp->error->message
                 ? resp->error->message : "undecodable");
        if (resp)
            kvnode__response__free_unpacked(resp, NULL);
        goto fail;
    }
    *granted = resp->hello->reader;
    kvnode__response__free_unpacked(resp, NULL);
    free(buf);
    return s;
fail:
    free(buf);
    for (size_t i = 0; i < *nfds; i++)
        close(fds[i]);
    *nfds = 0;
    close(s);
    return -1;
}

/* --- the daemon's descriptors --------------------------------------------------- */

struct fd_count {
    int total;
    int memfd_rw, memfd_ro;     /* descriptors of the host arena's memfd, by access mode */
};

static struct fd_count daemon_fds(pid_t pid)
{
    struct fd_count n = { 0, 0, 0 };
    char dir[64], path[384], link[256];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *dp = opendir(dir);
    ck_assert_msg(dp != NULL, "opendir %s: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        n.total++;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k < 0)
            continue;
        link[k] = '\0';
        if (strncmp(link, "/memfd:kvnode-host", 18) != 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/fdinfo/%s", (int)pid, e->d_name);
        char *info = kvh_read_file(path, NULL), *f = info ? strstr(info, "flags:") : NULL;
        ck_assert_msg(f != NULL, "%s has no flags", path);
        unsigned long flags = strtoul(f + 6, NULL, 8);
        if ((flags & O_ACCMODE) == O_RDONLY)
            n.memfd_ro++;
        else
            n.memfd_rw++;
        free(info);
    }
    closedir(dp);
    return n;
}

/* --- tests ------------------------------------------------------------------------ */

START_TEST(reader_maps_read_only)
{
    kvh_daemon d;
    kvnode_layout l;
    kvnode_client *w = start_with_writer(&d, &l), *r;
    ck_assert_int_eq(kvnode_is_reader(w), 0);
    kvnode_key keys[NKEYS];
    writer_puts(w, keys, NKEYS, 1);
    r = connect_reader(&d, &l, -1);

    /* The reader reads back byte-exact what the writer put, every way. */
    size_t got;
    int rc = kvh_get_verify(r, keys, NKEYS, SEED, 0, &got);
    ck_assert_msg(rc == 0 && got == NKEYS, "copying get: rc %d got %zu: %s", rc, got, kvh_error());
    rc = kvh_get_verify(r, keys, NKEYS, SEED, 1, &got);
    ck_assert_msg(rc == 0 && got == NKEYS, "inline get: rc %d got %zu: %s", rc, got, kvh_error());
    rc = kvh_get_zc_verify(r, keys, NKEYS, SEED, &got);
    ck_assert_msg(rc == 0 && got == NKEYS, "zero-copy get: rc %d got %zu: %s", rc, got, kvh_error());

    /* Its mapping is read-only: a write faults and changes nothing. */
    kvnode_lease lease;
    kvnode_loc locs[NKEYS];
    KVH_OK(r, kvnode_get_begin(r, keys, NKEYS, &lease, locs, &got));
    ck_assert_uint_eq(got, NKEYS);
    ck_assert_int_eq(locs[0].tier, KVNODE_TIER_HOST);
    expect_segv(locs[0].ptr, "reader");
    expect_segv(locs[NKEYS - 1].ptr, "reader, last block");
    ck_assert_msg(kvh_verify(locs[0].ptr, BLOCK, keys[0], SEED) == 0, "%s", kvh_error());
    long page = sysconf(_SC_PAGESIZE);
    void *at = (void *)((uintptr_t)locs[0].ptr & ~(uintptr_t)(page - 1));
    errno = 0;
    ck_assert_int_eq(mprotect(at, (size_t)page, PROT_READ | PROT_WRITE), -1);
    ck_assert_int_eq(errno, EACCES);
    KVH_OK(r, kvnode_get_end(r, lease));

    /* An old-style client maps read-write: its child's write lands, and the
     * reader sees it (the in-tenant contract). Flipped back afterwards. */
    kvnode_loc wl[1];
    KVH_OK(w, kvnode_get_begin(w, keys, 1, &lease, wl, &got));
    ck_assert_uint_eq(got, 1);
    uint8_t before = *(volatile uint8_t *)wl[0].ptr;
    int st = poke(wl[0].ptr);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer's child: status %d", st);
    kvnode_lease rl;
    kvnode_loc rloc[1];
    KVH_OK(r, kvnode_get_begin(r, keys, 1, &rl, rloc, &got));
    ck_assert_uint_eq(got, 1);
    ck_assert_uint_eq(*(volatile uint8_t *)rloc[0].ptr, (uint8_t)~before);
    st = poke(wl[0].ptr);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer's child: status %d", st);
    ck_assert_msg(kvh_verify(rloc[0].ptr, BLOCK, keys[0], SEED) == 0, "%s", kvh_error());
    KVH_OK(r, kvnode_get_end(r, rl));
    KVH_OK(w, kvnode_get_end(w, lease));
    close_and_stop(&d, r, w);
}
END_TEST

START_TEST(reader_writes_refused)
{
    kvh_daemon d;
    kvnode_layout l;
    kvnode_client *w = start_with_writer(&d, &l), *r;
    kvnode_key keys[NKEYS], more[NKEYS];
    writer_puts(w, keys, NKEYS, 2);
    kvh_chain(more, NKEYS, 3);
    r = connect_reader(&d, &l, -1);

    kvnode_lease lease = 77;
    kvnode_loc locs[NKEYS];
    int rc = kvnode_put_begin(r, more, NKEYS, KVNODE_TIER_HOST, &lease, locs);
    ck_assert_int_eq(rc, -KVNODE_EDENIED);
    ck_assert_msg(strstr(kvnode_last_error(r), DENIED_TEXT), "put_begin: %s", kvnode_last_error(r));
    ck_assert_int_eq(kvh_put_inline(r, more, NKEYS, SEED), -KVNODE_EDENIED);
    ck_assert_msg(strstr(kvnode_last_error(r), DENIED_TEXT), "put_inline: %s", kvnode_last_error(r));
    ck_assert_int_eq(kvh_put(r, more, NKEYS, SEED), -KVNODE_EDENIED);
    size_t deleted = 99;
    rc = kvnode_delete(r, keys, NKEYS, &deleted);
    ck_assert_int_eq(rc, -KVNODE_EDENIED);
    ck_assert_msg(strstr(kvnode_last_error(r), DENIED_TEXT) && strstr(kvnode_last_error(r), "delete"),
                  "delete: %s", kvnode_last_error(r));
    /* Nothing was written or deleted, and the connection still reads. */
    ck_assert_int_eq(kvh_match(w, keys, NKEYS), NKEYS);
    ck_assert_int_eq(kvh_match(w, more, NKEYS), 0);
    ck_assert_int_eq(kvh_match(r, keys, NKEYS), NKEYS);

    /* A writer of the same tenant still writes and deletes; the reader sees it. */
    ck_assert_msg(kvh_put(w, more, NKEYS, SEED + 1) == 0, "writer put: %s", kvh_error());
    size_t got;
    rc = kvh_get_zc_verify(r, more, NKEYS, SEED + 1, &got);
    ck_assert_msg(rc == 0 && got == NKEYS, "reader get: rc %d got %zu: %s", rc, got, kvh_error());
    KVH_OK(w, kvnode_delete(w, more, NKEYS, &deleted));
    ck_assert_uint_eq(deleted, NKEYS);
    ck_assert_int_eq(kvh_match(r, more, NKEYS), 0);
    close_and_stop(&d, r, w);
}
END_TEST

START_TEST(wire_hello_access_modes)
{
    kvh_daemon d;
    KVH_START(&d, CONF);
    char msg[256];
    int fds[8];
    size_t nfds;
    bool granted = false;

    /* A reader: the reply says so and the fd is O_RDONLY, not mappable for writing. */
    int s = raw_hello(d.sock, true, &granted, fds, &nfds, msg, sizeof msg);
    ck_assert_msg(s >= 0, "%s", msg);
    ck_assert_msg(granted, "HELLO reply of a reader does not say reader");
    ck_assert_uint_eq(nfds, 1);
    ck_assert_int_eq(fcntl(fds[0], F_GETFL) & O_ACCMODE, O_RDONLY);
    errno = 0;
    ck_assert_msg(mmap(NULL, 1u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0) == MAP_FAILED,
                  "a reader's fd was mapped PROT_WRITE");
    ck_assert_int_eq(errno, EACCES);
    void *p = mmap(NULL, 1u << 20, PROT_READ, MAP_SHARED, fds[0], 0);
    ck_assert_msg(p != MAP_FAILED, "PROT_READ mapping of a reader's fd: %s", strerror(errno));
    munmap(p, 1u << 20);
    close(fds[0]);
    close(s);

    /* A HELLO without the field (an old client): read-write as before. */
    s = raw_hello(d.sock, false, &granted, fds, &nfds, msg, sizeof msg);
    ck_assert_msg(s >= 0, "%s", msg);
    ck_assert_msg(!granted, "HELLO reply of an old-style client says reader");
    ck_assert_uint_eq(nfds, 1);
    ck_assert_int_eq(fcntl(fds[0], F_GETFL) & O_ACCMODE, O_RDWR);
    p = mmap(NULL, 1u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    ck_assert_msg(p != MAP_FAILED, "read-write mapping of an old-style client's fd: %s", strerror(errno));
    munmap(p, 1u << 20);
    close(fds[0]);
    close(s);
    KVH_STOP_DESTROY(&d);
}
END_TEST

/* As another uid: a reader's fd cannot be reopened for writing. */
enum { REOPEN_DENIED = 0, REOPEN_HELLO = 10, REOPEN_NOFD, REOPEN_WRITABLE, REOPEN_OTHER };

static int reopen_main(void *arg)
{
    const kvh_daemon *d = arg;
    char msg[256], path[64];
    int fds[8];
    size_t nfds;
    bool granted;
    int s = raw_hello(d->sock, true, &granted, fds, &nfds, msg, sizeof msg);
    if (s < 0) {
        fprintf(stderr, "uid %d: %s\n", (int)getuid(), msg);
        return REOPEN_HELLO;
    }
    if (nfds != 1 || !granted)
        return REOPEN_NOFD;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fds[0]);
    int rw = open(path, O_RDWR);
    if (rw >= 0)
        return REOPEN_WRITABLE;
    if (errno != EACCES) {
        fprintf(stderr, "uid %d: open %s O_RDWR: %s\n", (int)getuid(), path, strerror(errno));
        return REOPEN_OTHER;
    }
    return REOPEN_DENIED;
}

START_TEST(reader_of_other_uid_cannot_reopen_for_writing)
{
    TENANTS_NEEDS_ROOT("readers: the reopen test");
    kvh_daemon d;
    tenants_start(&d, CONF);
    int st = tenants_status_as(reopen_main, &d, OTHER_UID, 20000);
    ck_assert_msg(st >= 0 && WIFEXITED(st), "child: status %d %s", st, proc_error());
    ck_assert_msg(WEXITSTATUS(st) == REOPEN_DENIED, "child uid %d: exit %d (%d: reopened for writing)",
                  OTHER_UID, WEXITSTATUS(st), REOPEN_WRITABLE);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(reader_descriptors_bounded)
{
    kvh_daemon d;
    kvnode_layout l;
    kvnode_client *w = start_with_writer(&d, &l), *r[READERS];
    struct fd_count before = daemon_fds(d.pid);
    /* One memfd, one read-only reopen of it, opened at start. */
    ck_assert_int_eq(before.memfd_rw, 1);
    ck_assert_int_eq(before.memfd_ro, 1);
    for (int i = 0; i < READERS; i++)
        r[i] = connect_reader(&d, &l, -1);
    ck_assert_int_eq(kvh_match(r[READERS - 1], (kvnode_key[]){ 1 }, 1), 0);
    struct fd_count after = daemon_fds(d.pid);
    fprintf(stderr, "readers: daemon descriptors %d before, %d with %d readers connected "
            "(memfd: %d read-write, %d read-only)\n", before.total, after.total, READERS,
            after.memfd_rw, after.memfd_ro);
    ck_assert_int_eq(after.total - before.total, READERS);
    ck_assert_int_eq(after.memfd_rw, 1);
    ck_assert_int_eq(after.memfd_ro, 1);
    for (int i = 0; i < READERS; i++)
        kvnode_close(r[i]);
    uint64_t until = kvh_now_ms() + 10000;
    struct fd_count end;
    while ((end = daemon_fds(d.pid)).total != before.total && kvh_now_ms() < until)
        kvh_sleep_ms(10);
    ck_assert_int_eq(end.total, before.total);
    kvnode_close(w);
    KVH_STOP_DESTROY(&d);
}
END_TEST

START_TEST(reader_sim_hbm_read_only)
{
    kvh_daemon d;
    KVH_START(&d, SIM_CONF);
    kvnode_layout l = reader_layout();
    kvnode_client *w = NULL, *r;
    int rc = kvnode_connect_device(d.sock, &l, 0, &w);
    ck_assert_msg(rc == 0, "writer connect: %s", kvnode_connect_error());
    kvnode_key keys[NKEYS];
    kvh_chain(keys, NKEYS, 4);
    kvnode_lease lease;
    kvnode_loc locs[NKEYS];
    KVH_OK(w, kvnode_put_begin(w, keys, NKEYS, KVNODE_TIER_HBM, &lease, locs));
    for (size_t i = 0; i < NKEYS; i++) {
        ck_assert_msg(locs[i].ptr && locs[i].tier == KVNODE_TIER_HBM, "slot %zu not in HBM", i);
        kvh_fill(locs[i].ptr, BLOCK, keys[i], SEED);
    }
    KVH_OK(w, kvnode_put_commit(w, lease));
    r = connect_reader(&d, &l, 0);
    size_t got;
    KVH_OK(r, kvnode_get_begin(r, keys, NKEYS, &lease, locs, &got));
    ck_assert_uint_eq(got, NKEYS);
    for (size_t i = 0; i < NKEYS; i++) {
        ck_assert_msg(locs[i].tier == KVNODE_TIER_HBM && locs[i].device == 0,
                      "block %zu read from tier %d device %d", i, locs[i].tier, locs[i].device);
        ck_assert_msg(kvh_verify(locs[i].ptr, BLOCK, keys[i], SEED) == 0, "%s", kvh_error());
    }
    expect_segv(locs[0].ptr, "reader, simulated HBM");
    ck_assert_msg(kvh_verify(locs[0].ptr, BLOCK, keys[0], SEED) == 0, "%s", kvh_error());
    KVH_OK(r, kvnode_get_end(r, lease));
    rc = kvnode_put_begin(r, keys, NKEYS, KVNODE_TIER_HBM, &lease, locs);
    ck_assert_int_eq(rc, -KVNODE_EDENIED);
    close_and_stop(&d, r, w);
}
END_TEST

int main(void)
{
    const TTest *tests[] = { reader_maps_read_only, reader_writes_refused, wire_hello_access_modes,
                             reader_of_other_uid_cannot_reopen_for_writing,
                             reader_descriptors_bounded, reader_sim_hbm_read_only };
    return kvh_run_suite("readers", "readers", 60, tests, sizeof tests / sizeof tests[0]);
}

/* kvnode-bench-kvs: the KVS front end (issue 18) next to libkvnode, same run,
 * same daemon, same traffic. For batches of 64 and 256 blocks of 64 KiB:
 *   - acquire/seal round trip: acquire(create) and seal (then release)
 *     through the front end, as rtp-llm's KVSClient does them (a fresh curl
 *     handle, i.e. a new TCP connection, per call); put_begin and put_commit
 *     through libkvnode;
 *   - write throughput: the whole store (reserve, copy into the shared
 *     mapping, commit) per batch;
 *   - read throughput: acquire(read) + copy out + release, against
 *     get_begin + copy out + get_end.
 * Prints median and p90 per step and MiB/s per batch size, the KVS/libkvnode
 * ratios the issue-30 targets are stated in, and where one KVS create and
 * one read spend their time. Not a test: no figure is asserted.
 *
 * A third door bounds what any server could do for the read with this
 * client: a process that does no work (canned replies: the daemon's own
 * /acquire reply of the read just made, 204 for /release), called the same
 * way (a fresh connection per call), its objects copied out of the same
 * mapping. Its throughput over libkvnode's is the ceiling of the read ratio
 * on this machine: what is left under it is the client's and the kernel's.
 * --rounds N (default 20).
 *
 * The KVS client costs what rtp-llm's does (kvs_fast_client.h: JSON written
 * straight into a buffer, a one-pass reader, results in a hash map), so the
 * figures show the server's cost rather than jansson's in the client; it is
 * checked against jansson before anything is measured (bench_kvs_check.h).
 * Every reply is validated and every byte read back compared. */
#define BENCH_NAME "kvnode-bench-kvs"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "harness.h"
#include "kvs_client.h"
#include "kvs_fast_client.h"
#include "bench_kvs_check.h"

#define BB     (64u << 10)
#define DEP    "bench-model-0123456789abcdef"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void pct(uint64_t *v, size_t n, double *p50, double *p90)
{
    qsort(v, n, sizeof *v, cmp_u64);
    *p50 = (double)v[n / 2] / 1000.0;
    *p90 = (double)v[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1] / 1000.0;
}

struct figures {
    uint64_t *acq, *seal, *write, *read;   /* ns per round */
    uint64_t *noop_read;                    /* kvs only: the read against the no-work server */
};

/* ---- the no-work server ------------------------------------------------------ */

#define NOOP_REPLY_MAX (4u << 20)

/* A child process answering on 127.0.0.1: /acquire with the reply in
 * shared memory (set by the parent before each call), anything else 204.
 * One blocking accept, read, write, close per call: less than any real
 * server does. */
struct noop_server {
    char url[64];
    pid_t pid;
    size_t *len;     /* shared: the canned /acquire reply */
    char *reply;
};

static void noop_serve(int ls, const struct noop_server *s)
{
    static char buf[1 << 20];
    for (;;) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0)
            continue;
        size_t got = 0;
        long clen = -1;
        const char *hend = NULL;
        ssize_t n;
        while (got < sizeof buf - 1 && (n = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0) {
            got += (size_t)n;
            buf[got] = '\0';
            if (!hend && (hend = strstr(buf, "\r\n\r\n")) != NULL) {
                const char *c = strcasestr(buf, "Content-Length:");
                clen = c ? atol(c + 15) : 0;
            }
            if (hend && (size_t)(hend + 4 - buf) + (size_t)clen <= got)
                break;
        }
        if (strncmp(buf, "POST /acquire ", 14) == 0) {
            char head[160];
            int hl = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              "Content-Length: %zu\r\n\r\n", *s->len);
            struct iovec v[2] = { { head, (size_t)hl }, { s->reply, *s->len } };
            struct msghdr m = { .msg_iov = v, .msg_iovlen = 2 };
            if (sendmsg(fd, &m, MSG_NOSIGNAL) < 0)
                perror(BENCH_NAME ": no-work server: sendmsg");
        } else {
            static const char nc[] = "HTTP/1.1 204 No Content\r\n\r\n";
            if (send(fd, nc, sizeof nc - 1, MSG_NOSIGNAL) < 0)
                perror(BENCH_NAME ": no-work server: send");
        }
        close(fd);
    }
}

static void noop_start(struct noop_server *s)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    void *shm = mmap(NULL, sizeof(size_t) + NOOP_REPLY_MAX, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ls < 0 || shm == MAP_FAILED || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 128) < 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) < 0)
        die("no-work server", "cannot listen on 127.0.0.1");
    s->len = shm;
    s->reply = (char *)shm + sizeof(size_t);
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    pid_t parent = getpid();
    if ((s->pid = fork()) < 0)
        die("no-work server", "fork failed");
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(0);
        noop_serve(ls, s);
    }
    close(ls);
}

static void noop_stop(struct noop_server *s)
{
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    munmap(s->len, sizeof(size_t) + NOOP_REPLY_MAX);
}

static double mibps(uint64_t *ns, size_t rounds, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < rounds; i++)
        total += ns[i];
    return (double)n * BB * rounds / (1 << 20) / ((double)total / 1e9);
}

/* Where one KVS call's time goes (ns, curl's figures in us). */
struct split {
    uint64_t body, perform, parse, lookup, copy, seal, release;
    uint64_t captured;   /* not timed: the copy of the reply for the no-work server */
    int64_t connect_us, first_byte_us, total_us;
};

#define NSPLIT 10
static const char *const split_names[NSPLIT] = { "body", "perform", "connect", "1st byte-connect", "transfer",
                                                 "parse", "lookup", "memcpy", "seal", "release" };

static void split_values(const struct split *s, double *v)   /* us */
{
    v[0] = (double)s->body / 1e3;
    v[1] = (double)s->perform / 1e3;
    v[2] = (double)s->connect_us;
    v[3] = (double)(s->first_byte_us - s->connect_us);
    v[4] = (double)(s->total_us - s->first_byte_us);
    v[5] = (double)s->parse / 1e3;
    v[6] = (double)s->lookup / 1e3;
    v[7] = (double)s->copy / 1e3;
    v[8] = (double)s->seal / 1e3;
    v[9] = (double)s->release / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of each part over the rounds, one line. */
static void print_split(const char *what, size_t n, const struct split *s, size_t rounds)
{
    double *col = malloc(rounds * sizeof *col), v[NSPLIT];
    printf("  %s %zu, p50 us:", what, n);
    for (int k = 0; k < NSPLIT; k++) {
        for (size_t r = 0; r < rounds; r++) {
            split_values(&s[r], v);
            col[r] = v[k];
        }
        qsort(col, rounds, sizeof *col, cmp_double);
        if (k == 8 && col[rounds / 2] == 0)
            continue;   /* reads have no seal */
        printf(" %s %.0f,", split_names[k], col[rounds / 2]);
    }
    double mean = 0;
    for (size_t r = 0; r < rounds; r++) {
        col[r] = (double)(s[r].body + s[r].perform + s[r].parse + s[r].lookup + s[r].copy + s[r].seal +
                          s[r].release) / 1e3;
        mean += col[r] / (double)rounds;
    }
    qsort(col, rounds, sizeof *col, cmp_double);
    printf(" whole call p50 %.0f (mean %.0f)\n", col[rounds / 2], mean);
    free(col);
}

/* Block i's first bytes name (batch, round, door, i). */
static void stamp(uint8_t *src, size_t n, size_t round, uint64_t door)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t id[4] = { n, round, door, i };
        memcpy(src + i * BB, id, sizeof id);
    }
}

/* acquire through the fast client; dies unless 200 and a well-formed reply. */
static void kvs_acquire_at(const char *url, bool create, const char *const *keys, size_t n, kvsf_reply *rep,
                           struct split *sp, const struct noop_server *capture)
{
    kvsf_buf body = { 0 };
    long status;
    char why[200];
    uint64_t t0 = kvh_now_ns();
    if (!kvsf_acquire_body(&body, create, keys, n, BB, 60, create ? "kvs_store_bench" : "kvs_read_bench"))
        die("acquire", "out of memory");
    uint64_t t1 = kvh_now_ns();
    kvsf_curl_times ct;
    memset(rep, 0, sizeof *rep);
    if (kvsf_call(url, "acquire", body.p, body.n, &rep->text, &status, &ct) < 0)
        die(create ? "acquire(create)" : "acquire(read)", "transport error");
    uint64_t t2 = kvh_now_ns();
    free(body.p);
    if (capture) {   /* the reply as sent, for the no-work server (the parse below works in place) */
        if (rep->text.n > NOOP_REPLY_MAX)
            die("acquire(read)", "a reply over the no-work server's room");
        memcpy(capture->reply, rep->text.p, rep->text.n);
        *capture->len = rep->text.n;
    }
    uint64_t t2b = kvh_now_ns();
    if (status != 200) {
        char m[512];
        snprintf(m, sizeof m, "status %ld: %.400s", status, rep->text.p ? rep->text.p : "(no reply)");
        die(create ? "acquire(create)" : "acquire(read)", m);
    }
    if (kvsf_parse_acquire(rep, why, sizeof why) != 0)
        die(create ? "acquire(create): malformed reply" : "acquire(read): malformed reply", why);
    uint64_t t3 = kvh_now_ns();
    sp->body = t1 - t0;
    sp->perform = t2 - t1;
    sp->parse = t3 - t2b;
    sp->captured = t2b - t2;
    sp->connect_us = ct.connect_us;
    sp->first_byte_us = ct.starttransfer_us;
    sp->total_us = ct.total_us;
}

static void kvs_acquire(const kvsc *c, bool create, const char *const *keys, size_t n, kvsf_reply *rep,
                        struct split *sp)
{
    kvs_acquire_at(c->url, create, keys, n, rep, sp, NULL);
}

/* The objects of keys in rep, by key: every key must be there, once, inside
 * the mapping and at least BB bytes; no entry for a key not asked. */
static void kvs_lookup(const kvsc *c, const kvsf_reply *rep, const char *const *keys, size_t n, uint64_t *offs,
                       const char *what)
{
    if (rep->n != n || rep->nulls)
        die(what, "the reply does not hold exactly the objects asked for");
    for (size_t i = 0; i < n; i++) {
        const kvsf_object *o = kvsf_find(rep, keys[i], strlen(keys[i]));
        if (!o)
            die(what, "an object is missing");
        if (o->bytes < BB || o->offset > c->size || c->size - o->offset < BB)
            die(what, "an object's handle is outside the mapping or too small");
        offs[i] = o->offset;
    }
}

static void kvs_round(const kvsc *c, const struct noop_server *noop, size_t n, int round, uint8_t *src, uint8_t *dst,
                      struct figures *f, size_t r, struct split *wsp, struct split *rsp)
{
    char **names = calloc(n, sizeof *names);
    uint64_t *offs = malloc(n * sizeof *offs);
    for (size_t i = 0; i < n; i++) {
        names[i] = malloc(128);
        snprintf(names[i], 128, "rtp_llm/v1/" DEP "/tp-0/group-0/block-%" PRId64,
                 (int64_t)(n * 1000000 + (size_t)round * n + i));
    }
    const char *const *keys = (const char *const *)names;
    kvsf_reply rep;
    char lease[160];
    uint64_t t0 = kvh_now_ns();
    kvs_acquire(c, true, keys, n, &rep, wsp);
    uint64_t t1 = kvh_now_ns();
    if (!rep.lease_len || rep.lease_len >= sizeof lease)
        die("acquire(create)", "no usable lease_id for fresh keys");
    kvs_lookup(c, &rep, keys, n, offs, "acquire(create)");
    uint64_t t1b = kvh_now_ns();
    for (size_t i = 0; i < n; i++)
        memcpy(c->base + offs[i], src + i * BB, BB);
    memcpy(lease, rep.lease_id, rep.lease_len + 1);
    kvsf_reply_free(&rep);
    uint64_t t2 = kvh_now_ns();
    if (kvsf_lease_call(c->url, "seal", lease, "kvs_store_bench") != 204)
        die("seal", "not 204");
    uint64_t t3 = kvh_now_ns();
    if (kvsf_lease_call(c->url, "release", lease, NULL) != 204)
        die("release", "not 204");
    uint64_t t4 = kvh_now_ns();
    f->acq[r] = t1 - t0;
    f->seal[r] = t3 - t2;
    f->write[r] = t4 - t0;
    wsp->lookup = t1b - t1;
    wsp->copy = t2 - t1b;
    wsp->seal = t3 - t2;
    wsp->release = t4 - t3;

    memset(dst, 0xa5, n * BB);   /* a read that copies nothing must fail the memcmp */
    uint64_t t5 = kvh_now_ns();
    kvs_acquire_at(c->url, false, keys, n, &rep, rsp, noop);
    uint64_t t6 = kvh_now_ns();
    kvs_lookup(c, &rep, keys, n, offs, "acquire(read)");
    uint64_t t7 = kvh_now_ns();
    for (size_t i = 0; i < n; i++)
        memcpy(dst + i * BB, c->base + offs[i], BB);
    if (!rep.lease_len || rep.lease_len >= sizeof lease)
        die("acquire(read)", "no usable lease_id");
    memcpy(lease, rep.lease_id, rep.lease_len + 1);
    kvsf_reply_free(&rep);
    uint64_t t8 = kvh_now_ns();
    if (kvsf_lease_call(c->url, "release", lease, NULL) != 204)
        die("release", "not 204");
    uint64_t t9 = kvh_now_ns();
    f->read[r] = t9 - t5 - rsp->captured;
    rsp->lookup = t7 - t6;
    rsp->copy = t8 - t7;
    rsp->seal = 0;
    rsp->release = t9 - t8;
    if (memcmp(src, dst, n * BB) != 0)
        die("read", "bytes differ");

    /* The same read against the no-work server (its reply: the one above;
     * the lease in it is released already, the objects stay stored). */
    struct split nsp;
    memset(dst, 0xa5, n * BB);
    uint64_t u0 = kvh_now_ns();
    kvs_acquire_at(noop->url, false, keys, n, &rep, &nsp, NULL);
    kvs_lookup(c, &rep, keys, n, offs, "no-work acquire(read)");
    for (size_t i = 0; i < n; i++)
        memcpy(dst + i * BB, c->base + offs[i], BB);
    memcpy(lease, rep.lease_id, rep.lease_len + 1);
    kvsf_reply_free(&rep);
    if (kvsf_lease_call(noop->url, "release", lease, NULL) != 204)
        die("no-work release", "not 204");
    f->noop_read[r] = kvh_now_ns() - u0;
    if (memcmp(src, dst, n * BB) != 0)
        die("no-work read", "bytes differ");
    free(offs);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static void lib_round(kvnode_client *cl, size_t n, int round, uint8_t *src, uint8_t *dst, struct figures *f, size_t r)
{
    kvnode_key *keys = malloc(n * sizeof *keys);
    kvnode_loc *locs = malloc(n * sizeof *locs);
    kvnode_lease lease;
    size_t got;
    for (size_t i = 0; i < n; i++)
        keys[i] = (kvnode_key)(n * 2000000 + (size_t)round * n + i);
    uint64_t t0 = kvh_now_ns();
    check(cl, kvnode_put_begin(cl, keys, n, KVNODE_TIER_HOST, &lease, locs), "put_begin");
    uint64_t t1 = kvh_now_ns();
    for (size_t i = 0; i < n; i++)
        memcpy(locs[i].ptr, src + i * BB, BB);
    uint64_t t2 = kvh_now_ns();
    check(cl, kvnode_put_commit(cl, lease), "put_commit");
    uint64_t t3 = kvh_now_ns();
    f->acq[r] = t1 - t0;
    f->seal[r] = t3 - t2;
    f->write[r] = t3 - t0;
    memset(dst, 0xa5, n * BB);
    uint64_t t4 = kvh_now_ns();
    check(cl, kvnode_get_begin(cl, keys, n, &lease, locs, &got), "get_begin");
    if (got != n)
        die("get_begin", "short prefix");
    for (size_t i = 0; i < n; i++)
        memcpy(dst + i * BB, locs[i].ptr, BB);
    check(cl, kvnode_get_end(cl, lease), "get_end");
    f->read[r] = kvh_now_ns() - t4;
    if (memcmp(src, dst, n * BB) != 0)
        die("read", "bytes differ");
    free(keys);
    free(locs);
}

/* The table's two lines for one batch size, and the KVS/libkvnode ratios. */
static void report(struct figures *fk, struct figures *fl, size_t rounds, size_t n)
{
    double ratio_acq = 0, ratio_w = 0, ratio_r = 0, rd_lib = 0;
    struct figures *fs[2] = { fk, fl };
    const char *names[2] = { "kvs", "libkvnode" };
    for (int k = 0; k < 2; k++) {
        double a50, a90, s50, s90;
        double w = mibps(fs[k]->write, rounds, n), rd = mibps(fs[k]->read, rounds, n);
        pct(fs[k]->acq, rounds, &a50, &a90);
        pct(fs[k]->seal, rounds, &s50, &s90);
        printf("%-9s %6zu  %10.3f %10.3f  %10.3f %10.3f  %10.0f %10.0f\n", names[k], n, a50 / 1000.0,
               a90 / 1000.0, s50 / 1000.0, s90 / 1000.0, w, rd);
        ratio_acq = k == 0 ? a50 : ratio_acq / a50;
        ratio_w = k == 0 ? w : ratio_w / w;
        ratio_r = k == 0 ? rd : ratio_r / rd;
        if (k == 1)
            rd_lib = rd;
        free(fs[k]->acq);
        free(fs[k]->seal);
        free(fs[k]->write);
    }
    printf("  kvs/libkvnode acquire p50 (create) %zu: %.2fx, read throughput: %.2fx, write throughput: %.2fx\n", n,
           ratio_acq, ratio_r, ratio_w);
    double noop = mibps(fk->noop_read, rounds, n), p50k, p50l, p50n, p90;
    pct(fk->read, rounds, &p50k, &p90);
    pct(fl->read, rounds, &p50l, &p90);
    pct(fk->noop_read, rounds, &p50n, &p90);
    printf("  read against a server that does no work (same client, same calls) %zu: %.0f MiB/s, %.2fx of libkvnode: "
           "the ceiling of the read ratio; kvs reaches %.0f%% of it\n", n, noop, noop / rd_lib,
           100.0 * ratio_r * rd_lib / noop);
    printf("  read of %zu, p50 us: kvs %.0f, no-work server %.0f, libkvnode %.0f (libkvnode/kvs %.2fx, libkvnode/no-work "
           "%.2fx)\n", n, p50k, p50n, p50l, p50l / p50k, p50l / p50n);
    free(fk->read);
    free(fl->read);
    free(fk->noop_read);
}

/* The round-trip floors under the figures above, same run: a GET /health on
 * a fresh connection (what every KVS call pays before the server does any
 * work: connect, identify, HTTP in and out), and libkvnode's PING on its
 * open connection. */
static void floor_report(const char *url, kvnode_client *cl, size_t rounds)
{
    size_t n = rounds * 10;
    uint64_t *h = calloc(n, sizeof *h), *p = calloc(n, sizeof *p);
    kvsf_buf out = { 0 };
    long status;
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = kvh_now_ns();
        if (kvsf_call(url, "health", NULL, 0, &out, &status, NULL) != 0 || status != 200)
            die("GET /health", "not 200");
        uint64_t t1 = kvh_now_ns();
        check(cl, kvnode_ping(cl), "ping");
        h[i] = t1 - t0;
        p[i] = kvh_now_ns() - t1;
    }
    double h50, h90, p50, p90;
    pct(h, n, &h50, &h90);
    pct(p, n, &p50, &p90);
    printf("floors: GET /health on a fresh connection p50 %.0f us (p90 %.0f), libkvnode PING p50 %.0f us (p90 %.0f): "
           "%.2fx\n", h50, h90, p50, p90, h50 / p50);
    free(out.p);
    free(h);
    free(p);
}

int main(int argc, char **argv)
{
    size_t rounds = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--quick") == 0)
            rounds = 5;
        else
            die("usage", "kvnode-bench-kvs [--rounds N] [--quick]");
    }
    if (rounds < 2)
        rounds = 2;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char dir[PATH_MAX], conf[PATH_MAX + 256], why[256];
    if (kvh_mkdtemp(dir, sizeof dir) != 0)
        die("mkdtemp", kvh_error());
    size_t need = 2 * rounds * (64 + 256) * (size_t)BB;   /* both doors keep what they wrote */
    snprintf(conf, sizeof conf, "memory.host_bytes=%zuMiB\nkvs_server.enabled=on\nkvs_server.listen=127.0.0.1:0\n"
             "kvs_server.socket_path=%s/kvs.sock\nlog.level=warn\n", (need >> 20) + 128, dir);
    kvh_daemon d;
    if (kvh_start(&d, conf) != 0)
        die("start kvnoded", kvh_error());
    json_t *st = kvh_stats(&d);
    const char *addr = st ? json_string_value(kvh_json_get(st, "kvs_server.http_address")) : NULL;
    if (!addr)
        die("stats", "no kvs_server.http_address");
    char url[128], sock[PATH_MAX + 16];
    snprintf(url, sizeof url, "http://%s", addr);
    json_decref(st);
    snprintf(sock, sizeof sock, "%s/kvs.sock", dir);
    kvsc c;
    if (kvsc_open(&c, url, sock, why, sizeof why) != 0)
        die("kvs handshake", why);
    kvnode_layout l = { .model = DEP, .dtype = "rtp_llm_group_block_v1", .block_tokens = 1, .block_bytes = BB,
                        .num_layers = 1, .kv_heads = 1, .head_dim = 1, .tp_size = 1, .tp_rank = 0,
                        .extra = "kvs_deployment_id=" DEP ";kvs_object_ns=rtp_llm;kvs_version=1;kvs_group=0" };
    kvnode_client *cl;
    if (kvh_connect(&d, &l, &cl) != 0)
        die("kvnode_connect", kvh_error());

    kvsf_check_writer();
    kvsf_check_reader();
    printf("kvnode-bench-kvs: %zu rounds per batch size, blocks of 64 KiB, one daemon, one namespace; the KVS client "
           "parses as rtp-llm's (fast JSON, keyed map; checked against jansson)\n", rounds);
    kvsf_check_live(&c, 256, BB);
    struct noop_server noop;
    noop_start(&noop);
    printf("%-9s %6s  %10s %10s  %10s %10s  %10s %10s\n", "door", "blocks", "acq p50ms", "acq p90ms",
           "seal p50ms", "seal p90ms", "write MiB/s", "read MiB/s");
    static const size_t sizes[2] = { 64, 256 };
    for (int s = 0; s < 2; s++) {
        size_t n = sizes[s];
        uint8_t *src = malloc(n * BB), *dst = malloc(n * BB);
        for (size_t i = 0; i < n * BB; i++)
            src[i] = (uint8_t)(i * 131 + n);
        memset(dst, 0, n * BB);   /* touched before the first round: no page faults in the first read */
        struct figures fk = { calloc(rounds, 8), calloc(rounds, 8), calloc(rounds, 8), calloc(rounds, 8),
                              calloc(rounds, 8) };
        struct figures fl = { calloc(rounds, 8), calloc(rounds, 8), calloc(rounds, 8), calloc(rounds, 8), NULL };
        struct split *wsp = calloc(rounds, sizeof *wsp), *rsp = calloc(rounds, sizeof *rsp);
        for (size_t r = 0; r < rounds; r++) {   /* interleaved: the same conditions for both */
            stamp(src, n, r, 0);   /* each block written once: a stale or wrong object fails the memcmp */
            kvs_round(&c, &noop, n, (int)r, src, dst, &fk, r, &wsp[r], &rsp[r]);
            stamp(src, n, r, 1);
            lib_round(cl, n, (int)r, src, dst, &fl, r);
        }
        report(&fk, &fl, rounds, n);
        print_split("kvs create+write", n, wsp, rounds);
        print_split("kvs read", n, rsp, rounds);
        free(wsp);
        free(rsp);
        free(src);
        free(dst);
    }
    floor_report(url, cl, rounds);
    noop_stop(&noop);
    kvnode_close(cl);
    kvsc_close(&c);
    int rc = kvh_stop(&d, 0);
    kvh_destroy(&d);
    return rc == 0 ? 0 : 1;
}

/* kvnode-bench-node: the figures of issue 32's table, each next to a peer
 * measured in the same run (not part of `make test`; nothing is asserted,
 * every byte and count read back is checked and a wrong one stops the run).
 *
 * Peers: redis-server on a unix socket in a temp dir with hiredis as the
 * client, a raw unix-socket ping-pong (the kernel's floor for one round trip
 * between two processes), and memcpy of the same access pattern. Every
 * figure is taken with client and server (every thread of kvnoded /
 * redis-server / the echo process) pinned to the same CPU and to different
 * CPUs (sched_setaffinity; the first two CPUs this program may use, the
 * server on the first), and without --quick not pinned as well.
 *
 *  1. Round trips of one client: raw ping-pong (16 bytes each way), kvnode
 *     PING, kvnode MATCH of 16 stored keys, redis PING (pre-formatted, one
 *     write + one read); each the best of 3 interleaved rounds.
 *  2. Syscalls per round trip, counted: `perf stat -e raw_syscalls:sys_enter`
 *     attached to the server and to a client process while it makes N round
 *     trips (skipped with the reason when perf cannot count them).
 *  3. 16-key MATCH round trips/s of 4 and 16 client processes vs redis
 *     pipelines of 16 EXISTS, the keys present and absent; each the best
 *     of 3 interleaved rounds (--quick: 2), with that round's CPU time per
 *     round trip of the server (/proc/<pid>/stat) and of its clients
 *     (getrusage of the reaped children), user and kernel apart. Both
 *     doors keep the same CPUs as busy, so the ratio is redis's CPU per
 *     round trip over kvnode's; "ceiling" is what it would be if kvnoded and
 *     libkvnode ran no user code at all: redis's CPU per round trip over
 *     kvnode's kernel time plus the user time its system calls cost (a raw
 *     ping-pong client's user time per call, measured first: in this guest a
 *     call's entry and exit are partly accounted as user time). That is the
 *     kernel's share, which no change to the daemon's or library's code removes.
 *  4. MATCH x256 of random keys over 1 M stored 1 KiB blocks vs MATCH x256 of
 *     256 hot keys (mean and median latency; kvnoded's CPU time per MATCH,
 *     from the schedstat of each of its threads), and the daemon's memory per
 *     block at 1 M blocks: its RssAnon delta across the population / blocks
 *     added (the host tier is a memfd shared with the clients, RssShmem
 *     where the daemon touches it, never RssAnon: RssAnon is the index and
 *     the rest of the daemon's heap).
 *  5. Zero-copy GET (get_begin + a memcpy per block out of the arena +
 *     get_end) and PUT (put_begin + a memcpy per block in + put_commit) of
 *     chains of 256 blocks of 64 KiB and 1 MiB vs memcpy per block of the
 *     same chain with the same cache state (a buffer touched once per
 *     iteration as the arena's blocks are, and each copy after the same
 *     untimed sweep as its reference: clearing GET's destination);
 *     median of interleaved iterations.
 *     Buffers page-aligned as the arena's blocks are. The evidence printed
 *     with it: each part's median (round trips, the copy), a kvnode PING and
 *     a memcpy into a destination 16 bytes off and one of PUT's pattern into
 *     a memfd of the bench's own (shared memory, as the arena) in the same iterations (and
 *     after them PUT's copy alone into private memory, that memfd and the
 *     arena's slots, in turns after the same sweep), page
 *     faults per iteration of each part, and the page size / huge pages of
 *     the arena's mapping and of memcpy's buffers (/proc/self/smaps); a raw
 *     unix-socket round trip with the echo process after the same sweep as
 *     the PING (the kernel's floor for a round trip after idle) and a raw
 *     send to it not waited for (the floor for get_end's and
 *     put_commit_nowait's notice), kvnoded's
 *     CPU time per get_begin / put_begin / PING (schedstat, median, from
 *     after the sweep that precedes each, the daemon idle then, to its
 *     reply; the tail after the reply's write may be left out, alike for
 *     all three),
 *     and the ceiling memcpy / (memcpy + raw round trip): one round trip is
 *     the least any design that asks the daemon can do (PUT as measured
 *     makes two, put_commit being waited for; every other iteration's PUT
 *     pipelines its commit with kvnode_put_commit_nowait and makes one);
 *     with one raw send added, the ceiling of a batch that also tells the
 *     daemon it ended (get_end, put_commit_nowait) without waiting.
 *
 *     Where the hugetlb pool (vm.nr_hugepages, the operator's: nothing is
 *     reserved here) has room, the 64 KiB blocks once more with the host
 *     tier in 2 MiB pages (memory.huge_pages=on) and the references'
 *     arena-side buffers (GET's source, PUT's destination, the memfd) in
 *     2 MiB pages too: the same copies with the page size the only change.
 *
 * Each daemon is started and its host tier wholly reserved (its populate
 * thread done) before anything is measured. MemAvailable is read first:
 * section 4 uses fewer blocks and section 5 leaves out 1 MiB blocks when
 * less than twice what they need is free.
 *
 * Usage: kvnode-bench-node [--quick] [--section3] [--section4] [--section5]
 * (--quick: shorter runs, under a minute; --sectionN: only that section). $KVNODED names the daemon
 * (default build/kvnoded). */
#include <errno.h>
#include <hiredis.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define BENCH_NAME "kvnode-bench-node"
#include "bench_util.h"

#define KEYS16      16
#define CHAIN       256
#define MAX_CLIENTS 16
#define RAW_MSG     16          /* bytes each way of the raw ping-pong */

static bool quick;
static bool mc_only;    /* --section3: only section 3 */
static bool big_only;   /* --section4: only section 4 */
static bool zc_only;    /* --section5: only section 5 */
static int cpu_a = -1, cpu_b = -1;   /* the first two CPUs this process may run on */

struct pin_mode {
    const char *name;
    int server_cpu, client_cpu;
};
#define MAX_MODES 3
static struct pin_mode modes[MAX_MODES];
static int nmodes;

static double now_s(void)
{
    return (double)kvh_now_ns() / 1e9;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* --- pinning ------------------------------------------------------------------ */

static cpu_set_t all_cpus;

/* cpu -1: every CPU this program may use (not pinned). */
static void pin_tid(pid_t tid, int cpu)
{
    cpu_set_t s = all_cpus;
    if (cpu >= 0) {
        CPU_ZERO(&s);
        CPU_SET(cpu, &s);
    }
    if (sched_setaffinity(tid, sizeof s, &s) != 0 && errno != ESRCH) {
        char m[64];
        snprintf(m, sizeof m, "task %d to CPU %d: %s", (int)tid, cpu, strerror(errno));
        die("sched_setaffinity", m);
    }
}

/* Every thread of pid to cpu (threads started later inherit it). */
static void pin_process(pid_t pid, int cpu)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    if (!dir)
        die("opendir", path);
    struct dirent *e;
    while ((e = readdir(dir)))
        if (e->d_name[0] != '.')
            pin_tid((pid_t)atoi(e->d_name), cpu);
    closedir(dir);
}

static void unpin_self(void)
{
    sched_setaffinity(0, sizeof all_cpus, &all_cpus);
}

/* --- counters and memory ------------------------------------------------------ */

/* The figure of one /proc/meminfo line ("MemAvailable", "HugePages_Free",
 * ...): kB, or a count; 0 when absent. */
static uint64_t meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    size_t len = strlen(key);
    unsigned long long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, len) == 0 && line[len] == ':' && sscanf(line + len + 1, "%llu", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

static uint64_t mem_available(void)
{
    return meminfo("MemAvailable") << 10;
}

/* --- redis-server on a unix socket ------------------------------------------------ */

struct redis {
    char dir[PATH_MAX], sock[PATH_MAX + 16];
    pid_t pid;
};

static redisContext *redis_connect(const char *sock)
{
    redisContext *rc = redisConnectUnix(sock);
    if (!rc || rc->err) {
        if (rc)
            redisFree(rc);
        return NULL;
    }
    return rc;
}

static void redis_expect_status(redisContext *rc, const char *want, const char *what)
{
    redisReply *r = NULL;
    if (redisGetReply(rc, (void **)&r) != REDIS_OK || !r)
        die(what, rc->errstr[0] ? rc->errstr : "no reply");
    if ((r->type != REDIS_REPLY_STATUS && r->type != REDIS_REPLY_STRING) || strcmp(r->str, want) != 0)
        die(what, "unexpected reply");
    freeReplyObject(r);
}

static int redis_start(struct redis *r, char *why, size_t whylen)
{
    memset(r, 0, sizeof *r);
    if (kvh_mkdtemp(r->dir, sizeof r->dir) != 0) {
        snprintf(why, whylen, "temp dir: %s", kvh_error());
        return -1;
    }
    snprintf(r->sock, sizeof r->sock, "%s/redis.sock", r->dir);
    char logf[PATH_MAX + 16];
    snprintf(logf, sizeof logf, "%s/redis.log", r->dir);
    const char *argv[] = { "redis-server", "--port", "0", "--unixsocket", r->sock, "--unixsocketperm", "700",
                           "--dir", r->dir, "--save", "", "--appendonly", "no", "--daemonize", "no",
                           "--logfile", logf, NULL };
    struct proc_opts o = { .argv = argv, .in = PROC_NULL, .out = PROC_NULL, .err = PROC_NULL };
    r->pid = proc_spawn(&o, NULL);
    if (r->pid < 0) {
        snprintf(why, whylen, "redis-server: %s", proc_error());
        r->pid = 0;
        return -1;
    }
    for (int t = 0; t < 400; t++) {
        redisContext *rc = redis_connect(r->sock);
        if (rc) {
            redisAppendCommand(rc, "PING");
            redis_expect_status(rc, "PONG", "redis PING");
            redisFree(rc);
            return 0;
        }
        sleep_ms(25);
    }
    snprintf(why, whylen, "redis-server did not answer on %.300s within 10 s", r->sock);
    proc_stop(&r->pid, SIGKILL, 5000);
    return -1;
}

static void redis_stop(struct redis *r)
{
    if (r->pid > 0)
        proc_stop(&r->pid, SIGTERM, 5000);
}

/* --- one connection that makes checked round trips -------------------------------- */

enum op {
    OP_RAW,            /* raw ping-pong with the echo process */
    OP_KV_PING,
    OP_KV_MATCH16,     /* kvnode_match of 16 keys */
    OP_REDIS_PING,
    OP_REDIS_EXISTS16, /* 16 EXISTS in one pipeline */
};

struct conn {
    enum op op;
    bool present;          /* the 16 keys are stored */
    int fd;                /* OP_RAW */
    uint64_t seq;
    kvnode_client *kv;
    redisContext *rc;
    kvnode_key keys[KEYS16];
    char *pipeline;        /* OP_REDIS_EXISTS16: the 16 commands, formatted once */
    long long pipeline_len;
};

struct servers {
    const kvh_daemon *kv;     /* daemon A */
    const char *redis_sock;
    int raw_fd;               /* the client end of the echo process's socket pair */
};

static const kvnode_layout *layout16;

/* The 16 keys of client i: present chains 100 + i, absent ones 900 + i. */
static void keys_of(kvnode_key *keys, int client, bool present)
{
    kvh_chain(keys, KEYS16, (uint64_t)(present ? 100 : 900) + (uint64_t)client);
}

static void redis_key(char *buf, size_t len, kvnode_key k)
{
    snprintf(buf, len, "kvnode:%" PRId64, (int64_t)k);
}

static void conn_open(struct conn *c, enum op op, const struct servers *s, int client, bool present)
{
    memset(c, 0, sizeof *c);
    c->op = op;
    c->present = present;
    c->fd = -1;
    keys_of(c->keys, client, present);
    switch (op) {
    case OP_RAW:
        c->fd = s->raw_fd;
        break;
    case OP_KV_PING:
    case OP_KV_MATCH16:
        if (kvh_connect(s->kv, layout16, &c->kv) != 0)
            die("kvnode connect", kvh_error());
        break;
    case OP_REDIS_PING:
    case OP_REDIS_EXISTS16:
        c->rc = redis_connect(s->redis_sock);
        if (!c->rc)
            die("redis connect", s->redis_sock);
        if (op == OP_REDIS_EXISTS16) {
            size_t cap = 0, len = 0;
            for (int i = 0; i < KEYS16; i++) {
                char k[64], *cmd = NULL;
                redis_key(k, sizeof k, c->keys[i]);
                int n = redisFormatCommand(&cmd, "EXISTS %s", k);
                if (n < 0)
                    die("redisFormatCommand", "EXISTS");
                if (len + (size_t)n > cap) {
                    cap = (len + (size_t)n) * 2;
                    c->pipeline = realloc(c->pipeline, cap);
                    if (!c->pipeline)
                        die("malloc", "out of memory");
                }
                memcpy(c->pipeline + len, cmd, (size_t)n);
                len += (size_t)n;
                redisFreeCommand(cmd);
            }
            c->pipeline_len = (long long)len;
        }
        break;
    }
}

static void conn_close(struct conn *c)
{
    if (c->kv)
        kvnode_close(c->kv);
    if (c->rc)
        redisFree(c->rc);
    free(c->pipeline);
    memset(c, 0, sizeof *c);
}

static void read_full(int fd, void *buf, size_t len, const char *what)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die(what, n == 0 ? "end of file" : strerror(errno));
        got += (size_t)n;
    }
}

static void write_full(int fd, const void *buf, size_t len, const char *what)
{
    size_t put = 0;
    while (put < len) {
        ssize_t n = write(fd, (const char *)buf + put, len - put);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die(what, strerror(errno));
        put += (size_t)n;
    }
}

/* One round trip, its answer checked. */
static void conn_op(struct conn *c)
{
    switch (c->op) {
    case OP_RAW: {
        uint64_t msg[RAW_MSG / 8], back[RAW_MSG / 8];
        for (size_t i = 0; i < RAW_MSG / 8; i++)
            msg[i] = ++c->seq * 0x9e3779b97f4a7c15ull;
        write_full(c->fd, msg, sizeof msg, "raw ping");
        read_full(c->fd, back, sizeof back, "raw pong");
        if (memcmp(msg, back, sizeof msg) != 0)
            die("raw pong", "the echo differs from the ping");
        break;
    }
    case OP_KV_PING:
        check(c->kv, kvnode_ping(c->kv), "kvnode_ping");
        break;
    case OP_KV_MATCH16: {
        size_t matched;
        check(c->kv, kvnode_match(c->kv, c->keys, KEYS16, &matched), "kvnode_match");
        if (matched != (c->present ? KEYS16 : 0))
            die("kvnode_match", c->present ? "stored keys not all matched" : "absent keys matched");
        break;
    }
    case OP_REDIS_PING:
        if (redisAppendFormattedCommand(c->rc, "*1\r\n$4\r\nPING\r\n", 14) != REDIS_OK)
            die("redis PING", c->rc->errstr);
        redis_expect_status(c->rc, "PONG", "redis PING");
        break;
    case OP_REDIS_EXISTS16:
        if (redisAppendFormattedCommand(c->rc, c->pipeline, (size_t)c->pipeline_len) != REDIS_OK)
            die("redis EXISTS", c->rc->errstr);
        for (int i = 0; i < KEYS16; i++) {
            redisReply *r = NULL;
            if (redisGetReply(c->rc, (void **)&r) != REDIS_OK || !r)
                die("redis EXISTS", c->rc->errstr[0] ? c->rc->errstr : "no reply");
            if (r->type != REDIS_REPLY_INTEGER || r->integer != (c->present ? 1 : 0))
                die("redis EXISTS", c->present ? "a stored key is missing" : "an absent key exists");
            freeReplyObject(r);
        }
        break;
    }
}

/* --- processes this program forks (they _exit: the harness's atexit
 * cleanup belongs to the parent) ------------------------------------------------ */

static pid_t fork_child(void)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        die("fork", strerror(errno));
    if (pid == 0)
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    return pid;
}

static void reap(pid_t pid, const char *what)
{
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die(what, "a child process failed (see above)");
}

/* The echo process of the raw ping-pong, pinned to cpu: *client_fd gets the
 * other end. */
static pid_t start_echo(int cpu, int *client_fd)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        die("socketpair", strerror(errno));
    pid_t pid = fork_child();
    if (pid == 0) {
        close(sv[0]);
        pin_tid(0, cpu);
        char buf[RAW_MSG];
        for (;;) {
            size_t got = 0;
            while (got < sizeof buf) {
                ssize_t n = read(sv[1], buf + got, sizeof buf - got);
                if (n <= 0)
                    _exit(n == 0 ? 0 : 1);
                got += (size_t)n;
            }
            if (write(sv[1], buf, sizeof buf) != (ssize_t)sizeof buf)
                _exit(1);
        }
    }
    close(sv[1]);
    *client_fd = sv[0];
    return pid;
}

static void stop_echo(pid_t pid, int client_fd)
{
    close(client_fd);
    reap(pid, "echo process");
}

/* --- 1. round trips of one client -------------------------------------------------- */

static double round_trips_per_s(struct conn *c, double seconds)
{
    uint64_t n = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < 64; i++)
            conn_op(c);
        n += 64;
        t = now_s();
    } while (t - t0 < seconds);
    return (double)n / (t - t0);
}

struct rt_result {
    double raw, kv_ping, kv_match, redis_ping;
};

#define RT_ROUNDS 3

/* The four kinds in turn, RT_ROUNDS rounds; each figure is its best round
 * (the machine is shared: the best is the least disturbed). The caller pins
 * the servers. */
static void bench_round_trips(const struct servers *s, const struct pin_mode *m, struct rt_result *out)
{
    double secs = (quick ? 0.6 : 3.0) / RT_ROUNDS;
    int fd;
    pid_t echo = start_echo(m->server_cpu, &fd);
    struct servers ss = *s;
    ss.raw_fd = fd;
    pin_tid(0, m->client_cpu);
    static const enum op ops[4] = { OP_RAW, OP_KV_PING, OP_KV_MATCH16, OP_REDIS_PING };
    struct conn c[4];
    double best[4] = { 0 };
    for (int k = 0; k < 4; k++) {
        conn_open(&c[k], ops[k], &ss, 0, true);
        for (int i = 0; i < 500; i++)
            conn_op(&c[k]);
    }
    for (int r = 0; r < RT_ROUNDS; r++)
        for (int k = 0; k < 4; k++) {
            double v = round_trips_per_s(&c[k], secs);
            if (v > best[k])
                best[k] = v;
        }
    for (int k = 0; k < 4; k++)
        conn_close(&c[k]);
    stop_echo(echo, fd);
    *out = (struct rt_result){ best[0], best[1], best[2], best[3] };
    unpin_self();
}

/* --- 2. syscalls per round trip -------------------------------------------------- */

static bool perf_ok;
static char perf_why[256];

static void perf_probe(void)
{
    const char *argv[] = { "perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "--", "true", NULL };
    struct proc_opts o = { .argv = argv, .in = PROC_NULL };
    char *out = NULL, *err = NULL;
    int st = proc_run(&o, 20000, &out, &err);
    perf_ok = st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && err &&
              strstr(err, "raw_syscalls:sys_enter") && !strstr(err, "not supported") &&
              !strstr(err, "<not counted>");
    if (!perf_ok)
        snprintf(perf_why, sizeof perf_why, "`perf stat -e raw_syscalls:sys_enter` does not count here (%s)",
                 st < 0 ? proc_error() : err && *err ? strtok(err, "\n") : "no output");
    free(out);
    free(err);
}

static pid_t perf_attach(pid_t target, const char *out_path)
{
    char p[16];
    snprintf(p, sizeof p, "%d", (int)target);
    const char *argv[] = { "perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", p, "-o", out_path, NULL };
    struct proc_opts o = { .argv = argv, .in = PROC_NULL, .out = PROC_NULL, .err = PROC_NULL };
    pid_t pid = proc_spawn(&o, NULL);
    if (pid < 0)
        die("perf", proc_error());
    return pid;
}

static double perf_count(pid_t *perf, const char *path)
{
    proc_stop(perf, SIGINT, 10000);
    char *text = kvh_read_file(path, NULL);
    if (!text)
        die("perf output", kvh_error());
    double v = -1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (strstr(line, "raw_syscalls:sys_enter") && line[0] >= '0' && line[0] <= '9')
            v = strtod(line, NULL);
    free(text);
    if (v < 0)
        die("perf output", "no count of raw_syscalls:sys_enter");
    return v;
}

struct sc_result {
    double server, client;
};

/* Client process: open, warm up, "r"; on "g" make n round trips, "d"; exit on "q". */
static void count_syscalls(const struct servers *s, enum op op, pid_t server_pid, const struct pin_mode *m,
                           unsigned n, const char *tmpdir, struct sc_result *out)
{
    int to_child[2], to_parent[2];
    if (pipe(to_child) != 0 || pipe(to_parent) != 0)
        die("pipe", strerror(errno));
    pid_t child = fork_child();
    if (child == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        pin_tid(0, m->client_cpu);
        struct conn c;
        conn_open(&c, op, s, 0, true);
        for (int i = 0; i < 1000; i++)
            conn_op(&c);
        char b = 'r';
        write_full(to_parent[1], &b, 1, "ready");
        read_full(to_child[0], &b, 1, "go");
        for (unsigned i = 0; i < n; i++)
            conn_op(&c);
        b = 'd';
        write_full(to_parent[1], &b, 1, "done");
        read_full(to_child[0], &b, 1, "quit");
        _exit(0);
    }
    close(to_child[0]);
    close(to_parent[1]);
    char b;
    read_full(to_parent[0], &b, 1, "client ready");
    char ps[PATH_MAX + 16], pc[PATH_MAX + 16];
    snprintf(ps, sizeof ps, "%s/perf-server.txt", tmpdir);
    snprintf(pc, sizeof pc, "%s/perf-client.txt", tmpdir);
    pid_t perf_s = perf_attach(server_pid, ps), perf_c = perf_attach(child, pc);
    sleep_ms(quick ? 300 : 500);   /* perf has attached (the idle server's timers add a few) */
    b = 'g';
    write_full(to_child[1], &b, 1, "go");
    read_full(to_parent[0], &b, 1, "client done");
    out->server = perf_count(&perf_s, ps) / n;
    out->client = perf_count(&perf_c, pc) / n;
    b = 'q';
    write_full(to_child[1], &b, 1, "quit");
    close(to_child[1]);
    close(to_parent[0]);
    reap(child, "syscall-count client");
}

/* --- 3. many clients ------------------------------------------------------------------ */

/* CPU time of a run of many clients per round trip (us): the server's
 * (every thread, /proc/<pid>/stat) and the clients' (getrusage of the
 * reaped children), in user space and in the kernel. */
struct mc_cpu {
    double srv_user, srv_sys, cli_user, cli_sys;
    double srv_sleeps;   /* the server's voluntary context switches (waits for work) per round trip */
};

/* The sum over every thread of pid of what read_one takes from that
 * thread's /proc/<pid>/task/<tid>/<file> (threads it cannot read add 0),
 * or -1 when pid has no task directory. */
static long long proc_tasks_sum(pid_t pid, const char *file, long long (*read_one)(FILE *f))
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    long long sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char path[384];
        snprintf(path, sizeof path, "%s/%s/%s", dir, de->d_name, file);
        FILE *f = fopen(path, "r");
        if (f) {
            sum += read_one(f);
            fclose(f);
        }
    }
    closedir(d);
    return sum;
}

static long long status_sleeps(FILE *f)
{
    char line[128];
    long long v;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "voluntary_ctxt_switches: %lld", &v) == 1)
            return v;
    return 0;
}

/* Voluntary context switches of every thread of pid (each a wait that a
 * client's request had to wake), or 0. */
static unsigned long long proc_sleeps(pid_t pid)
{
    long long n = proc_tasks_sum(pid, "status", status_sleeps);
    return n > 0 ? (unsigned long long)n : 0;
}

/* utime + stime of pid in clock ticks. */
static void proc_cpu_ticks(pid_t pid, unsigned long long *user, unsigned long long *sys)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    char *text = kvh_read_file(path, NULL);
    char *p = text ? strrchr(text, ')') : NULL;
    *user = *sys = 0;
    /* After "pid (comm)": state is field 3, utime 14, stime 15. */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", user, sys) != 2)
        die(path, "unreadable");
    free(text);
}

static double tv_us(struct timeval tv)
{
    return (double)tv.tv_sec * 1e6 + (double)tv.tv_usec;
}

/* nclients processes each doing op for the duration; the sum of their
 * rates, and (cpu) the CPU time per round trip of server_pid and of them. */
static double many_clients(const struct servers *s, enum op op, bool present, int nclients, int cpu,
                           double secs, pid_t server_pid, struct mc_cpu *cpu_out)
{
    int ready[2], go[2], res[2];
    if (pipe(ready) != 0 || pipe(go) != 0 || pipe(res) != 0)
        die("pipe", strerror(errno));
    pid_t pids[MAX_CLIENTS];
    for (int i = 0; i < nclients; i++) {
        pids[i] = fork_child();
        if (pids[i] == 0) {
            close(ready[0]);
            close(go[1]);
            close(res[0]);
            pin_tid(0, cpu);
            struct conn c;
            conn_open(&c, op, s, i, present);
            for (int w = 0; w < 50; w++)
                conn_op(&c);
            char b = 'r';
            write_full(ready[1], &b, 1, "ready");
            read_full(go[0], &b, 1, "go");
            uint64_t n = 0;
            double t0 = now_s(), t;
            do {
                for (int k = 0; k < 16; k++)
                    conn_op(&c);
                n += 16;
                t = now_s();
            } while (t - t0 < secs);
            double out[2] = { (double)n / (t - t0), (double)n };
            write_full(res[1], out, sizeof out, "result");
            conn_close(&c);
            _exit(0);
        }
    }
    close(ready[1]);
    close(go[0]);
    close(res[1]);
    char b;
    for (int i = 0; i < nclients; i++)
        read_full(ready[0], &b, 1, "client ready");
    char gos[MAX_CLIENTS];
    memset(gos, 'g', sizeof gos);
    struct rusage ru0, ru1;
    unsigned long long su0, ss0, su1, ss1;
    getrusage(RUSAGE_CHILDREN, &ru0);
    proc_cpu_ticks(server_pid, &su0, &ss0);
    unsigned long long sleeps0 = proc_sleeps(server_pid);
    write_full(go[1], gos, (size_t)nclients, "go");
    double sum = 0, trips = 0;
    for (int i = 0; i < nclients; i++) {
        double r[2];
        read_full(res[0], r, sizeof r, "client result");
        sum += r[0];
        trips += r[1];
    }
    proc_cpu_ticks(server_pid, &su1, &ss1);
    unsigned long long sleeps1 = proc_sleeps(server_pid);
    for (int i = 0; i < nclients; i++)
        reap(pids[i], "client process");
    getrusage(RUSAGE_CHILDREN, &ru1);
    double tick_us = 1e6 / (double)sysconf(_SC_CLK_TCK);
    *cpu_out = (struct mc_cpu){
        (double)(su1 - su0) * tick_us / trips, (double)(ss1 - ss0) * tick_us / trips,
        (tv_us(ru1.ru_utime) - tv_us(ru0.ru_utime)) / trips, (tv_us(ru1.ru_stime) - tv_us(ru0.ru_stime)) / trips,
        (double)(sleeps1 - sleeps0) / trips,
    };
    close(ready[0]);
    close(go[1]);
    close(res[0]);
    return sum;
}

/* User CPU time that one system call costs a process here, though it runs no
 * user code: a raw ping-pong client's user time per round trip (of this
 * process, pinned to cpu, against an echo pinned to echo_cpu) over its two
 * calls (write, read). In a paravirtualised guest a call's entry and exit
 * are partly accounted as user time. */
static double user_us_per_syscall(int echo_cpu, int cpu)
{
    int fd;
    pid_t echo = start_echo(echo_cpu, &fd);
    pin_tid(0, cpu);
    struct conn c = { .op = OP_RAW, .fd = fd };
    struct rusage a, b;
    for (int i = 0; i < 1000; i++)
        conn_op(&c);
    getrusage(RUSAGE_SELF, &a);
    uint64_t n = 0;
    double t0 = now_s();
    do {
        for (int i = 0; i < 256; i++)
            conn_op(&c);
        n += 256;
    } while (now_s() - t0 < (quick ? 0.2 : 0.5));
    getrusage(RUSAGE_SELF, &b);
    unpin_self();
    stop_echo(echo, fd);
    return (tv_us(b.ru_utime) - tv_us(a.ru_utime)) / (double)n / 2;
}

/* The ratio kvnode's door would reach if kvnoded and libkvnode ran no user
 * code: both doors keep the same CPUs busy (the rates are CPU-bound), so rt/s
 * is inversely proportional to CPU per round trip, and what would be left of
 * kvnode's is its kernel time plus the user time its system calls cost
 * (syscalls of them per round trip, user_us each). */
static double mc_ceiling(const struct mc_cpu *kv, const struct mc_cpu *redis, double syscalls, double user_us)
{
    double floor = kv->srv_sys + kv->cli_sys + syscalls * user_us;
    double all = redis->srv_user + redis->srv_sys + redis->cli_user + redis->cli_sys;
    return floor > 0 ? all / floor : 0;
}

/* --- 4. MATCH x256 over 1 M blocks, memory per block ------------------------------- */

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v). */
static uint64_t median_u64(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    return v[n / 2];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static long long schedstat_run_ns(FILE *f)
{
    long long ns;
    return fscanf(f, "%lld", &ns) == 1 ? ns : 0;
}

/* Nanoseconds every thread of pid has run (the first field of each
 * /proc/pid/task/<tid>/schedstat), or -1. */
static long long proc_run_ns(pid_t pid)
{
    return proc_tasks_sum(pid, "schedstat", schedstat_run_ns);
}

/* Mean and median of calls MATCHes of 256 keys; random: 256 fresh random
 * keys of the stored ones per call (drawn outside the timing). cpu_us:
 * kvnoded's (pid's) CPU time per MATCH over the timed calls. */
static void match256(kvnode_client *c, pid_t pid, const kvnode_key *stored, size_t nstored, bool random,
                     unsigned calls, uint64_t *rng, double *mean_us, double *p50_us, double *cpu_us)
{
    long long cpu0 = 0;
    kvnode_key keys[CHAIN];
    double *lat = malloc(calls * sizeof *lat);
    if (!lat)
        die("malloc", "out of memory");
    for (size_t i = 0; i < CHAIN; i++)
        keys[i] = stored[(size_t)(splitmix(i + 77) % nstored)];
    double sum = 0;
    for (unsigned it = 0; it < calls + 100; it++) {
        if (it == 100)
            cpu0 = proc_run_ns(pid);
        if (random)
            for (size_t i = 0; i < CHAIN; i++)
                keys[i] = stored[(size_t)(splitmix((*rng)++) % nstored)];
        uint64_t t0 = kvh_now_ns();
        size_t matched;
        check(c, kvnode_match(c, keys, CHAIN, &matched), "kvnode_match");
        uint64_t dt = kvh_now_ns() - t0;
        if (matched != CHAIN)
            die("kvnode_match", "stored keys not all matched");
        if (it >= 100) {   /* the first 100 warm up */
            lat[it - 100] = (double)dt / 1e3;
            sum += lat[it - 100];
        }
    }
    long long cpu1 = proc_run_ns(pid);
    if (cpu0 < 0 || cpu1 < 0)
        die("/proc/<kvnoded>/task/*/schedstat", "unreadable");
    *cpu_us = (double)(cpu1 - cpu0) / 1e3 / calls;
    qsort(lat, calls, sizeof *lat, cmp_double);
    *mean_us = sum / calls;
    *p50_us = lat[calls / 2];
    free(lat);
}

struct big_result {
    size_t blocks;
    double rnd_cpu[MAX_MODES], hot_cpu[MAX_MODES];   /* kvnoded's CPU per MATCH (us, schedstat) */
    double anon_per_block;                  /* bytes */
    long long anon_kib, shmem_kib;          /* RssAnon / RssShmem deltas */
    double fill_s;
    double rnd_mean[MAX_MODES], rnd_p50[MAX_MODES], hot_mean[MAX_MODES], hot_p50[MAX_MODES];
};

/* Start kvnoded and wait until it has reserved its whole host tier
 * (tiers.host.populate_state "done"): its populate thread would otherwise
 * take CPU time and memory bandwidth from the first figures and be counted
 * in the daemon's CPU time. */
static void start_daemon(kvh_daemon *d, const char *config)
{
    if (kvh_start(d, config) != 0)
        die("start kvnoded", kvh_error());
    for (int i = 0; i < 1200; i++) {   /* 120 s */
        json_t *st = kvh_stats(d);
        const char *state = st ? json_string_value(kvh_json_get(st, "tiers.host.populate_state")) : NULL;
        int done = !state ? -1 : strcmp(state, "done") == 0 ? 1 : strcmp(state, "running") == 0 ? 0 : -1;
        json_decref(st);
        if (done < 0)
            die("kvnoded", "its host tier is not being reserved (tiers.host.populate_state)");
        if (done)
            return;
        usleep(100 * 1000);
    }
    die("kvnoded", "its host tier was not reserved within 120 s");
}

static void bench_big(size_t nblocks, struct big_result *out)
{
    const uint64_t bb = 1024;
    /* The blocks under the high watermark (0.95) with room to spare. */
    uint64_t host = ((uint64_t)((double)(nblocks * bb) / 0.85) + (64ull << 20)) & ~((1ull << 20) - 1);
    char cfg[256];
    snprintf(cfg, sizeof cfg, "memory.host_bytes=%llu\nlog.level=warn\n", (unsigned long long)host);
    kvh_daemon d;
    start_daemon(&d, cfg);
    kvnode_layout l = kvh_layout("bench-node-1m", bb, 1, 0);
    kvnode_client *c;
    if (kvh_connect(&d, &l, &c) != 0)
        die("connect", kvh_error());
    kvnode_key *keys = malloc(nblocks * sizeof *keys);
    unsigned char *src = malloc(CHAIN * bb);
    const void *srcv[CHAIN];
    if (!keys || !src)
        die("malloc", "out of memory");
    for (size_t i = 0; i < nblocks; i++)
        keys[i] = (kvnode_key)(splitmix(0xb10c + i) >> 1);
    for (size_t i = 0; i < CHAIN; i++)
        srcv[i] = src + i * bb;
    /* One chain first, so the namespace and its first slab exist before the baseline. */
    for (size_t i = 0; i < CHAIN; i++)
        kvh_fill(src + i * bb, bb, keys[i], 7);
    check(c, kvnode_put(c, keys, CHAIN, srcv), "kvnode_put");
    long long anon0 = kvh_proc_status_kib(d.pid, "RssAnon"), shm0 = kvh_proc_status_kib(d.pid, "RssShmem");
    double t0 = now_s();
    for (size_t at = CHAIN; at < nblocks; at += CHAIN) {
        size_t n = nblocks - at < CHAIN ? nblocks - at : CHAIN;
        for (size_t i = 0; i < n; i++)
            kvh_fill(src + i * bb, bb, keys[at + i], 7);
        check(c, kvnode_put(c, keys + at, n, srcv), "kvnode_put");
    }
    double fill_s = now_s() - t0;
    long long anon1 = kvh_proc_status_kib(d.pid, "RssAnon"), shm1 = kvh_proc_status_kib(d.pid, "RssShmem");
    if (anon0 < 0 || anon1 < 0 || shm0 < 0 || shm1 < 0)
        die("/proc/<kvnoded>/status", kvh_error());
    long long stored = kvh_stat(&d, "tiers.host.blocks");
    if (stored != (long long)nblocks) {
        char m[128];
        snprintf(m, sizeof m, "tiers.host.blocks is %lld after %zu puts (evicted? host tier %llu MiB)", stored,
                 nblocks, (unsigned long long)(host >> 20));
        die("population", m);
    }
    size_t added = nblocks - CHAIN;
    out->blocks = nblocks;
    out->anon_per_block = (double)(anon1 - anon0) * 1024.0 / (double)added;
    out->anon_kib = anon1 - anon0;
    out->shmem_kib = shm1 - shm0;
    out->fill_s = fill_s;

    /* A sample read back byte-exact. */
    kvnode_key sample[CHAIN];
    for (size_t i = 0; i < CHAIN; i++)
        sample[i] = keys[(size_t)(splitmix(i * 31 + 5) % nblocks)];
    size_t got;
    if (kvh_get_verify(c, sample, CHAIN, 7, 0, &got) != 0 || got != CHAIN)
        die("read back", kvh_error());

    unsigned calls = quick ? 300 : 2000;
    uint64_t rng = 12345;
    for (int m = 0; m < nmodes; m++) {
        pin_process(d.pid, modes[m].server_cpu);
        pin_tid(0, modes[m].client_cpu);
        match256(c, d.pid, keys, nblocks, true, calls, &rng, &out->rnd_mean[m], &out->rnd_p50[m],
                 &out->rnd_cpu[m]);
        match256(c, d.pid, keys, nblocks, false, calls, &rng, &out->hot_mean[m], &out->hot_p50[m],
                 &out->hot_cpu[m]);
        unpin_self();
    }
    kvnode_close(c);
    free(keys);
    free(src);
    int st = kvh_stop(&d, 0);
    kvh_destroy(&d);
    if (st != 0)
        die("kvnoded (1 M blocks)", "did not stop cleanly");
}

static void print_big(const struct big_result *big)
{
    for (int m = 0; m < nmodes; m++)
        printf("    %-15s random mean %6.1f us (p50 %6.1f)   hot mean %6.1f us (p50 %6.1f)   random/hot "
               "%5.2fx (p50 %5.2fx)\n", modes[m].name, big->rnd_mean[m], big->rnd_p50[m], big->hot_mean[m],
               big->hot_p50[m], big->rnd_mean[m] / big->hot_mean[m], big->rnd_p50[m] / big->hot_p50[m]);
    for (int m = 0; m < nmodes; m++)
        printf("    %-15s kvnoded CPU per MATCH (schedstat): random %6.1f us   hot %6.1f us   random/hot %5.2fx\n",
               modes[m].name, big->rnd_cpu[m], big->hot_cpu[m], big->rnd_cpu[m] / big->hot_cpu[m]);
    printf("    memory per block: %.1f B = kvnoded's RssAnon delta (+%lld KiB) over the population of %zu "
           "blocks (%.1f s) / blocks added\n      (the host tier is a memfd shared with the clients, never in "
           "RssAnon; kvnoded's RssShmem grew %lld KiB)\n",
           big->anon_per_block, big->anon_kib, big->blocks, big->fill_s, big->shmem_kib);
}

/* --- 5. zero-copy GET / PUT vs memcpy ------------------------------------------------- */

/* memcpy_get: from a buffer touched once per iteration (as the arena's GET
 * chain is) into the buffer GET copies into; memcpy_put: from the buffer PUT
 * copies from into a buffer touched once per iteration (as PUT's slots).
 * Every figure is the median iteration; the parts of GET and PUT (the
 * round trips, the copies) are medians of their own, and faults are this
 * thread's minor + major page faults per iteration (getrusage). */
struct zc_part {
    double us, faults;
};
enum { ZC_REF_GET, ZC_GET, ZC_GET_BEGIN, ZC_GET_COPY, ZC_GET_END, ZC_REF_PUT, ZC_PUT, ZC_PUT_BEGIN,
       ZC_PUT_COPY, ZC_PUT_COMMIT, ZC_PUT_NW, ZC_PUT_NW_COMMIT, ZC_PING, ZC_REF_OFF16, ZC_RAW, ZC_RAW_SEND,
       ZC_REF_SHM, ZC_PARTS };
static const char *const zc_part_name[ZC_PARTS] = {
    "memcpy (GET's pattern)", "zero-copy GET", "  get_begin round trip", "  copy out of the arena",
    "  get_end (not waited)", "memcpy (PUT's pattern)", "zero-copy PUT", "  put_begin round trip",
    "  copy into the arena", "  put_commit round trip", "PUT, commit not waited", "  put_commit_nowait",
    "kvnode PING round trip", "memcpy, dst 16 B off",
    "raw unix-socket round trip", "raw send, echo not waited", "memcpy into own memfd",
};
/* kvnoded's CPU time per request (every thread's schedstat, from after the
 * sweep that precedes the request to its reply: all of it the request's,
 * the daemon being idle before). */
enum { ZC_CPU_GET_BEGIN, ZC_CPU_PUT_BEGIN, ZC_CPU_PING, ZC_CPUS };
static const char *const zc_cpu_name[ZC_CPUS] = { "get_begin", "put_begin", "PING" };
struct zc_result {
    double memcpy_get_gbs, memcpy_put_gbs, get_gbs, put_gbs;
    double put_nw_gbs;   /* PUT with kvnode_put_commit_nowait: one round trip, as get_end */
    struct zc_part part[ZC_PARTS];
    double daemon_cpu_us[ZC_CPUS];   /* median of the kept iterations */
};

/* Page size and huge pages of the mapping holding addr, from /proc/self/smaps. */
struct map_pages {
    long kernel_kib, mmu_kib, huge_kib, rss_kib;   /* huge: AnonHugePages + ShmemPmdMapped + FilePmdMapped */
};

static void map_pages_of(const void *addr, struct map_pages *out)
{
    memset(out, 0, sizeof *out);
    out->kernel_kib = -1;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return;
    char line[512];
    bool in = false;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        long v;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = a >= lo && a < hi;
            continue;
        }
        if (!in)
            continue;
        if (sscanf(line, "KernelPageSize: %ld kB", &v) == 1)
            out->kernel_kib = v;
        else if (sscanf(line, "MMUPageSize: %ld kB", &v) == 1)
            out->mmu_kib = v;
        else if (sscanf(line, "Rss: %ld kB", &v) == 1)
            out->rss_kib = v;
        else if (sscanf(line, "AnonHugePages: %ld kB", &v) == 1 || sscanf(line, "ShmemPmdMapped: %ld kB", &v) == 1 ||
                 sscanf(line, "FilePmdMapped: %ld kB", &v) == 1)
            out->huge_kib += v;
    }
    fclose(f);
}

static long thread_faults(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0)
        die("getrusage", strerror(errno));
    return ru.ru_minflt + ru.ru_majflt;
}

struct zc_mark {
    uint64_t ns;
    long faults;
};

static struct zc_mark zc_now(void)
{
    return (struct zc_mark){ kvh_now_ns(), thread_faults() };
}

static void zc_take(uint64_t *ns, long *flt, unsigned it, struct zc_mark a, struct zc_mark b)
{
    ns[it] = b.ns - a.ns;
    flt[it] = b.faults - a.faults;
}

/* The reference copy: a chain of CHAIN blocks of bb bytes, block by block,
 * timed into ns[it] / flt[it] (not kept when keep is false). */
static void zc_copy_chain(unsigned char *to, const unsigned char *from, uint64_t bb, uint64_t *ns, long *flt,
                          unsigned it, bool keep)
{
    struct zc_mark a = zc_now();
    for (size_t i = 0; i < CHAIN; i++)
        memcpy(to + i * bb, from + i * bb, bb);
    struct zc_mark b = zc_now();
    if (keep)
        zc_take(ns, flt, it, a, b);
}

/* An operation timed from a to z but for the span b..c between (where the
 * bench read the daemon's CPU time: not the operation's). */
static void zc_take_but(uint64_t *ns, long *flt, unsigned it, struct zc_mark a, struct zc_mark b,
                        struct zc_mark c, struct zc_mark z)
{
    ns[it] = (b.ns - a.ns) + (z.ns - c.ns);
    flt[it] = (b.faults - a.faults) + (z.faults - c.faults);
}

/* The GET reference with dst 16 bytes off (timed into *ns / *flt unless
 * NULL), checked: also the sweep before each round trip. */
static void zc_ref_off16(unsigned char *dst, const unsigned char *ref_src, const unsigned char *src,
                         size_t chain_bytes, uint64_t bb, uint64_t *ns, long *flt)
{
    memset(dst, 0, chain_bytes + 16);
    zc_copy_chain(dst + 16, ref_src, bb, ns, flt, 0, ns != NULL);
    if (memcmp(dst + 16, src, chain_bytes) != 0)
        die("memcpy", "the copy differs");
}

/* A raw ping-pong with the echo process, RAW_MSG bytes each way: the ping,
 * its echo, both. */
static void raw_send(int fd)
{
    char buf[RAW_MSG] = { 0 };
    write_full(fd, buf, sizeof buf, "raw ping");
}

static void raw_receive(int fd)
{
    char buf[RAW_MSG];
    read_full(fd, buf, sizeof buf, "raw pong");
}

static void raw_round_trip(int fd)
{
    raw_send(fd);
    raw_receive(fd);
}

/* Section 5's runs: 64 KiB and 1 MiB blocks in ordinary pages, and 64 KiB
 * blocks with the host tier and the references' arena-side buffers in 2 MiB
 * pages of the hugetlb pool (when it has room). */
enum { ZC_64K, ZC_1M, ZC_64K_HUGE, ZC_RUNS };
static const char *const zc_run_name[ZC_RUNS] = { "64 KiB blocks", "1 MiB blocks",
                                                   "64 KiB blocks, host tier and references in 2 MiB pages" };
static const char *const zc_run_label[ZC_RUNS] = { "64KiB", "1MiB", "64KiB-huge" };   /* in tables, names */
#define ZC_HUGE_HOST (128ull << 20)   /* the host tier of the huge-page run */
static char zc_pages_line[ZC_RUNS][2][192];   /* the mappings' pages, printed with the results */

/* n bytes, page-aligned; in 2 MiB pages of the hugetlb pool when huge
 * (n a multiple of 2 MiB). */
static unsigned char *zc_buffer(size_t n, bool huge)
{
    if (!huge)
        return aligned_alloc(4096, n);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void zc_buffer_free(unsigned char *p, size_t n, bool huge)
{
    if (huge)
        munmap(p, n);
    else
        free(p);
}

/* One run of section 5 (run: ZC_*) on kvnoded d. With huge, the buffers
 * on the arena's side of each reference copy (GET's source, PUT's
 * destination, the bench's memfd) are in 2 MiB pages as the arena then is;
 * the engine's side (src, dst) stays in ordinary pages. */
static void bench_zero_copy(const kvh_daemon *d, uint64_t bb, int run, struct zc_result *out)
{
    bool huge = run == ZC_64K_HUGE;
    const char *label = zc_run_label[run];
    char model[64];
    snprintf(model, sizeof model, "bench-node-%s", label);
    kvnode_layout l = kvh_layout(model, bb, 1, 0);
    kvnode_client *c;
    if (kvh_connect(d, &l, &c) != 0)
        die("connect", kvh_error());
    size_t chain_bytes = (size_t)bb * CHAIN;
    uint64_t target = quick ? 256ull << 20 : 1ull << 30;
    unsigned min_iters = quick ? 4 : 6;   /* PUT's two forms take turns: at least 2 each */
    unsigned iters = (unsigned)(target / chain_bytes) < min_iters ? min_iters : (unsigned)(target / chain_bytes);
    kvnode_key gkeys[CHAIN], pkeys[CHAIN];
    kvh_chain(gkeys, CHAIN, 3000 + bb);
    kvh_chain(pkeys, CHAIN, 4000 + bb);
    /* Page-aligned as the arena's blocks are (and an engine's pinned host
     * buffers): glibc's memcpy between addresses 16 bytes apart modulo 64
     * (malloc's) was ~20 % slower here, which the ZC_REF_OFF16 row shows. */
    unsigned char *src = aligned_alloc(4096, chain_bytes), *dst = aligned_alloc(4096, chain_bytes + 4096),
                  *ref_src = zc_buffer(chain_bytes, huge), *ref_dst = zc_buffer(chain_bytes, huge);
    const void *srcv[CHAIN];
    kvnode_loc locs[CHAIN];
    if (!src || !dst || !ref_src || !ref_dst)
        die("malloc", "out of memory");
    int shm_fd = memfd_create("bench-node-shm", MFD_CLOEXEC | (huge ? MFD_HUGETLB : 0));
    if (shm_fd < 0 || ftruncate(shm_fd, (off_t)chain_bytes) != 0)
        die("memfd", strerror(errno));
    unsigned char *shm = mmap(NULL, chain_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
    if (shm == MAP_FAILED)
        die("mmap of the memfd", strerror(errno));
    memset(shm, 0, chain_bytes);
    for (size_t i = 0; i < CHAIN; i++) {
        kvh_fill(src + i * bb, bb, gkeys[i], 1);
        srcv[i] = src + i * bb;
    }
    memcpy(ref_src, src, chain_bytes);
    memset(dst, 0, chain_bytes);
    memset(ref_dst, 0, chain_bytes);
    check(c, kvnode_put(c, gkeys, CHAIN, srcv), "put of the GET chain");
    kvnode_lease lease;
    size_t got, deleted;
    uint64_t *t[ZC_PARTS], *cpu_ns[ZC_CPUS];
    long *f[ZC_PARTS];
    for (int p = 0; p < ZC_PARTS; p++) {
        t[p] = malloc(iters * sizeof *t[p]);
        f[p] = malloc(iters * sizeof *f[p]);
        if (!t[p] || !f[p])
            die("malloc", "out of memory");
    }
    for (int k = 0; k < ZC_CPUS; k++)
        if (!(cpu_ns[k] = malloc(iters * sizeof *cpu_ns[k])))
            die("malloc", "out of memory");
    void *dstv[CHAIN];
    for (size_t i = 0; i < CHAIN; i++)
        dstv[i] = dst + i * bb;
    const void *arena_block = NULL;
    for (int m = 0; m < nmodes; m++) {
        int raw_fd;
        pid_t echo = start_echo(modes[m].server_cpu, &raw_fd);
        long long r0;
        pin_process(d->pid, modes[m].server_cpu);
        pin_tid(0, modes[m].client_cpu);
        /* Each iteration: the GET reference, GET, the PUT reference, PUT,
         * one after the other (a disturbance from the shared machine hits one
         * iteration of each); iteration 0 warms up; every figure is its
         * median iteration. Each reference sees the same untimed memsets and
         * checks as its operation, so both find the same buffers in cache. */
        for (unsigned it = 0; it <= iters; it++) {
            unsigned k = it - 1;   /* it 0 is not kept */
            memset(dst, 0, chain_bytes);
            zc_copy_chain(dst, ref_src, bb, t[ZC_REF_GET], f[ZC_REF_GET], k, it > 0);
            if (memcmp(dst, src, chain_bytes) != 0)
                die("memcpy", "the copy differs");

            memset(dst, 0, chain_bytes);
            r0 = proc_run_ns(d->pid);
            struct zc_mark a = zc_now();
            check(c, kvnode_get_begin(c, gkeys, CHAIN, &lease, locs, &got), "get_begin");
            struct zc_mark b = zc_now();
            if (it > 0)
                cpu_ns[ZC_CPU_GET_BEGIN][k] = (uint64_t)(proc_run_ns(d->pid) - r0);
            if (got != CHAIN)
                die("get_begin", "short prefix");
            struct zc_mark b2 = zc_now();   /* b .. b2: reading the daemon's CPU time, not timed */
            for (size_t i = 0; i < CHAIN; i++)
                memcpy(dst + i * bb, locs[i].ptr, bb);
            struct zc_mark e = zc_now();
            check(c, kvnode_get_end(c, lease), "get_end");
            struct zc_mark z = zc_now();
            arena_block = locs[0].ptr;
            if (it > 0) {
                zc_take_but(t[ZC_GET], f[ZC_GET], k, a, b, b2, z);
                zc_take(t[ZC_GET_BEGIN], f[ZC_GET_BEGIN], k, a, b);
                zc_take(t[ZC_GET_COPY], f[ZC_GET_COPY], k, b2, e);
                zc_take(t[ZC_GET_END], f[ZC_GET_END], k, e, z);
            }
            if (memcmp(dst, src, chain_bytes) != 0)   /* src was filled and put */
                die("zero-copy GET", "a block read differs from the one put");

            zc_ref_off16(dst, ref_src, src, chain_bytes, bb, it > 0 ? &t[ZC_REF_OFF16][k] : NULL,
                         it > 0 ? &f[ZC_REF_OFF16][k] : NULL);
            r0 = proc_run_ns(d->pid);   /* get_end, not waited for, was handled meanwhile */
            a = zc_now();
            check(c, kvnode_ping(c), "kvnode_ping");
            b = zc_now();
            if (it > 0) {
                cpu_ns[ZC_CPU_PING][k] = (uint64_t)(proc_run_ns(d->pid) - r0);
                zc_take(t[ZC_PING], f[ZC_PING], k, a, b);
            }
            /* The kernel's floor for one round trip, after the same sweep. */
            zc_ref_off16(dst, ref_src, src, chain_bytes, bb, NULL, NULL);
            a = zc_now();
            raw_round_trip(raw_fd);
            b = zc_now();
            if (it > 0)
                zc_take(t[ZC_RAW], f[ZC_RAW], k, a, b);
            /* The kernel's floor for a notice not waited for (get_end's,
             * put_commit_nowait's): one send that wakes the idle peer, after
             * the same sweep; its echo is read untimed. */
            zc_ref_off16(dst, ref_src, src, chain_bytes, bb, NULL, NULL);
            a = zc_now();
            raw_send(raw_fd);
            b = zc_now();
            raw_receive(raw_fd);
            if (it > 0)
                zc_take(t[ZC_RAW_SEND], f[ZC_RAW_SEND], k, a, b);

            /* PUT's reference, the copy into the memfd and PUT each come
             * after the same untimed sweep (of GET's destination, which
             * both GET and its reference clear before they copy: not of
             * GET's sources, whose cache state must stay alike). */
            memset(dst, (int)it, chain_bytes);
            zc_copy_chain(ref_dst, src, bb, t[ZC_REF_PUT], f[ZC_REF_PUT], k, it > 0);
            if (it == iters && memcmp(ref_dst, src, chain_bytes) != 0)
                die("memcpy", "the copy differs");

            /* PUT's pattern into shared memory of the bench's own (a memfd as
             * the arena, prefaulted, touched once per iteration as its slots
             * are): what the kernel's shmem pages alone cost the copy. */
            memset(dst, (int)it, chain_bytes);
            zc_copy_chain(shm, src, bb, t[ZC_REF_SHM], f[ZC_REF_SHM], k, it > 0);

            memset(dst, (int)it, chain_bytes);
            r0 = proc_run_ns(d->pid);

            /* PUT: odd iterations wait for put_commit, even ones pipeline
             * it (kvnode_put_commit_nowait; the next call, the delete
             * below, reports a failed commit); both after the same sweeps. */
            bool pipelined = it % 2 == 0;
            unsigned kp = (it - 1) / 2;   /* its place among its form's kept iterations */

            a = zc_now();
            check(c, kvnode_put_begin(c, pkeys, CHAIN, KVNODE_TIER_HOST, &lease, locs), "put_begin");
            b = zc_now();
            if (it > 0)
                cpu_ns[ZC_CPU_PUT_BEGIN][k] = (uint64_t)(proc_run_ns(d->pid) - r0);
            b2 = zc_now();
            for (size_t i = 0; i < CHAIN; i++) {
                if (!locs[i].ptr)
                    die("put_begin", "a key of the deleted chain is still stored");
                memcpy(locs[i].ptr, src + i * bb, bb);
            }
            e = zc_now();
            if (pipelined)
                check(c, kvnode_put_commit_nowait(c, lease), "put_commit_nowait");
            else
                check(c, kvnode_put_commit(c, lease), "put_commit");
            z = zc_now();
            if (it > 0 && pipelined) {
                zc_take_but(t[ZC_PUT_NW], f[ZC_PUT_NW], kp, a, b, b2, z);
                zc_take(t[ZC_PUT_NW_COMMIT], f[ZC_PUT_NW_COMMIT], kp, e, z);
            } else if (it > 0) {
                zc_take_but(t[ZC_PUT], f[ZC_PUT], kp, a, b, b2, z);
                zc_take(t[ZC_PUT_BEGIN], f[ZC_PUT_BEGIN], kp, a, b);
                zc_take(t[ZC_PUT_COPY], f[ZC_PUT_COPY], kp, b2, e);
                zc_take(t[ZC_PUT_COMMIT], f[ZC_PUT_COMMIT], kp, e, z);
            }
            if (it == iters) {   /* the last chain put, read back byte-exact */
                memset(dst, 0, chain_bytes);
                check(c, kvnode_get(c, pkeys, CHAIN, dstv, &got), "kvnode_get");
                if (got != CHAIN || memcmp(dst, src, chain_bytes) != 0)
                    die("zero-copy PUT", "the chain read back differs from the one put");
            }
            check(c, kvnode_delete(c, pkeys, CHAIN, &deleted), pipelined ? "delete after put_commit_nowait" : "delete");
            if (deleted != CHAIN)
                die(pipelined ? "put_commit_nowait" : "put_commit", "the chain was not all committed");
        }
        for (int p = 0; p < ZC_PARTS; p++) {
            /* PUT's parts were taken in turns: the waited form's in the odd
             * iterations, the pipelined one's in the even. */
            bool nw = p == ZC_PUT_NW || p == ZC_PUT_NW_COMMIT;
            bool waited = p == ZC_PUT || p == ZC_PUT_BEGIN || p == ZC_PUT_COPY || p == ZC_PUT_COMMIT;
            unsigned n = nw ? iters / 2 : waited ? iters - iters / 2 : iters;
            double fsum = 0;
            for (unsigned i = 0; i < n; i++)
                fsum += (double)f[p][i];
            qsort(t[p], n, sizeof *t[p], cmp_u64);
            out[m].part[p] = (struct zc_part){ (double)t[p][n / 2] / 1e3, fsum / n };
        }
        out[m].memcpy_get_gbs = (double)chain_bytes / (double)t[ZC_REF_GET][iters / 2];
        out[m].memcpy_put_gbs = (double)chain_bytes / (double)t[ZC_REF_PUT][iters / 2];
        out[m].get_gbs = (double)chain_bytes / (double)t[ZC_GET][iters / 2];
        out[m].put_gbs = (double)chain_bytes / (double)(out[m].part[ZC_PUT].us * 1e3);
        out[m].put_nw_gbs = (double)chain_bytes / (double)(out[m].part[ZC_PUT_NW].us * 1e3);
        for (int k = 0; k < ZC_CPUS; k++)
            out[m].daemon_cpu_us[k] = (double)median_u64(cpu_ns[k], iters) / 1e3;
        stop_echo(echo, raw_fd);
        unpin_self();
    }
    struct map_pages ar, bu;
    map_pages_of(arena_block, &ar);
    map_pages_of(ref_src, &bu);
    snprintf(zc_pages_line[run][0], sizeof zc_pages_line[run][0], "%s arena mapping: %ld KiB pages (MMU %ld "
             "KiB), %ld of %ld KiB resident in huge pages", label, ar.kernel_kib, ar.mmu_kib, ar.huge_kib,
             ar.rss_kib);
    snprintf(zc_pages_line[run][1], sizeof zc_pages_line[run][1], "%s references' arena-side buffers: %ld "
             "KiB pages (MMU %ld KiB), %ld of %ld KiB resident in huge pages", label, bu.kernel_kib, bu.mmu_kib,
             bu.huge_kib, bu.rss_kib);
    for (int p = 0; p < ZC_PARTS; p++) {
        free(t[p]);
        free(f[p]);
    }
    for (int k = 0; k < ZC_CPUS; k++)
        free(cpu_ns[k]);
    check(c, kvnode_delete(c, gkeys, CHAIN, &deleted), "delete");
    free(src);
    free(dst);
    zc_buffer_free(ref_src, chain_bytes, huge);
    zc_buffer_free(ref_dst, chain_bytes, huge);
    munmap(shm, chain_bytes);
    close(shm_fd);
    kvnode_close(c);
}

/* The best GET / PUT / memcpy ratio a design could reach whose messages to
 * the daemon cost what the raw ones do (the kernel's floor): one round trip
 * (the least any design that asks the daemon can make), two (PUT with its
 * commit waited), or one round trip and one send not waited for (GET's
 * get_end, PUT's put_commit_nowait: the notice that ends a batch). */
enum { ZC_CEIL_GET, ZC_CEIL_PUT, ZC_CEIL_PUT_WAITED, ZC_CEIL_GET_SEND, ZC_CEIL_PUT_SEND, ZC_CEILS };
static const char *const zc_ceil_name[ZC_CEILS] = {
    "ceiling GET: mc/(mc+raw)", "ceiling PUT: mc/(mc+raw)", "  same, 2 raw (commit wt)",
    "  GET, raw rt + raw send", "  PUT, raw rt + raw send",
};
static double zc_ceiling(const struct zc_result *zc, int k)
{
    bool get = k == ZC_CEIL_GET || k == ZC_CEIL_GET_SEND;
    double mc = zc->part[get ? ZC_REF_GET : ZC_REF_PUT].us, raw = zc->part[ZC_RAW].us;
    double msgs = k == ZC_CEIL_PUT_WAITED ? 2 * raw
                : k == ZC_CEIL_GET_SEND || k == ZC_CEIL_PUT_SEND ? raw + zc->part[ZC_RAW_SEND].us
                : raw;
    return mc / (mc + msgs);
}

static void print_zc_parts(const struct zc_result *zc, const char *label)
{
    printf("    %s: median per iteration, us (page faults per iteration)\n      %-24s", label, "");
    for (int m = 0; m < nmodes; m++)
        printf(" %21s", modes[m].name);
    printf("\n");
    for (int p = 0; p < ZC_PARTS; p++) {
        printf("      %-24s", zc_part_name[p]);
        for (int m = 0; m < nmodes; m++)
            printf(" %10.1f (%8.1f)", zc[m].part[p].us, zc[m].part[p].faults);
        printf("\n");
    }
    for (int k = 0; k < ZC_CPUS; k++) {
        char name[64];
        snprintf(name, sizeof name, "kvnoded CPU per %s", zc_cpu_name[k]);
        printf("      %-24s", name);
        for (int m = 0; m < nmodes; m++)
            printf(" %10.1f %10s", zc[m].daemon_cpu_us[k], "");
        printf("\n");
    }
    for (int k = 0; k < ZC_CEILS; k++) {
        printf("      %-24s", zc_ceil_name[k]);
        for (int m = 0; m < nmodes; m++)
            printf(" %9.2fx %10s", zc_ceiling(&zc[m], k), "");
        printf("\n");
    }
}

/* The copy of PUT's pattern alone into three destinations, in turns (each
 * after the same 16 MiB sweep; the arena's after its put_begin): private
 * memory, a memfd of the bench's own, and the arena slots put_begin lends.
 * Whether the arena's pages copy slower than shared memory of the same
 * kind when nothing else differs; medians, us, into *out. */
enum { ZC_ISO_PRIVATE, ZC_ISO_MEMFD, ZC_ISO_ARENA, ZC_ISO };
static void bench_copy_alone(const kvh_daemon *d, uint64_t bb, double out[ZC_ISO])
{
    kvnode_layout l = kvh_layout("bench-node-copy", bb, 1, 0);
    kvnode_client *c;
    if (kvh_connect(d, &l, &c) != 0)
        die("connect", kvh_error());
    size_t chain_bytes = (size_t)bb * CHAIN;
    unsigned char *src = aligned_alloc(4096, chain_bytes), *sweep = aligned_alloc(4096, chain_bytes),
                  *priv = aligned_alloc(4096, chain_bytes);
    int fd = memfd_create("bench-node-copy", MFD_CLOEXEC);
    if (!src || !sweep || !priv || fd < 0 || ftruncate(fd, (off_t)chain_bytes) != 0)
        die("buffers", strerror(errno));
    unsigned char *own = mmap(NULL, chain_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (own == MAP_FAILED)
        die("mmap of the memfd", strerror(errno));
    memset(src, 1, chain_bytes);
    memset(priv, 0, chain_bytes);
    memset(own, 0, chain_bytes);
    kvnode_key keys[CHAIN];
    kvh_chain(keys, CHAIN, 5000 + bb);
    kvnode_loc locs[CHAIN];
    kvnode_lease lease;
    size_t deleted;
    enum { ROUNDS = 31 };
    uint64_t ns[ZC_ISO][ROUNDS];
    for (unsigned r = 0; r < ROUNDS; r++) {
        for (unsigned j = 0; j < ZC_ISO; j++) {
            unsigned w = (j + r) % ZC_ISO;
            memset(sweep, (int)r, chain_bytes);
            if (w == ZC_ISO_ARENA)
                check(c, kvnode_put_begin(c, keys, CHAIN, KVNODE_TIER_HOST, &lease, locs), "put_begin");
            struct zc_mark a = zc_now();
            for (size_t i = 0; i < CHAIN; i++) {
                unsigned char *to = w == ZC_ISO_PRIVATE ? priv + i * bb
                                  : w == ZC_ISO_MEMFD   ? own + i * bb
                                                        : (unsigned char *)locs[i].ptr;
                memcpy(to, src + i * bb, bb);
            }
            ns[w][r] = zc_now().ns - a.ns;
            if (w == ZC_ISO_ARENA) {
                check(c, kvnode_put_commit(c, lease), "put_commit");
                check(c, kvnode_delete(c, keys, CHAIN, &deleted), "delete");
            }
        }
    }
    for (unsigned w = 0; w < ZC_ISO; w++) {
        qsort(ns[w], ROUNDS, sizeof ns[w][0], cmp_u64);
        out[w] = (double)ns[w][ROUNDS / 2] / 1e3;
    }
    munmap(own, chain_bytes);
    close(fd);
    free(src);
    free(sweep);
    free(priv);
    kvnode_close(c);
}

/* Free bytes of the hugetlb pool's default page size, and that size
 * (0 when there is none). */
static uint64_t hugetlb_free_bytes(uint64_t *page)
{
    *page = meminfo("Hugepagesize") << 10;
    return meminfo("HugePages_Free") * *page;
}

/* Section 5: the runs measured are marked in have[]. The huge-page run
 * needs the hugetlb pool (vm.nr_hugepages, set by the operator; the bench
 * reserves nothing) to hold its host tier and three chains of 2 MiB
 * pages; *huge_why says why it was skipped. */
static void section5(uint64_t avail, bool mib_blocks, struct zc_result zc[ZC_RUNS][MAX_MODES], bool have[ZC_RUNS],
                     char *huge_why, size_t whylen)
{
    printf("\n5. zero-copy GET / PUT of 256-block chains vs memcpy per block of the same chain (GB/s)\n");
    memset(have, 0, ZC_RUNS * sizeof *have);
    kvh_daemon dz;
    start_daemon(&dz, "memory.host_bytes=1GiB\nlog.level=warn\n");
    bench_zero_copy(&dz, 64 * 1024, ZC_64K, zc[ZC_64K]);
    have[ZC_64K] = true;
    double alone[ZC_ISO];
    bench_copy_alone(&dz, 64 * 1024, alone);
    if (mib_blocks) {
        bench_zero_copy(&dz, 1024 * 1024, ZC_1M, zc[ZC_1M]);
        have[ZC_1M] = true;
    } else {
        printf("    1 MiB blocks skipped: MemAvailable %.1f GiB\n", (double)avail / (double)(1ull << 30));
    }
    if (kvh_stop(&dz, 0) != 0)
        die("kvnoded", "did not stop cleanly");
    kvh_destroy(&dz);
    uint64_t page, pool = hugetlb_free_bytes(&page), need = ZC_HUGE_HOST + 3 * (uint64_t)CHAIN * 64 * 1024;
    if (page != 2u << 20 || pool < need + (8u << 20)) {
        snprintf(huge_why, whylen, "the hugetlb pool has %llu MiB free in %llu KiB pages; this run needs %llu MiB "
                 "in 2048 KiB pages (vm.nr_hugepages)", (unsigned long long)(pool >> 20),
                 (unsigned long long)(page >> 10), (unsigned long long)((need + (8u << 20)) >> 20));
    } else {
        char cfg[128];
        snprintf(cfg, sizeof cfg, "memory.host_bytes=%llu\nmemory.huge_pages=on\nlog.level=warn\n",
                 (unsigned long long)ZC_HUGE_HOST);
        start_daemon(&dz, cfg);
        bench_zero_copy(&dz, 64 * 1024, ZC_64K_HUGE, zc[ZC_64K_HUGE]);
        have[ZC_64K_HUGE] = true;
        if (kvh_stop(&dz, 0) != 0)
            die("kvnoded", "did not stop cleanly");
        kvh_destroy(&dz);
    }
    printf("    %-10s %-15s %9s %9s %9s %9s | %8s %8s\n", "block", "pinning", "mc(GET)", "GET", "mc(PUT)", "PUT",
           "GET/mc", "PUT/mc");
    for (int b = 0; b < ZC_RUNS; b++)
        for (int m = 0; have[b] && m < nmodes; m++)
            printf("    %-10s %-15s %9.2f %9.2f %9.2f %9.2f | %7.2fx %7.2fx\n", zc_run_label[b], modes[m].name,
                   zc[b][m].memcpy_get_gbs, zc[b][m].get_gbs, zc[b][m].memcpy_put_gbs, zc[b][m].put_gbs,
                   zc[b][m].get_gbs / zc[b][m].memcpy_get_gbs, zc[b][m].put_gbs / zc[b][m].memcpy_put_gbs);
    for (int b = 0; b < ZC_RUNS; b++)
        if (have[b])
            print_zc_parts(zc[b], zc_run_name[b]);
    if (!have[ZC_64K_HUGE])
        printf("    %s skipped: %s\n", zc_run_name[ZC_64K_HUGE], huge_why);
    for (int b = 0; b < ZC_RUNS; b++)
        for (int i = 0; have[b] && i < 2; i++)
            printf("    %s\n", zc_pages_line[b][i]);
    printf("    PUT's copy alone, 64 KiB blocks, not pinned, in turns after the same sweep (median of 31, us):\n"
           "      private %.1f | own memfd %.1f | arena slots from put_begin %.1f: arena / memfd %.2fx, "
           "arena / private %.2fx\n", alone[ZC_ISO_PRIVATE], alone[ZC_ISO_MEMFD], alone[ZC_ISO_ARENA],
           alone[ZC_ISO_ARENA] / alone[ZC_ISO_MEMFD], alone[ZC_ISO_ARENA] / alone[ZC_ISO_PRIVATE]);
}

/* --- main --------------------------------------------------------------------------- */

static void print_sc(const char *name, const struct sc_result *r)
{
    printf("    %-22s daemon %5.2f + client %5.2f = %5.2f\n", name, r->server, r->client, r->server + r->client);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
        } else if (strcmp(argv[i], "--section3") == 0) {
            mc_only = true;
        } else if (strcmp(argv[i], "--section4") == 0) {
            big_only = true;
        } else if (strcmp(argv[i], "--section5") == 0) {
            zc_only = true;
        } else {
            fprintf(stderr, "usage: %s [--quick] [--section3] [--section4] [--section5]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (sched_getaffinity(0, sizeof all_cpus, &all_cpus) != 0)
        die("sched_getaffinity", strerror(errno));
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &all_cpus)) {
            if (cpu_a < 0)
                cpu_a = cpu;
            else if (cpu_b < 0)
                cpu_b = cpu;
        }
    if (!quick)
        modes[nmodes++] = (struct pin_mode){ "not pinned", -1, -1 };
    modes[nmodes++] = (struct pin_mode){ "same CPU", cpu_a, cpu_a };
    if (cpu_b >= 0)
        modes[nmodes++] = (struct pin_mode){ "different CPUs", cpu_a, cpu_b };
    else
        printf("only CPU %d is allowed: the different-CPUs figures are skipped\n", cpu_a);

    uint64_t avail = mem_available();
    /* Section 4 needs ~1.3 GiB per million blocks (tier + index), section 5
     * 1 GiB of tier + 1 GiB of private buffers; leave half of what is free. */
    size_t nblocks = 1u << 20;
    if (avail / 2 < (1300ull << 20)) {
        nblocks = (size_t)((avail / 2) / (1300ull << 20) * (double)(1u << 20)) & ~(size_t)(CHAIN - 1);
        printf("MemAvailable %.1f GiB: section 4 uses %zu blocks instead of 1 M\n",
               (double)avail / (double)(1ull << 30), nblocks);
    }
    bool mib_blocks = avail / 2 >= (2048ull << 20);

    printf("kvnode-bench-node: %s, %s, %s, MemAvailable %.1f GiB, CPUs %d/%d%s\n\n", kvh_daemon_path(),
           kvnode_version(), quick ? "quick" : "full", (double)avail / (double)(1ull << 30), cpu_a, cpu_b,
           " (server pinned to the first, client to the first or the second)");

    if (big_only) {
        printf("4. MATCH x256 over %zu stored 1 KiB blocks: random keys vs 256 hot keys\n", nblocks);
        struct big_result big;
        bench_big(nblocks, &big);
        print_big(&big);
        return 0;
    }
    if (zc_only) {
        struct zc_result zc[ZC_RUNS][MAX_MODES];
        bool have[ZC_RUNS];
        char why[256];
        section5(avail, mib_blocks, zc, have, why, sizeof why);
        return 0;
    }

    /* Daemon A (16-key chains of 4 KiB blocks) and redis-server. */
    kvh_daemon d;
    start_daemon(&d, "memory.host_bytes=64MiB\nlog.level=warn\n");
    struct redis rs;
    char why[512];
    if (redis_start(&rs, why, sizeof why) != 0)
        die("start redis-server", why);
    kvnode_layout l16 = kvh_layout("bench-node", 4096, 1, 0);
    layout16 = &l16;
    {
        kvnode_client *c;
        if (kvh_connect(&d, &l16, &c) != 0)
            die("connect", kvh_error());
        redisContext *rc = redis_connect(rs.sock);
        if (!rc)
            die("redis connect", rs.sock);
        for (int i = 0; i < MAX_CLIENTS; i++) {
            kvnode_key k[KEYS16];
            keys_of(k, i, true);
            if (kvh_put(c, k, KEYS16, 5) != 0)
                die("kvnode_put", kvh_error());
            size_t got;
            if (kvh_get_verify(c, k, KEYS16, 5, 0, &got) != 0 || got != KEYS16)
                die("read back", kvh_error());
            for (int j = 0; j < KEYS16; j++) {
                char name[64];
                redis_key(name, sizeof name, k[j]);
                redisAppendCommand(rc, "SET %s 1", name);
                redis_expect_status(rc, "OK", "redis SET");
            }
        }
        redisFree(rc);
        kvnode_close(c);
    }
    struct servers s = { .kv = &d, .redis_sock = rs.sock, .raw_fd = -1 };

    double t_sec = now_s();
    /* 1. */
    struct rt_result rt[MAX_MODES];
    struct sc_result sc[MAX_MODES][4];
    bool have_sc = false;
    if (mc_only)
        goto section3;
    printf("1. round trips of one client (per second; ratios to the raw unix-socket ping-pong)\n");
    printf("    %-15s %11s %11s %11s %11s | %9s %9s %9s %11s\n", "pinning", "raw floor", "kv PING",
           "kv MATCHx16", "redis PING", "kvPING/f", "redis/f", "kv/redis", "MATCH/redis");
    for (int m = 0; m < nmodes; m++) {
        pin_process(d.pid, modes[m].server_cpu);
        pin_process(rs.pid, modes[m].server_cpu);
        bench_round_trips(&s, &modes[m], &rt[m]);
        printf("    %-15s %11.0f %11.0f %11.0f %11.0f | %8.2fx %8.2fx %8.2fx %10.2fx\n", modes[m].name, rt[m].raw,
               rt[m].kv_ping, rt[m].kv_match, rt[m].redis_ping, rt[m].kv_ping / rt[m].raw,
               rt[m].redis_ping / rt[m].raw, rt[m].kv_ping / rt[m].redis_ping, rt[m].kv_match / rt[m].redis_ping);
    }

    /* 2. */
    printf("    [%.1f s]\n", now_s() - t_sec);
    t_sec = now_s();
    printf("\n2. syscalls per round trip (perf stat -e raw_syscalls:sys_enter on server and client)\n");
    perf_probe();
    if (!perf_ok) {
        printf("    skipped: %s\n", perf_why);
    } else {
        char tmp[PATH_MAX];
        if (kvh_mkdtemp(tmp, sizeof tmp) != 0)
            die("temp dir", kvh_error());
        unsigned n = quick ? 3000 : 20000;
        for (int m = 0; m < nmodes; m++) {
            pin_process(d.pid, modes[m].server_cpu);
            pin_process(rs.pid, modes[m].server_cpu);
            int fd;
            pid_t echo = start_echo(modes[m].server_cpu, &fd);
            struct servers ss = s;
            ss.raw_fd = fd;
            count_syscalls(&ss, OP_RAW, echo, &modes[m], n, tmp, &sc[m][0]);
            stop_echo(echo, fd);
            count_syscalls(&s, OP_KV_PING, d.pid, &modes[m], n, tmp, &sc[m][1]);
            count_syscalls(&s, OP_KV_MATCH16, d.pid, &modes[m], n, tmp, &sc[m][2]);
            count_syscalls(&s, OP_REDIS_PING, rs.pid, &modes[m], n, tmp, &sc[m][3]);
            printf("  %s (%u round trips each):\n", modes[m].name, n);
            print_sc("raw ping-pong", &sc[m][0]);
            print_sc("kvnode PING", &sc[m][1]);
            print_sc("kvnode MATCH x16", &sc[m][2]);
            print_sc("redis PING (hiredis)", &sc[m][3]);
        }
        have_sc = true;
    }

    /* 3. */
    printf("    [%.1f s]\n", now_s() - t_sec);
    t_sec = now_s();
section3:
    printf("\n3. 16-key MATCH round trips/s of N client processes vs redis pipelines of 16 EXISTS\n"
           "   (CPU per round trip in us of the best round: server user+kernel | clients user+kernel;\n"
           "   ceiling: the ratio if kvnoded and libkvnode ran no user code: redis's CPU / (kvnode's kernel CPU\n"
           "   + the user time of its 5 syscalls per round trip, as a raw ping-pong client's user time per call);\n"
           "   sleeps: the server's waits for work (voluntary context switches) per round trip, each one a\n"
           "   wakeup its clients' requests paid for)\n");
    printf("    %-15s %-8s %3s %12s %12s %8s %8s | %-27s | %-27s | %s\n", "pinning", "keys", "N", "kvnode", "redis",
           "ratio", "ceiling", "kvnoded | its clients", "redis-server | its clients", "sleeps kv | redis");
    double mc[MAX_MODES][2][2];   /* [mode][absent, present][4, 16 clients] ratio */
    double mc_ceil[MAX_MODES][2][2];   /* the same, with no user time on kvnode's side */
    struct mc_cpu mcpu[MAX_MODES][2][2][2];   /* [mode][absent, present][4, 16][kvnode, redis] */
    static const int nclients[2] = { 4, 16 };
    double sys_user[MAX_MODES];   /* user us per syscall, per pinning */
    for (int m = 0; m < nmodes; m++) {
        pin_process(d.pid, modes[m].server_cpu);
        pin_process(rs.pid, modes[m].server_cpu);
        sys_user[m] = user_us_per_syscall(modes[m].server_cpu, modes[m].client_cpu);
        printf("    %-15s user time per syscall of a raw ping-pong client: %.2f us\n", modes[m].name, sys_user[m]);
        for (int p = 1; p >= 0; p--)
            for (int k = 0; k < 2; k++) {
                /* kvnode and redis in turn, 3 rounds (--quick: 2); the best round of each. */
                double kv = 0, re = 0, secs = quick ? 0.1 : 0.5;
                struct mc_cpu cu;
                for (int r = 0; r < (quick ? 2 : 3); r++) {
                    double v = many_clients(&s, OP_KV_MATCH16, p, nclients[k], modes[m].client_cpu, secs, d.pid, &cu);
                    if (v > kv) {
                        kv = v;
                        mcpu[m][p][k][0] = cu;
                    }
                    v = many_clients(&s, OP_REDIS_EXISTS16, p, nclients[k], modes[m].client_cpu, secs, rs.pid, &cu);
                    if (v > re) {
                        re = v;
                        mcpu[m][p][k][1] = cu;
                    }
                }
                mc[m][p][k] = kv / re;
                const struct mc_cpu *a = &mcpu[m][p][k][0], *b = &mcpu[m][p][k][1];
                mc_ceil[m][p][k] = mc_ceiling(a, b, have_sc ? sc[m][2].server + sc[m][2].client : 5.0, sys_user[m]);
                printf("    %-15s %-8s %3d %12.0f %12.0f %7.2fx %7.2fx | %5.1f+%5.1f | %5.1f+%5.1f | %5.1f+%5.1f | "
                       "%5.1f+%5.1f | %4.2f | %4.2f\n", modes[m].name, p ? "present" : "absent", nclients[k], kv, re,
                       kv / re, mc_ceil[m][p][k], a->srv_user, a->srv_sys, a->cli_user, a->cli_sys, b->srv_user,
                       b->srv_sys, b->cli_user, b->cli_sys, a->srv_sleeps, b->srv_sleeps);
            }
    }
    redis_stop(&rs);
    if (kvh_stop(&d, 0) != 0)
        die("kvnoded", "did not stop cleanly");
    kvh_destroy(&d);
    if (mc_only)
        return 0;

    /* 4. */
    printf("    [%.1f s]\n", now_s() - t_sec);
    t_sec = now_s();
    printf("\n4. MATCH x256 over %zu stored 1 KiB blocks: random keys vs 256 hot keys\n", nblocks);
    struct big_result big;
    bench_big(nblocks, &big);
    print_big(&big);

    /* 5. */
    printf("    [%.1f s]\n", now_s() - t_sec);
    t_sec = now_s();
    struct zc_result zc[ZC_RUNS][MAX_MODES];   /* [ZC_*][mode] */
    bool have[ZC_RUNS];
    char huge_why[256];
    section5(avail, mib_blocks, zc, have, huge_why, sizeof huge_why);

    printf("    [%.1f s]\n", now_s() - t_sec);
    t_sec = now_s();
    /* The table. */
    printf("\nsummary: issue 32's rows, one column per pinning (\"huge\": the host tier and the references'\n"
           "arena-side buffers in 2 MiB pages)\n  %-58s", "");
    for (int m = 0; m < nmodes; m++)
        printf(" %13s", modes[m].name);
    printf("\n");
    printf("  %-58s", "syscalls per PING, daemon + client (redis + hiredis)");
    for (int m = 0; m < nmodes; m++) {
        if (have_sc)
            printf(" %5.2f (%4.2f)", sc[m][1].server + sc[m][1].client, sc[m][3].server + sc[m][3].client);
        else
            printf(" %13s", "skipped");
    }
    printf("\n  %-58s", "syscalls per MATCH x16, daemon + client");
    for (int m = 0; m < nmodes; m++) {
        if (have_sc)
            printf(" %13.2f", sc[m][2].server + sc[m][2].client);
        else
            printf(" %13s", "skipped");
    }
    printf("\n  %-58s", "MATCH x16 rt/s / redis EXISTS x16, 4 | 16 clients, absent");
    for (int m = 0; m < nmodes; m++)
        printf(" %5.2fx|%5.2fx", mc[m][0][0], mc[m][0][1]);
    printf("\n  %-58s", "MATCH x16 rt/s / redis EXISTS x16, 4 | 16 clients, present");
    for (int m = 0; m < nmodes; m++)
        printf(" %5.2fx|%5.2fx", mc[m][1][0], mc[m][1][1]);
    printf("\n  %-58s", "  its ceiling with no kvnode user code, present");
    for (int m = 0; m < nmodes; m++)
        printf(" %5.2fx|%5.2fx", mc_ceil[m][1][0], mc_ceil[m][1][1]);
    printf("\n  %-58s", "MATCH x256 random over 1 M blocks / 256 hot, mean | p50");
    for (int m = 0; m < nmodes; m++)
        printf(" %5.2fx|%5.2fx", big.rnd_mean[m] / big.hot_mean[m], big.rnd_p50[m] / big.hot_p50[m]);
    printf("\n  %-58s", "kvnoded CPU per MATCH x256, random over 1 M | 256 hot (us)");
    for (int m = 0; m < nmodes; m++)
        printf(" %6.1f|%6.1f", big.rnd_cpu[m], big.hot_cpu[m]);
    printf("\n  %-58s %12.1f B\n", "memory per block at 1 M blocks (RssAnon delta)", big.anon_per_block);
    /* "huge": the host tier and the references' arena-side buffers in 2 MiB pages. */
    static const char *const sum_name[ZC_RUNS] = { "64 KiB", "1 MiB", "64 KiB huge" };
    for (int b = 0; b < ZC_RUNS; b++) {
        char name[96];
        if (!have[b]) {
            if (b == ZC_64K_HUGE)
                printf("  zero-copy GET | PUT, 64 KiB huge (host tier and references in 2 MiB pages): skipped (%s)\n",
                       huge_why);
            continue;
        }
        snprintf(name, sizeof name, "zero-copy GET | PUT / memcpy per block, %s", sum_name[b]);
        printf("  %-58s", name);
        for (int m = 0; m < nmodes; m++)
            printf(" %5.2fx|%5.2fx", zc[b][m].get_gbs / zc[b][m].memcpy_get_gbs,
                   zc[b][m].put_gbs / zc[b][m].memcpy_put_gbs);
        printf("\n");
        snprintf(name, sizeof name, "  PUT with put_commit_nowait / memcpy, %s", sum_name[b]);
        printf("  %-58s", name);
        for (int m = 0; m < nmodes; m++)
            printf(" %12.2fx", zc[b][m].put_nw_gbs / zc[b][m].memcpy_put_gbs);
        printf("\n");
        snprintf(name, sizeof name, "  ceiling: mc / (mc + one raw round trip), %s", sum_name[b]);
        printf("  %-58s", name);
        for (int m = 0; m < nmodes; m++)
            printf(" %5.2fx|%5.2fx", zc_ceiling(&zc[b][m], ZC_CEIL_GET), zc_ceiling(&zc[b][m], ZC_CEIL_PUT));
        printf("\n");
        snprintf(name, sizeof name, "  same, one raw round trip + one raw send, %s", sum_name[b]);
        printf("  %-58s", name);
        for (int m = 0; m < nmodes; m++)
            printf(" %5.2fx|%5.2fx", zc_ceiling(&zc[b][m], ZC_CEIL_GET_SEND), zc_ceiling(&zc[b][m], ZC_CEIL_PUT_SEND));
        printf("\n");
        if (b == ZC_1M)
            continue;
        /* PUT (pipelined commit) apart: its messages against the kernel's
         * floor for them, and its copy against memcpy's, same iterations. */
        snprintf(name, sizeof name, "  put_begin rt + commit send | raw rt + raw send (us)");
        printf("  %-58s", name);
        for (int m = 0; m < nmodes; m++)
            printf(" %6.0f|%6.0f", zc[b][m].part[ZC_PUT_BEGIN].us + zc[b][m].part[ZC_PUT_NW_COMMIT].us,
                   zc[b][m].part[ZC_RAW].us + zc[b][m].part[ZC_RAW_SEND].us);
        printf("\n  %-58s", "  copy into the arena / memcpy (PUT's pattern)");
        for (int m = 0; m < nmodes; m++)
            printf(" %12.2fx", zc[b][m].part[ZC_PUT_COPY].us / zc[b][m].part[ZC_REF_PUT].us);
        printf("\n");
    }
    printf("  %-58s", "kvnoded CPU per get_begin | put_begin, 64 KiB (us)");
    for (int m = 0; m < nmodes; m++)
        printf(" %6.1f|%6.1f", zc[0][m].daemon_cpu_us[ZC_CPU_GET_BEGIN], zc[0][m].daemon_cpu_us[ZC_CPU_PUT_BEGIN]);
    printf("\n  %-58s", "kvnoded CPU per PING after the same sweep (us)");
    for (int m = 0; m < nmodes; m++)
        printf(" %13.1f", zc[0][m].daemon_cpu_us[ZC_CPU_PING]);
    printf("\n");
    printf("  %-58s", "kvnode PING rt/s / raw unix-socket ping-pong");
    for (int m = 0; m < nmodes; m++)
        printf(" %12.2fx", rt[m].kv_ping / rt[m].raw);
    printf("\n  %-58s", "redis PING rt/s / raw unix-socket ping-pong");
    for (int m = 0; m < nmodes; m++)
        printf(" %12.2fx", rt[m].redis_ping / rt[m].raw);
    printf("\n");
    return 0;
}

/* kvnode-soak: mixed traffic against a real kvnoded with crashes, then a
 * byte-exact check of everything acknowledged; not part of `make test`
 * (`make soak`, SOAK_SECONDS, SOAK_ARGS).
 *
 * The daemon ($KVNODED or --kvnoded, default build/kvnoded) runs through the
 * integration harness on a private temporary directory ($TMPDIR, default
 * /tmp) with [persist] backend = file, policy = write_through and a small
 * host tier, so that blocks are evicted to the store and promoted back.
 *
 * --procs worker processes (default 8) each own --keys keys (disjoint; the
 * workers are spread over --namespaces layouts) and run a random mix on one
 * libkvnode connection: put of a key that is absent (a first put, or a re-put
 * after a delete, with a new generation; MATCH first, so that a key the
 * daemon still holds is noticed instead of being written over), get and a
 * byte-exact check of a present key, delete. Copying, zero-copy and inline
 * calls are mixed. A block's bytes are a pattern of (key, generation), so any
 * read tells the generation it holds.
 *
 * Every operation that changes a key is journaled by its worker, before (the
 * intent) and after its acknowledgement (the ack), one write() per record to
 * an O_APPEND file: the journal outlives a SIGKILL of the worker, and a key
 * whose last intent has no ack is "unacknowledged" (in flight at a kill: its
 * fate is unknown). A new worker continues from its predecessor's journal;
 * a key of unknown state is deleted the next time it is picked, which makes
 * its state known again.
 *
 * Every --client-kill-every seconds (about; default 5) a random worker gets
 * SIGKILL and is restarted. Every --daemon-kill-every seconds (about;
 * default 20) the daemon gets kill -9 and a new one is started on the same
 * store; the workers reconnect once its recovery scan is complete.
 *
 * Then the traffic stops and every key is checked twice: on the running
 * daemon, and again after a clean stop (SIGTERM) and restart. A key whose
 * last acknowledged operation is a put must read back byte-exact with that
 * generation; one whose last acknowledged operation is a delete must be gone.
 * Outcomes:
 *   byte-exact   read back, every byte of the expected generation;
 *   lost         not found (MATCH 0 in every tier). The write-behind
 *                contract allows losing a put acknowledged shortly before a
 *                kill -9 whose block had not reached the store yet: a loss
 *                is "in the write-behind window" when the put was
 *                acknowledged by an instance that was killed -9 at most
 *                --loss-window seconds (default 5) later, and "otherwise"
 *                when no kill -9 came between the ack and the check, or the
 *                block had had longer to reach the store;
 *   wrong        found, but bytes of another generation or of none;
 *   rolled back  found with an older generation's bytes, where the delete
 *                that superseded that generation and the put of the expected
 *                one were both acknowledged within the window before a
 *                kill -9: neither had to reach the store, which kept the
 *                older block (reported apart from wrong; real keys are
 *                content hashes, so a key's generations never differ there);
 *   resurrected  a key whose delete was acknowledged is found again (in the
 *                window or otherwise, as for lost);
 *   unreadable   MATCH finds it but GET does not return it within the
 *                deadline (promotion failed or timed out).
 * The second check also counts the keys lost across the clean restart that
 * the first one read back. Workers check during the traffic too (get +
 * verify, and MATCH before a re-put); those findings have their own line.
 *
 * Exit status 0 when nothing was wrong, nothing was lost otherwise than in
 * the window and nothing was unreadable in the final checks (resurrected and
 * rolled-back keys, and keys unreadable during the traffic, when an
 * overloaded store may refuse promotions, are reported and do not fail the
 * run); 1 otherwise (and on any failure of
 * the soak itself); 130 when interrupted. Every wait has a deadline; SIGINT
 * or SIGTERM stops the traffic, the workers and the daemon and removes the
 * temporary directory (--keep-logs DIR keeps the daemons' logs and the
 * journals). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define MAX_PROCS        64
#define MAX_NAMESPACES   16
#define NS_PER_S         1000000000ull
#define CLIENT_TIMEOUT_MS 60000      /* above the daemon's request_timeout */
#define REQUEST_TIMEOUT  "30s"       /* how long a GET may wait for promotions */
#define READY_WAIT_S     120         /* a worker's wait for the daemon to come back */
#define RECOVERY_WAIT_S  120         /* the recovery scan of a restarted daemon */
#define STOP_WAIT_MS     60000       /* a clean stop, queue flush included */
#define WORKER_EXIT_MS   30000       /* workers finishing their operation at the end */
#define UNREADABLE_TRIES 5           /* GETs of a MATCHed key before "unreadable" (200 ms apart) */
#define FINAL_TRIES      10          /* the same in the final checks (500 ms apart) */
#define JOURNAL_MAGIC    0x4b414f53u /* "SOAK" */
#define MAX_DETAILS      10          /* listed problems per kind */

/* --- journal ------------------------------------------------------------------ */

enum rec_op {
    R_PUT_INTENT = 1,   /* gen: the generation about to be put */
    R_PUT_ACK,          /* the put of gen committed */
    R_DEL_INTENT,
    R_DEL_ACK,          /* aux: keys the daemon reported deleted */
    R_GET_MISSING,      /* gen: expected; MATCH 0 */
    R_GET_WRONG,        /* gen: expected; aux: first 8 bytes read */
    R_GET_UNREADABLE,   /* gen: expected; MATCH found it, GET did not return it */
    R_FOUND,            /* a key believed absent is there (MATCH > 0 or put_begin says stored) */
    R_OP_FAILED,        /* the operation of the last intent failed; aux: -rc */
};

struct soak_rec {
    uint32_t magic;
    uint8_t  op;
    uint8_t  mode;      /* call flavour (put/get): 0 copying, 1 zero-copy, 2 inline */
    uint16_t pad;
    uint32_t key;       /* index in the worker's key space */
    uint32_t gen;
    uint32_t epoch;     /* daemon instance the worker's connection was made to */
    uint32_t pad2;
    uint64_t t_ns;      /* CLOCK_MONOTONIC, taken after the daemon answered */
    uint64_t aux;
};

enum key_state { K_NEVER = 0, K_PRESENT, K_DELETED, K_LOST, K_UNCERTAIN };

/* What a worker (and the analysis) knows of one key after replaying its journal. */
struct key_info {
    uint8_t  state;
    uint32_t gen;       /* K_PRESENT: the generation acknowledged */
    uint32_t epoch;     /* daemon instance of the last ack (put or delete) */
    uint64_t t_ns;      /* time of the last ack */
};

static void key_apply(struct key_info *k, const struct soak_rec *r)
{
    switch (r->op) {
    case R_PUT_INTENT:
    case R_DEL_INTENT:
    case R_GET_WRONG:
    case R_FOUND:
    case R_OP_FAILED:
        k->state = K_UNCERTAIN;
        break;
    case R_PUT_ACK:
        k->state = K_PRESENT;
        k->gen = r->gen;
        k->epoch = r->epoch;
        k->t_ns = r->t_ns;
        break;
    case R_DEL_ACK:
        k->state = K_DELETED;
        k->epoch = r->epoch;
        k->t_ns = r->t_ns;
        break;
    case R_GET_MISSING:
        k->state = K_LOST;
        break;
    default:
        break;   /* R_GET_UNREADABLE: unchanged */
    }
}

/* --- options and shared state ---------------------------------------------------- */

struct soak_opts {
    unsigned seconds, procs, keys, namespaces;
    uint64_t block_bytes, host_bytes;
    double daemon_kill_every, client_kill_every, loss_window;
    uint64_t seed;
    const char *kvnoded, *fsync, *keep_logs;
    char *extra_config;      /* --set lines, after the soak's own settings */
    bool verbose;
};

/* Counters the workers keep in memory shared with the parent (they outlive a
 * killed worker). */
struct worker_counters {
    atomic_ullong gets, gets_exact, puts, deletes, matches, reconnects;
    atomic_ullong errors[KVNODE_ESHUTDOWN + 1];   /* by code; [0] other */
};

struct shared {
    atomic_int stop;        /* workers finish their operation and exit */
    atomic_int ready;       /* the daemon serves and its recovery scan is complete */
    atomic_uint epoch;      /* instance number of that daemon (1, 2, ...) */
    struct worker_counters w[MAX_PROCS];
};

static struct soak_opts opt;
static struct shared *sh;
static pid_t parent_pid;
static char soak_dir[PATH_MAX];
static char *daemon_config;
static kvnode_layout layouts[MAX_NAMESPACES];
static char layout_names[MAX_NAMESPACES][32];
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(splitmix64(s) >> 11) / 9007199254740992.0; }

/* Keys of different workers never collide: a bijection of (worker, index). */
static kvnode_key key_of(unsigned worker, uint32_t idx)
{
    uint64_t s = (((uint64_t)worker << 32) | idx) ^ 0x50a4c0de00000000ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (kvnode_key)(z ^ (z >> 31));
}

static unsigned ns_of(unsigned worker) { return worker % opt.namespaces; }

static void journal_path(char *buf, size_t len, unsigned worker)
{
    snprintf(buf, len, "%s/journal-%02u.bin", soak_dir, worker);
}

static void sleep_ms(unsigned ms) { kvh_sleep_ms(ms); }

static double rel_s(uint64_t t_ns, uint64_t t0) { return t_ns >= t0 ? (double)(t_ns - t0) / 1e9 : 0.0; }

/* --- worker ------------------------------------------------------------------------ */

struct worker {
    unsigned id;
    int jfd;
    struct key_info *keys;
    uint32_t max_gen;
    uint64_t rng;
    kvnode_client *c;
    uint32_t conn_epoch;
    size_t bb;
    unsigned char *buf;
    struct worker_counters *ctr;
};

static void worker_die(struct worker *w, const char *what, const char *detail) __attribute__((noreturn));
static void worker_die(struct worker *w, const char *what, const char *detail)
{
    fprintf(stderr, "soak: worker %u (pid %d): %s: %s\n", w->id, (int)getpid(), what, detail);
    fflush(stderr);
    _exit(3);
}

static void jrec(struct worker *w, int op, uint32_t key, uint32_t gen, int mode, uint64_t aux)
{
    struct soak_rec r = {
        .magic = JOURNAL_MAGIC, .op = (uint8_t)op, .mode = (uint8_t)mode, .key = key, .gen = gen,
        .epoch = w->conn_epoch, .t_ns = kvh_now_ns(), .aux = aux,
    };
    ssize_t n = write(w->jfd, &r, sizeof r);
    if (n != (ssize_t)sizeof r)
        worker_die(w, "journal write", n < 0 ? strerror(errno) : "short write");
    key_apply(&w->keys[key], &r);
}

/* Load the predecessor's journal (a record cut by a SIGKILL is dropped). */
static void worker_replay(struct worker *w)
{
    char path[PATH_MAX + 32];
    journal_path(path, sizeof path, w->id);
    w->jfd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (w->jfd < 0)
        worker_die(w, path, strerror(errno));
    struct stat st;
    if (fstat(w->jfd, &st) != 0)
        worker_die(w, path, strerror(errno));
    size_t whole = (size_t)st.st_size / sizeof(struct soak_rec);
    if ((off_t)(whole * sizeof(struct soak_rec)) != st.st_size &&
        ftruncate(w->jfd, (off_t)(whole * sizeof(struct soak_rec))) != 0)
        worker_die(w, "truncate a cut journal record", strerror(errno));
    struct soak_rec r;
    for (size_t i = 0; i < whole; i++) {
        if (pread(w->jfd, &r, sizeof r, (off_t)(i * sizeof r)) != (ssize_t)sizeof r)
            worker_die(w, path, "short read");
        if (r.magic != JOURNAL_MAGIC || r.key >= opt.keys)
            worker_die(w, path, "corrupt journal record");
        key_apply(&w->keys[r.key], &r);
        if (r.gen > w->max_gen)
            w->max_gen = r.gen;
    }
}

static bool conn_lost(int rc)
{
    switch (-rc) {
    case KVNODE_ECLOSED: case KVNODE_ECONNECT: case KVNODE_EIO: case KVNODE_ETIMEDOUT:
    case KVNODE_ESHUTDOWN: case KVNODE_EPROTO:
        return true;
    default:
        return false;
    }
}

static void worker_error(struct worker *w, int rc, const char *what)
{
    int code = -rc > 0 && -rc <= KVNODE_ESHUTDOWN ? -rc : 0;
    atomic_fetch_add(&w->ctr->errors[code], 1);
    if (opt.verbose && !conn_lost(rc))
        fprintf(stderr, "soak: worker %u: %s -> %s: %s\n", w->id, what, kvnode_strerror(rc),
                kvnode_last_error(w->c));
    if (conn_lost(rc)) {
        kvnode_close(w->c);
        w->c = NULL;
    }
}

/* Connect once the daemon is ready (its recovery scan complete). false: stop. */
static bool worker_connect(struct worker *w)
{
    uint64_t deadline = kvh_now_ns() + (uint64_t)READY_WAIT_S * NS_PER_S;
    char sock[PATH_MAX + 32];
    snprintf(sock, sizeof sock, "%s/kvnode.sock", soak_dir);
    while (!atomic_load(&sh->stop)) {
        if (kvh_now_ns() > deadline)
            worker_die(w, "connect", "the daemon was not ready within the deadline");
        if (getppid() != parent_pid)
            _exit(4);
        if (!atomic_load(&sh->ready)) {
            sleep_ms(20);
            continue;
        }
        uint32_t e = atomic_load(&sh->epoch);
        kvnode_client *c = NULL;
        if (kvnode_connect(sock, &layouts[ns_of(w->id)], &c) != 0) {
            sleep_ms(20);
            continue;
        }
        /* Connected to the instance that was announced, not to a successor
         * that is still scanning. */
        if (!atomic_load(&sh->ready) || atomic_load(&sh->epoch) != e) {
            kvnode_close(c);
            continue;
        }
        kvnode_set_timeout(c, CLIENT_TIMEOUT_MS);
        w->c = c;
        w->conn_epoch = e;
        atomic_fetch_add(&w->ctr->reconnects, 1);
        return true;
    }
    return false;
}

#define PUT_FOUND 1   /* put_begin: the key is already stored */

static int worker_put(struct worker *w, kvnode_key key, uint32_t gen, int mode)
{
    if (mode == 1) {
        kvnode_lease lease = 0;
        kvnode_loc loc = { 0 };
        int rc = kvnode_put_begin(w->c, &key, 1, KVNODE_TIER_HOST, &lease, &loc);
        if (rc != 0)
            return rc;
        if (!loc.ptr) {
            if (lease)
                kvnode_put_abort(w->c, lease);
            return PUT_FOUND;
        }
        kvh_fill(loc.ptr, w->bb, key, gen);
        rc = kvnode_put_commit(w->c, lease);
        if (rc != 0 && !conn_lost(rc))
            kvnode_put_abort(w->c, lease);
        return rc;
    }
    kvh_fill(w->buf, w->bb, key, gen);
    const void *src = w->buf;
    return mode == 2 ? kvnode_put_inline(w->c, &key, 1, &src) : kvnode_put(w->c, &key, 1, &src);
}

/* Read one block into buf (zero-copy: copied out of the lease). */
static int read_block(kvnode_client *c, kvnode_key key, int mode, unsigned char *buf, size_t bb,
                      size_t *got)
{
    void *dst = buf;
    *got = 0;
    memset(buf, 0xA5, bb);   /* stale bytes must not pass for data */
    if (mode == 1) {
        kvnode_lease lease = 0;
        kvnode_loc loc = { 0 };
        int rc = kvnode_get_begin(c, &key, 1, &lease, &loc, got);
        if (rc != 0)
            return rc;
        if (*got > 1)
            *got = 1;
        if (*got == 1) {
            if (!loc.ptr)
                *got = 0;
            else
                memcpy(buf, loc.ptr, bb);
        }
        return lease ? kvnode_get_end(c, lease) : 0;
    }
    return mode == 2 ? kvnode_get_inline(c, &key, 1, &dst, got) : kvnode_get(c, &key, 1, &dst, got);
}

static uint64_t first8(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void worker_get(struct worker *w, uint32_t idx)
{
    kvnode_key key = key_of(w->id, idx);
    uint32_t gen = w->keys[idx].gen;
    int mode = (int)(splitmix64(&w->rng) % 3);
    atomic_fetch_add(&w->ctr->gets, 1);   /* once, retries included */
    for (unsigned attempt = 0;; attempt++) {
        size_t got = 0;
        int rc = read_block(w->c, key, mode, w->buf, w->bb, &got);
        if (rc != 0) {
            worker_error(w, rc, "get");
            return;
        }
        if (got == 1) {
            if (kvh_verify(w->buf, w->bb, key, gen) == 0)
                atomic_fetch_add(&w->ctr->gets_exact, 1);
            else
                jrec(w, R_GET_WRONG, idx, gen, mode, first8(w->buf));
            return;
        }
        /* Not returned: gone, or in the store and not promoted in time? */
        size_t matched = 0;
        rc = kvnode_match(w->c, &key, 1, &matched);
        atomic_fetch_add(&w->ctr->matches, 1);
        if (rc != 0) {
            worker_error(w, rc, "match");
            return;
        }
        if (matched == 0) {
            jrec(w, R_GET_MISSING, idx, gen, mode, 0);
            return;
        }
        if (attempt + 1 >= UNREADABLE_TRIES) {
            jrec(w, R_GET_UNREADABLE, idx, gen, mode, 0);
            return;
        }
        sleep_ms(200);
    }
}

static void worker_delete(struct worker *w, uint32_t idx)
{
    kvnode_key key = key_of(w->id, idx);
    size_t deleted = 0;
    jrec(w, R_DEL_INTENT, idx, w->keys[idx].gen, 0, 0);
    atomic_fetch_add(&w->ctr->deletes, 1);
    int rc = kvnode_delete(w->c, &key, 1, &deleted);
    if (rc != 0) {
        jrec(w, R_OP_FAILED, idx, w->keys[idx].gen, 0, (uint64_t)-rc);
        worker_error(w, rc, "delete");
        return;
    }
    jrec(w, R_DEL_ACK, idx, w->keys[idx].gen, 0, deleted);
}

/* Put a new generation of a key believed absent; MATCH first, so that a key
 * the daemon still holds (a lost delete) is noticed, not written over. */
static void worker_reput(struct worker *w, uint32_t idx)
{
    kvnode_key key = key_of(w->id, idx);
    size_t matched = 0;
    int rc = kvnode_match(w->c, &key, 1, &matched);
    atomic_fetch_add(&w->ctr->matches, 1);
    if (rc != 0) {
        worker_error(w, rc, "match");
        return;
    }
    if (matched > 0) {
        jrec(w, R_FOUND, idx, w->keys[idx].gen, 0, w->keys[idx].state);
        return;
    }
    uint32_t gen = ++w->max_gen;
    int mode = (int)(splitmix64(&w->rng) % 3);
    jrec(w, R_PUT_INTENT, idx, gen, mode, 0);
    atomic_fetch_add(&w->ctr->puts, 1);
    rc = worker_put(w, key, gen, mode);
    if (rc == PUT_FOUND) {
        jrec(w, R_FOUND, idx, gen, mode, K_NEVER);
    } else if (rc != 0) {
        jrec(w, R_OP_FAILED, idx, gen, mode, (uint64_t)-rc);
        worker_error(w, rc, "put");
    } else {
        jrec(w, R_PUT_ACK, idx, gen, mode, 0);
    }
}

static void worker_main(unsigned id, unsigned incarnation) __attribute__((noreturn));
static void worker_main(unsigned id, unsigned incarnation)
{
    /* proc_spawn made it die with the parent */
    signal(SIGINT, SIG_IGN);    /* the parent stops the workers */
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);

    struct worker w = { .id = id, .jfd = -1, .bb = (size_t)opt.block_bytes, .ctr = &sh->w[id] };
    w.rng = opt.seed ^ ((uint64_t)id << 40) ^ ((uint64_t)incarnation << 20) ^ 0x3c6ef372fe94f82bull;
    w.keys = calloc(opt.keys, sizeof *w.keys);
    w.buf = malloc(w.bb);
    if (!w.keys || !w.buf)
        worker_die(&w, "start", "out of memory");
    worker_replay(&w);

    while (!atomic_load(&sh->stop)) {
        if (!w.c && !worker_connect(&w))
            break;
        uint32_t idx = (uint32_t)(splitmix64(&w.rng) % opt.keys);
        switch (w.keys[idx].state) {
        case K_UNCERTAIN:
            worker_delete(&w, idx);   /* makes its state known */
            break;
        case K_PRESENT:
            if (uniform(&w.rng) < 0.7)
                worker_get(&w, idx);
            else
                worker_delete(&w, idx);
            break;
        default:   /* never put, deleted, or found missing */
            worker_reput(&w, idx);
            break;
        }
    }
    if (w.c)
        kvnode_close(w.c);
    close(w.jfd);
    _exit(0);
}

/* --- parent: workers ---------------------------------------------------------------- */

struct proc {
    pid_t pid;
    unsigned incarnations;
    int unexpected;          /* exits we did not cause */
};

static struct proc procs[MAX_PROCS];

struct worker_start {
    unsigned id, incarnation;
};

/* A worker process's entry (proc_spawn runs it in the child). */
static int worker_entry(void *arg)
{
    const struct worker_start *ws = arg;
    worker_main(ws->id, ws->incarnation);
}

static int spawn_worker(unsigned id)
{
    struct worker_start ws = { id, procs[id].incarnations };
    pid_t pid = proc_spawn(&(struct proc_opts){ .fn = worker_entry, .arg = &ws }, NULL);
    if (pid < 0) {
        fprintf(stderr, "soak: worker %u: %s\n", id, proc_error());
        return -1;
    }
    procs[id].pid = pid;
    procs[id].incarnations++;
    return 0;
}

/* Wait for a worker that was told to stop; SIGKILL after timeout_ms. */
static void reap_worker(unsigned id, int timeout_ms)
{
    if (procs[id].pid > 0 && proc_wait(&procs[id].pid, timeout_ms) == PROC_TIMEOUT)
        proc_stop(&procs[id].pid, SIGKILL, 10000);
}

static void stop_workers(void)
{
    atomic_store(&sh->stop, 1);
    uint64_t deadline = kvh_now_ms() + WORKER_EXIT_MS;
    for (unsigned i = 0; i < opt.procs; i++) {
        int left = (int)(deadline > kvh_now_ms() ? deadline - kvh_now_ms() : 0);
        reap_worker(i, left);
    }
}

/* Restart workers that exited on their own (a soak failure, counted). */
static int check_workers(bool restart)
{
    int died = 0;
    for (unsigned i = 0; i < opt.procs; i++) {
        int ws = procs[i].pid > 0 ? proc_wait(&procs[i].pid, 0) : -1;
        if (ws < 0)   /* still running, or not started */
            continue;
        procs[i].unexpected++;
        died++;
        fprintf(stderr, "soak: worker %u exited by itself (%s %d)\n", i,
                WIFSIGNALED(ws) ? "signal" : "status", WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
        if (restart && procs[i].unexpected < 10)
            spawn_worker(i);
    }
    return died;
}

/* --- parent: the daemon --------------------------------------------------------------- */

struct daemon_sum {
    uint64_t written, dropped, evicted_unstored, write_failures, deferred, promotions_failed;
};

struct run {
    kvh_daemon d;
    bool up;
    uint32_t epoch;            /* instance number of d */
    uint64_t started_ns;       /* when d was announced ready */
    uint64_t *kill_ns;         /* [epoch]: when instance epoch was killed -9 (0: it was not) */
    size_t kill_cap;
    unsigned daemon_kills, client_kills, unexpected_daemon_exits, unclean_stops;
    struct daemon_sum sum;
    unsigned log_errors, log_warnings;
    char first_errors[3][320];
    unsigned nfirst_errors;
    uint64_t t0;
};

static long long jint0(json_t *st, const char *path)
{
    long long v = kvh_json_int_or(st, path, 0);
    return v < 0 ? 0 : v;
}

/* Add one instance's persistence counters (as of this snapshot) to the sums. */
static void add_counters(struct run *r, json_t *st)
{
    r->sum.written += (uint64_t)jint0(st, "persist.written_blocks_total");
    r->sum.dropped += (uint64_t)jint0(st, "persist.dropped_total");
    r->sum.evicted_unstored += (uint64_t)jint0(st, "evictions.host.dropped_total");
    r->sum.deferred += (uint64_t)jint0(st, "persist.writes_deferred_total");
    r->sum.promotions_failed += (uint64_t)jint0(st, "persist.promotions_failed_total");
    json_t *f = kvh_json_get(st, "persist.failures_total.write"), *v;
    const char *kind;
    if (json_is_object(f)) {
        json_object_foreach(f, kind, v)
            r->sum.write_failures += (uint64_t)json_integer_value(v);
    }
}

static json_t *daemon_stats(struct run *r)
{
    kvnode_client *c = NULL;
    if (kvh_connect(&r->d, NULL, &c) != 0)
        return NULL;
    kvnode_set_timeout(c, 5000);
    json_t *st = kvh_stats_client(c);
    kvnode_close(c);
    return st;
}

/* For --keep-logs: best effort, a failure is reported and the soak goes on. */
static void copy_file(const char *from, const char *to)
{
    size_t len = 0;
    char *data = kvh_read_file(from, &len);
    FILE *out = data ? fopen(to, "w") : NULL;
    if (!out || fwrite(data, 1, len, out) != len || fclose(out) != 0)
        fprintf(stderr, "soak: cannot copy %s to %s\n", from, to);
    else
        out = NULL;
    if (out)
        fclose(out);
    free(data);
}

/* Count the error and warning lines of an ended instance's log (and keep it). */
static void harvest_log(struct run *r)
{
    size_t len = 0;
    char *log = kvh_read_file(r->d.log, &len);
    if (!log)
        return;
    for (char *line = log; line && *line;) {
        char *eol = strchr(line, '\n');
        if (eol)
            *eol = '\0';
        if (strstr(line, "] error: ")) {
            if (r->nfirst_errors < 3)
                snprintf(r->first_errors[r->nfirst_errors++], sizeof r->first_errors[0], "#%u %s",
                         r->epoch, line);
            r->log_errors++;
        } else if (strstr(line, "] warn: ")) {
            r->log_warnings++;
        }
        line = eol ? eol + 1 : NULL;
    }
    if (opt.keep_logs) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/kvnoded-%03u.log", opt.keep_logs, r->epoch);
        copy_file(r->d.log, path);
    }
    free(log);
}

static void record_kill(struct run *r, uint64_t when)
{
    if (r->epoch >= r->kill_cap) {
        size_t cap = r->kill_cap ? r->kill_cap * 2 : 64;
        while (cap <= r->epoch)
            cap *= 2;
        uint64_t *k = realloc(r->kill_ns, cap * sizeof *k);
        if (!k) {
            fprintf(stderr, "soak: out of memory\n");
            exit(1);
        }
        memset(k + r->kill_cap, 0, (cap - r->kill_cap) * sizeof *k);
        r->kill_ns = k;
        r->kill_cap = cap;
    }
    r->kill_ns[r->epoch] = when;
}

static uint64_t kill_time(const struct run *r, uint32_t epoch)
{
    return epoch < r->kill_cap ? r->kill_ns[epoch] : 0;
}

/* Start an instance on the store, wait for its recovery scan, announce it. */
static int daemon_start(struct run *r)
{
    if (kvh_start(&r->d, daemon_config) != 0) {
        fprintf(stderr, "soak: kvnoded did not start: %s\n", kvh_error());
        return -1;
    }
    r->up = true;
    uint64_t deadline = kvh_now_ns() + (uint64_t)RECOVERY_WAIT_S * NS_PER_S;
    for (;;) {
        json_t *st = daemon_stats(r);
        bool done = st && json_is_true(kvh_json_get(st, "persist.recovery.complete"));
        json_decref(st);
        if (done)
            break;
        if (interrupted)
            return -1;
        if (kvh_now_ns() > deadline) {
            fprintf(stderr, "soak: the recovery scan of kvnoded #%u did not complete within %d s\n",
                    r->epoch + 1, RECOVERY_WAIT_S);
            kvh_print_log(&r->d, "kvnoded (recovery too slow)");
            return -1;
        }
        sleep_ms(20);
    }
    r->epoch++;
    r->started_ns = kvh_now_ns();
    atomic_store(&sh->epoch, r->epoch);
    atomic_store(&sh->ready, 1);
    return 0;
}

static void daemon_crash(struct run *r, double now_s)
{
    json_t *st = daemon_stats(r);
    long long q = -1, hb = -1, ghosts = -1, written = 0, deferred = 0, dropped = 0;
    if (st) {
        q = jint0(st, "persist.queue_depth");
        hb = jint0(st, "tiers.host.blocks");
        ghosts = jint0(st, "tiers.store.blocks");
        written = jint0(st, "persist.written_blocks_total");
        deferred = jint0(st, "persist.writes_deferred_total");
        dropped = jint0(st, "persist.dropped_total");
        add_counters(r, st);
        json_decref(st);
    }
    uint64_t up_ns = kvh_now_ns() - r->started_ns;
    double rate = up_ns > 0 ? (double)written / ((double)up_ns / 1e9) : 0.0;
    atomic_store(&sh->ready, 0);
    kvh_kill(&r->d, SIGKILL);
    record_kill(r, kvh_now_ns());   /* after the reaping: every ack was sent before it */
    r->daemon_kills++;
    harvest_log(r);
    kvh_destroy(&r->d);
    r->up = false;
    printf("soak: t=%.1fs kill -9 kvnoded #%u (persist queue_depth %lld, ~%.1f s at its %.0f writes/s; "
           "writes deferred %lld, dropped %lld; host blocks %lld, store-only %lld)\n",
           now_s, r->epoch, q, rate > 0 && q > 0 ? (double)q / rate : 0.0, rate, deferred, dropped, hb, ghosts);
    fflush(stdout);
}

/* A clean stop (SIGTERM, queue flushed). 0 when it exited 0. */
static int daemon_stop(struct run *r)
{
    json_t *st = daemon_stats(r);
    if (st) {
        add_counters(r, st);
        json_decref(st);
    }
    atomic_store(&sh->ready, 0);
    int status = kvh_stop(&r->d, STOP_WAIT_MS);
    if (status != 0)
        r->unclean_stops++;
    harvest_log(r);
    kvh_destroy(&r->d);
    r->up = false;
    return status;
}

/* --- analysis -------------------------------------------------------------------------- */

/* How a missing (or resurrected) key relates to the kills, judged from the
 * ack that should have stuck and the instance the key was checked on. */
enum loss_kind {
    LOSS_WINDOW,    /* acked at most --loss-window s before a kill -9 of the acking instance */
    LOSS_OLD,       /* acked by an instance killed -9 longer than that after the ack */
    LOSS_NO_KILL,   /* no kill -9 between the ack and the check */
};

struct outcome {
    uint64_t keys, present, deleted;   /* keys checked: all, last put, last deleted */
    uint64_t exact;
    uint64_t lost[3];                  /* by enum loss_kind */
    uint64_t lost_after_exact;         /* after the restart: read back byte-exact by the live pass */
    uint64_t rolled_back;              /* an older generation that a kill -9 explains */
    uint64_t wrong;                    /* any other bytes */
    uint64_t resurrected[3];           /* by enum loss_kind of the delete */
    uint64_t unreadable, unacked;
};

struct journal {
    struct soak_rec *recs;
    size_t n;
    struct key_info *keys;     /* state after the whole journal */
    uint8_t *live_exact;       /* per key: read back byte-exact by the live pass */
};

enum detail_kind { D_LOST, D_WRONG, D_ROLLED_BACK, D_RESURRECTED, D_UNREADABLE, D_KINDS };

struct analysis {
    struct journal j[MAX_PROCS];
    uint64_t puts_acked, reputs_acked, deletes_acked, puts_unacked, deletes_unacked, failed_ops;
    struct outcome traffic;            /* what the workers found during the traffic */
    unsigned listed[D_KINDS], unlisted;
};

static int load_journal(unsigned id, struct journal *jn)
{
    char path[PATH_MAX + 32];
    size_t len = 0;
    journal_path(path, sizeof path, id);
    char *data = kvh_read_file(path, &len);
    if (!data) {
        fprintf(stderr, "soak: journal %s: %s\n", path, kvh_error());
        return -1;
    }
    jn->n = len / sizeof(struct soak_rec);
    jn->recs = malloc((jn->n ? jn->n : 1) * sizeof *jn->recs);
    jn->keys = calloc(opt.keys, sizeof *jn->keys);
    jn->live_exact = calloc(opt.keys, 1);
    if (!jn->recs || !jn->keys || !jn->live_exact) {
        free(data);
        fprintf(stderr, "soak: out of memory reading %s\n", path);
        return -1;
    }
    memcpy(jn->recs, data, jn->n * sizeof *jn->recs);
    free(data);
    for (size_t i = 0; i < jn->n; i++) {
        if (jn->recs[i].magic != JOURNAL_MAGIC || jn->recs[i].key >= opt.keys) {
            fprintf(stderr, "soak: journal %s: corrupt record %zu\n", path, i);
            return -1;
        }
    }
    return 0;
}

static enum loss_kind loss_kind(const struct run *r, const struct key_info *k, uint32_t obs_epoch)
{
    uint64_t kt = kill_time(r, k->epoch);
    if (obs_epoch == k->epoch || kt == 0)
        return LOSS_NO_KILL;
    if (kt <= k->t_ns || (double)(kt - k->t_ns) <= opt.loss_window * 1e9)
        return LOSS_WINDOW;
    return LOSS_OLD;
}

/* When and by which instance k's last ack came, and what became of that
 * instance, for a key checked on instance obs_epoch. */
static void describe_ack(const struct run *r, const struct key_info *k, uint32_t obs_epoch, char *buf,
                         size_t len)
{
    uint64_t kt = kill_time(r, k->epoch);
    if (obs_epoch == k->epoch)
        snprintf(buf, len, "acked t=%.2fs by the same kvnoded #%u (no kill -9 in between)",
                 rel_s(k->t_ns, r->t0), k->epoch);
    else if (kt)
        snprintf(buf, len, "acked t=%.2fs by kvnoded #%u, killed -9 %.2fs later", rel_s(k->t_ns, r->t0),
                 k->epoch, kt >= k->t_ns ? (double)(kt - k->t_ns) / 1e9 : 0.0);
    else
        snprintf(buf, len, "acked t=%.2fs by kvnoded #%u, which was then stopped cleanly",
                 rel_s(k->t_ns, r->t0), k->epoch);
}

/* The generation whose bytes these are, among the key's puts (intents) in
 * recs[0..upto) (0: none). With len 8, only the first 8 bytes are compared. */
static uint32_t identify_gen(const struct journal *jn, uint32_t key_idx, kvnode_key key, const void *bytes,
                             size_t len, size_t upto)
{
    unsigned char probe[8];
    for (size_t i = upto; i-- > 0;) {
        const struct soak_rec *rr = &jn->recs[i];
        if (rr->op != R_PUT_INTENT || rr->key != key_idx)
            continue;
        if (len == 8) {
            kvh_fill(probe, 8, key, rr->gen);
            if (memcmp(probe, bytes, 8) == 0)
                return rr->gen;
        } else if (kvh_verify(bytes, len, key, rr->gen) == 0) {
            return rr->gen;
        }
    }
    return 0;
}

/* An older generation `found` instead of the expected one is explained by a
 * kill -9 (write-behind) when the delete that superseded it and the put of
 * the expected generation were both acknowledged within the window before
 * a kill -9 of the instance that acknowledged them: neither had to reach the
 * store, which kept the older block. */
static bool rolled_back(const struct run *r, const struct journal *jn, uint32_t key_idx, uint32_t found,
                        const struct key_info *expected, uint32_t obs_epoch, size_t upto)
{
    if (!found || found >= expected->gen || loss_kind(r, expected, obs_epoch) != LOSS_WINDOW)
        return false;
    bool after = false;
    for (size_t i = 0; i < upto; i++) {
        const struct soak_rec *rr = &jn->recs[i];
        if (rr->key != key_idx)
            continue;
        if (rr->op == R_PUT_INTENT && rr->gen == found) {
            after = true;
        } else if (after && rr->op == R_DEL_ACK) {
            struct key_info del = { .state = K_DELETED, .epoch = rr->epoch, .t_ns = rr->t_ns };
            return loss_kind(r, &del, obs_epoch) == LOSS_WINDOW;
        }
    }
    return false;
}

/* Print one problem (MAX_DETAILS of each kind unless --verbose). */
static void detail(struct analysis *a, enum detail_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void detail(struct analysis *a, enum detail_kind kind, const char *fmt, ...)
{
    if (a->listed[kind] >= MAX_DETAILS && !opt.verbose) {
        a->unlisted++;
        return;
    }
    a->listed[kind]++;
    va_list ap;
    va_start(ap, fmt);
    fputs("soak:   ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
}

static const char *mode_name(int mode)
{
    return mode == 1 ? "zero-copy" : mode == 2 ? "inline" : "copying";
}

/* Replay every journal: the final state of each key, the ack counts and the
 * findings the workers recorded during the traffic. */
static int analyse_journals(const struct run *r, struct analysis *a)
{
    struct outcome *t = &a->traffic;
    for (unsigned w = 0; w < opt.procs; w++) {
        struct journal *jn = &a->j[w];
        if (load_journal(w, jn) != 0)
            return -1;
        for (size_t i = 0; i < jn->n; i++) {
            const struct soak_rec *rr = &jn->recs[i];
            struct key_info *k = &jn->keys[rr->key];
            struct key_info before = *k;
            kvnode_key key = key_of(w, rr->key);
            double when = rel_s(rr->t_ns, r->t0);
            char ack[160];
            enum loss_kind lk;
            switch (rr->op) {
            case R_PUT_ACK:
                a->puts_acked++;
                if (before.gen != 0)
                    a->reputs_acked++;   /* the key had an acknowledged put before */
                break;
            case R_DEL_ACK:
                a->deletes_acked++;
                break;
            case R_OP_FAILED:
                a->failed_ops++;
                break;
            case R_GET_MISSING:
                t->keys++;
                lk = loss_kind(r, &before, rr->epoch);
                t->lost[lk]++;
                if (lk != LOSS_WINDOW) {
                    describe_ack(r, &before, rr->epoch, ack, sizeof ack);
                    detail(a, D_LOST, "lost (seen at t=%.2fs by worker %u on kvnoded #%u): key %u (%" PRId64
                           ") generation %u, %s", when, w, rr->epoch, rr->key, key, rr->gen, ack);
                }
                break;
            case R_GET_WRONG: {
                uint64_t head = rr->aux;
                uint32_t found = identify_gen(jn, rr->key, key, &head, 8, i);
                bool rb = rolled_back(r, jn, rr->key, found, &before, rr->epoch, i);
                t->keys++;
                if (rb)
                    t->rolled_back++;
                else
                    t->wrong++;
                describe_ack(r, &before, rr->epoch, ack, sizeof ack);
                detail(a, rb ? D_ROLLED_BACK : D_WRONG, "%s (seen at t=%.2fs by worker %u on kvnoded #%u, %s "
                       "get): key %u (%" PRId64 ") expected generation %u (%s), read %s%u",
                       rb ? "rolled back" : "wrong", when, w, rr->epoch, mode_name(rr->mode), rr->key, key,
                       rr->gen, ack, found ? "generation " : "bytes of no generation ", found);
                break;
            }
            case R_GET_UNREADABLE:
                t->keys++;
                t->unreadable++;
                detail(a, D_UNREADABLE, "unreadable (t=%.2fs, worker %u, kvnoded #%u): key %u (%" PRId64
                       ") generation %u: MATCH finds it, GET did not return it in %d tries",
                       when, w, rr->epoch, rr->key, key, rr->gen, UNREADABLE_TRIES);
                break;
            case R_FOUND:
                if (before.state == K_DELETED) {
                    t->keys++;
                    lk = loss_kind(r, &before, rr->epoch);
                    t->resurrected[lk]++;
                    if (lk != LOSS_WINDOW) {
                        describe_ack(r, &before, rr->epoch, ack, sizeof ack);
                        detail(a, D_RESURRECTED, "resurrected (seen at t=%.2fs by worker %u on kvnoded #%u): "
                               "key %u (%" PRId64 "), its delete %s", when, w, rr->epoch, rr->key, key, ack);
                    }
                } else if (before.state == K_LOST || before.state == K_NEVER) {
                    t->keys++;
                    t->resurrected[LOSS_NO_KILL]++;
                    detail(a, D_RESURRECTED, "found (t=%.2fs, worker %u, kvnoded #%u): key %u (%" PRId64
                           "), %s, is there", when, w, rr->epoch, rr->key, key,
                           before.state == K_LOST ? "found missing before" : "never put");
                }
                break;
            default:
                break;
            }
            key_apply(k, rr);
        }
        /* In flight when the worker was killed: an intent whose next record
         * (a worker does one operation at a time) is not its outcome. */
        for (size_t i = 0; i < jn->n; i++) {
            const struct soak_rec *rr = &jn->recs[i];
            if (rr->op != R_PUT_INTENT && rr->op != R_DEL_INTENT)
                continue;
            int want = rr->op == R_PUT_INTENT ? R_PUT_ACK : R_DEL_ACK;
            const struct soak_rec *next = i + 1 < jn->n ? &jn->recs[i + 1] : NULL;
            bool settled = next && next->key == rr->key &&
                           (next->op == want || next->op == R_OP_FAILED || next->op == R_FOUND);
            if (!settled) {
                if (rr->op == R_PUT_INTENT)
                    a->puts_unacked++;
                else
                    a->deletes_unacked++;
            }
        }
    }
    return 0;
}

/* Check every key against the running instance: its last acknowledged put
 * must read back byte-exact, its last acknowledged delete must have stuck.
 * The first pass (live) notes what read back, the second (after_restart)
 * counts what it then lost. */
static int verify_keys(const struct run *r, struct analysis *a, const char *pass, bool after_restart,
                       struct outcome *o)
{
    kvnode_client *c[MAX_NAMESPACES] = { 0 }, *cl = NULL;
    unsigned char *buf = malloc((size_t)opt.block_bytes);
    int ret = 0, rc = 0;
    memset(o, 0, sizeof *o);
    if (!buf)
        return -1;
    for (unsigned n = 0; n < opt.namespaces; n++) {
        if (kvh_connect(&r->d, &layouts[n], &c[n]) != 0) {
            fprintf(stderr, "soak: %s: %s\n", pass, kvh_error());
            ret = -1;
            goto out;
        }
        kvnode_set_timeout(c[n], CLIENT_TIMEOUT_MS);
    }
    for (unsigned w = 0; w < opt.procs && !interrupted; w++) {
        struct journal *jn = &a->j[w];
        cl = c[ns_of(w)];
        for (uint32_t i = 0; i < opt.keys && !interrupted; i++) {
            struct key_info *k = &jn->keys[i];
            kvnode_key key = key_of(w, i);
            char ack[160];
            enum loss_kind lk;
            if (k->state == K_UNCERTAIN) {
                o->unacked++;
                continue;
            }
            describe_ack(r, k, r->epoch, ack, sizeof ack);
            if (k->state == K_DELETED) {
                size_t m = 0;
                rc = kvnode_match(cl, &key, 1, &m);
                if (rc != 0)
                    goto call_failed;
                o->keys++;
                o->deleted++;
                if (m == 0)
                    continue;
                lk = loss_kind(r, k, r->epoch);
                o->resurrected[lk]++;
                if (lk != LOSS_WINDOW)
                    detail(a, D_RESURRECTED, "%s: resurrected: worker %u key %u (%" PRId64 "), its delete %s",
                           pass, w, i, key, ack);
                continue;
            }
            if (k->state != K_PRESENT)
                continue;   /* never put, or already counted as lost during the traffic */
            o->keys++;
            o->present++;
            for (unsigned attempt = 0;; attempt++) {
                size_t got = 0, m = 0;
                int mode = (int)((i + attempt) % 3);
                rc = read_block(cl, key, mode, buf, (size_t)opt.block_bytes, &got);
                if (rc != 0)
                    goto call_failed;
                if (got == 1) {
                    if (kvh_verify(buf, (size_t)opt.block_bytes, key, k->gen) == 0) {
                        o->exact++;
                        if (!after_restart)
                            jn->live_exact[i] = 1;
                        break;
                    }
                    uint32_t found = identify_gen(jn, i, key, buf, (size_t)opt.block_bytes, jn->n);
                    bool rb = rolled_back(r, jn, i, found, k, r->epoch, jn->n);
                    if (rb)
                        o->rolled_back++;
                    else
                        o->wrong++;
                    detail(a, rb ? D_ROLLED_BACK : D_WRONG, "%s: %s (%s get): worker %u key %u (%" PRId64
                           ") expected generation %u (%s), read %s%u", pass, rb ? "rolled back" : "wrong",
                           mode_name(mode), w, i, key, k->gen, ack,
                           found ? "generation " : "bytes of no generation ", found);
                    break;
                }
                rc = kvnode_match(cl, &key, 1, &m);
                if (rc != 0)
                    goto call_failed;
                if (m == 0) {
                    lk = loss_kind(r, k, r->epoch);
                    o->lost[lk]++;
                    bool was_exact = after_restart && jn->live_exact[i];
                    if (was_exact)
                        o->lost_after_exact++;
                    if (lk != LOSS_WINDOW)
                        detail(a, D_LOST, "%s: lost: worker %u key %u (%" PRId64 ") generation %u, %s%s", pass,
                               w, i, key, k->gen, ack,
                               was_exact ? "; read back byte-exact before the clean stop" : "");
                    break;
                }
                if (attempt + 1 >= FINAL_TRIES) {
                    o->unreadable++;
                    detail(a, D_UNREADABLE, "%s: unreadable: worker %u key %u (%" PRId64 ") generation %u: "
                           "MATCH finds it, GET did not return it in %d tries", pass, w, i, key, k->gen,
                           FINAL_TRIES);
                    break;
                }
                sleep_ms(500);
            }
        }
    }
    goto out;
call_failed:
    fprintf(stderr, "soak: %s: checking a key failed: %s: %s\n", pass, kvnode_strerror(rc),
            kvnode_last_error(cl));
    ret = -1;
out:
    for (unsigned n = 0; n < opt.namespaces; n++)
        if (c[n])
            kvnode_close(c[n]);
    free(buf);
    return interrupted ? -1 : ret;
}

static void print_losses(const struct outcome *o)
{
    printf("lost %" PRIu64 " (%" PRIu64 " in the write-behind window before a kill -9, %" PRIu64
           " otherwise: %" PRIu64 " with no kill -9 after the ack",
           o->lost[LOSS_WINDOW] + o->lost[LOSS_OLD] + o->lost[LOSS_NO_KILL], o->lost[LOSS_WINDOW],
           o->lost[LOSS_OLD] + o->lost[LOSS_NO_KILL], o->lost[LOSS_NO_KILL]);
    if (o->lost_after_exact)
        printf(" (%" PRIu64 " of them read back byte-exact before the clean stop)", o->lost_after_exact);
    printf(", %" PRIu64 " acked more than %.1f s before a kill -9), wrong %" PRIu64 ", rolled back %" PRIu64
           " (an older generation, in the window), resurrected %" PRIu64 " (%" PRIu64 " in the window, %" PRIu64
           " otherwise), unreadable %" PRIu64,
           o->lost[LOSS_OLD], opt.loss_window, o->wrong, o->rolled_back,
           o->resurrected[LOSS_WINDOW] + o->resurrected[LOSS_OLD] + o->resurrected[LOSS_NO_KILL],
           o->resurrected[LOSS_WINDOW], o->resurrected[LOSS_OLD] + o->resurrected[LOSS_NO_KILL],
           o->unreadable);
}

static void print_check(const char *what, const struct outcome *o)
{
    printf("  %s: verified %" PRIu64 " keys (%" PRIu64 " last put, %" PRIu64 " last deleted): read back "
           "byte-exact %" PRIu64 ", ", what, o->keys, o->present, o->deleted, o->exact);
    print_losses(o);
    printf(", unacknowledged %" PRIu64 "\n", o->unacked);
}

/* The headline: what the workers found during the traffic plus the final
 * check after the clean restart. */
static void print_total(const struct analysis *a, const struct outcome *traffic, const struct outcome *fin)
{
    struct outcome t = *fin;
    t.keys += traffic->keys;
    t.rolled_back += traffic->rolled_back;
    t.wrong += traffic->wrong;
    t.unreadable += traffic->unreadable;
    for (int k = 0; k < 3; k++) {
        t.lost[k] += traffic->lost[k];
        t.resurrected[k] += traffic->resurrected[k];
    }
    printf("acknowledged %" PRIu64 " puts (%" PRIu64 " re-puts), %" PRIu64 " deletes; verified %" PRIu64
           " keys (during the traffic and after a clean restart): read back byte-exact %" PRIu64 ", ",
           a->puts_acked, a->reputs_acked, a->deletes_acked, t.keys, t.exact);
    print_losses(&t);
    printf(", unacknowledged %" PRIu64 "\n", t.unacked);
}

/* What fails the soak: wrong bytes, a loss the write-behind contract does
 * not explain, and in the final checks a block MATCH finds but GET cannot
 * return (during the traffic an overloaded store may refuse promotions). */
static bool outcome_bad(const struct outcome *o, bool final)
{
    return o->wrong || o->lost[LOSS_OLD] || o->lost[LOSS_NO_KILL] || (final && o->unreadable);
}

/* --- main ---------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvnode-soak [options]\n"
        "  --seconds N            traffic duration (default 300)\n"
        "  --quick                a short self-check: 20 s, 256 keys, kills every 6 s (daemon) and 2 s (client)\n"
        "  --procs N              worker processes (1..%d, default 8)\n"
        "  --keys N               keys per worker (default 512)\n"
        "  --namespaces N         layouts the workers are spread over (1..%d, default 2)\n"
        "  --block-bytes N        bytes per block (4096..1048576, default 65536)\n"
        "  --host-mib N           host tier in MiB (16..4096, default 64)\n"
        "  --fsync never|batch|always   [persist] fsync (default batch)\n"
        "  --daemon-kill-every S  kill -9 the daemon about every S seconds (0: never; default 20)\n"
        "  --client-kill-every S  SIGKILL a random worker about every S seconds (0: never; default 5)\n"
        "  --loss-window S        write-behind window: a put acknowledged at most S seconds before\n"
        "                         a kill -9 may be lost (default 5)\n"
        "  --seed N               random seed (default: from the clock, printed)\n"
        "  --kvnoded PATH         daemon binary (default $KVNODED or build/kvnoded)\n"
        "  --keep-logs DIR        copy every daemon instance's log and the journals into DIR\n"
        "  --set SECTION.KEY=VALUE  a kvnoded option on top of the soak's (repeatable),\n"
        "                         e.g. --set persist.workers=1\n"
        "  --verbose              more detail (client kills, every problem found)\n"
        "Prints the puts and deletes acknowledged and, for every key checked (during the traffic,\n"
        "on the live daemon, after a clean restart), read back byte-exact / lost (in the window or\n"
        "otherwise) / wrong / rolled back / resurrected / unreadable / unacknowledged. Exit status 1\n"
        "when anything was wrong or unreadable at the end, or lost otherwise than in the window.\n",
        MAX_PROCS, MAX_NAMESPACES);
}

static int parse_uint(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_secs(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 86400)
        return -1;
    *out = v;
    return 0;
}

static void bad_option(const char *name, const char *value, const char *want) __attribute__((noreturn));
static void bad_option(const char *name, const char *value, const char *want)
{
    fprintf(stderr, "kvnode-soak: --%s %s: expected %s (see --help)\n", name, value, want);
    exit(2);
}

static void parse_options(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "seconds", required_argument, NULL, 's' }, { "quick", no_argument, NULL, 'Q' },
        { "procs", required_argument, NULL, 'p' }, { "keys", required_argument, NULL, 'k' },
        { "namespaces", required_argument, NULL, 'n' }, { "block-bytes", required_argument, NULL, 'b' },
        { "host-mib", required_argument, NULL, 'H' }, { "fsync", required_argument, NULL, 'f' },
        { "daemon-kill-every", required_argument, NULL, 'D' },
        { "client-kill-every", required_argument, NULL, 'C' },
        { "loss-window", required_argument, NULL, 'W' }, { "seed", required_argument, NULL, 'S' },
        { "kvnoded", required_argument, NULL, 'K' }, { "keep-logs", required_argument, NULL, 'L' },
        { "set", required_argument, NULL, 'O' },
        { "verbose", no_argument, NULL, 'v' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    unsigned long long v;
    bool seeded = false;
    opt = (struct soak_opts){
        .seconds = 300, .procs = 8, .keys = 512, .namespaces = 2, .block_bytes = 65536,
        .host_bytes = 64ull << 20, .daemon_kill_every = 20, .client_kill_every = 5, .loss_window = 5,
        .fsync = "batch",
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 's':
            if (parse_uint(optarg, 1, 7 * 86400, &v)) bad_option("seconds", optarg, "1..604800");
            opt.seconds = (unsigned)v;
            break;
        case 'Q':
            opt.seconds = 20;
            opt.keys = 256;
            opt.daemon_kill_every = 6;
            opt.client_kill_every = 2;
            break;
        case 'p':
            if (parse_uint(optarg, 1, MAX_PROCS, &v)) bad_option("procs", optarg, "1..64");
            opt.procs = (unsigned)v;
            break;
        case 'k':
            if (parse_uint(optarg, 1, 1u << 20, &v)) bad_option("keys", optarg, "1..1048576");
            opt.keys = (unsigned)v;
            break;
        case 'n':
            if (parse_uint(optarg, 1, MAX_NAMESPACES, &v)) bad_option("namespaces", optarg, "1..16");
            opt.namespaces = (unsigned)v;
            break;
        case 'b':
            if (parse_uint(optarg, 4096, 1u << 20, &v) || v % 256) bad_option("block-bytes", optarg,
                                                                             "4096..1048576, a multiple of 256");
            opt.block_bytes = v;
            break;
        case 'H':
            if (parse_uint(optarg, 16, 4096, &v)) bad_option("host-mib", optarg, "16..4096");
            opt.host_bytes = v << 20;
            break;
        case 'f':
            if (strcmp(optarg, "never") && strcmp(optarg, "batch") && strcmp(optarg, "always"))
                bad_option("fsync", optarg, "never, batch or always");
            opt.fsync = optarg;
            break;
        case 'D':
            if (parse_secs(optarg, &opt.daemon_kill_every)) bad_option("daemon-kill-every", optarg, "seconds >= 0");
            break;
        case 'C':
            if (parse_secs(optarg, &opt.client_kill_every)) bad_option("client-kill-every", optarg, "seconds >= 0");
            break;
        case 'W':
            if (parse_secs(optarg, &opt.loss_window)) bad_option("loss-window", optarg, "seconds >= 0");
            break;
        case 'S':
            if (parse_uint(optarg, 0, UINT64_MAX, &v)) bad_option("seed", optarg, "an unsigned integer");
            opt.seed = v;
            seeded = true;
            break;
        case 'K':
            opt.kvnoded = optarg;
            break;
        case 'L':
            opt.keep_logs = optarg;
            break;
        case 'O': {
            const char *eq = strchr(optarg, '='), *dot = strchr(optarg, '.');
            if (!eq || !dot || dot > eq || strchr(optarg, '\n'))
                bad_option("set", optarg, "section.key=value (a kvnode.conf option)");
            size_t have = opt.extra_config ? strlen(opt.extra_config) : 0;
            char *more = realloc(opt.extra_config, have + strlen(optarg) + 2);
            if (!more)
                bad_option("set", optarg, "memory for it");
            snprintf(more + have, strlen(optarg) + 2, "%s\n", optarg);
            opt.extra_config = more;
            break;
        }
        case 'v':
            opt.verbose = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvnode-soak: unexpected argument '%s' (see --help)\n", argv[optind]);
        exit(2);
    }
    if (opt.namespaces > opt.procs)
        opt.namespaces = opt.procs;
    if (!seeded)
        opt.seed = kvh_now_ns() ^ ((uint64_t)getpid() << 32);
    if (opt.kvnoded && setenv("KVNODED", opt.kvnoded, 1) != 0) {
        fprintf(stderr, "kvnode-soak: setenv: %s\n", strerror(errno));
        exit(2);
    }
    if (opt.keep_logs && mkdir(opt.keep_logs, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvnode-soak: --keep-logs %s: %s\n", opt.keep_logs, strerror(errno));
        exit(2);
    }
}

int main(int argc, char **argv)
{
    parse_options(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    parent_pid = getpid();

    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        fprintf(stderr, "kvnode-soak: mmap: %s\n", strerror(errno));
        return 1;
    }
    memset(sh, 0, sizeof *sh);
    if (kvh_mkdtemp(soak_dir, sizeof soak_dir) != 0) {
        fprintf(stderr, "kvnode-soak: %s\n", kvh_error());
        return 1;
    }
    char store[PATH_MAX + 16];
    snprintf(store, sizeof store, "%s/store", soak_dir);
    if (mkdir(store, 0700) != 0) {
        fprintf(stderr, "kvnode-soak: mkdir %s: %s\n", store, strerror(errno));
        return 1;
    }
    if (asprintf(&daemon_config,
                 "server.socket_path=%s/kvnode.sock\n"
                 "server.request_timeout=" REQUEST_TIMEOUT "\n"
                 "server.shutdown_timeout=30s\n"
                 "memory.host_bytes=%" PRIu64 "\n"
                 "memory.slab_bytes=1MiB\n"
                 "persist.backend=file\n"
                 "persist.path=%s\n"
                 "persist.policy=write_through\n"
                 "persist.fsync=%s\n"
                 "%s",
                 soak_dir, opt.host_bytes, store, opt.fsync, opt.extra_config ? opt.extra_config : "") < 0) {
        fprintf(stderr, "kvnode-soak: out of memory\n");
        return 1;
    }
    for (unsigned n = 0; n < opt.namespaces; n++) {
        snprintf(layout_names[n], sizeof layout_names[n], "soak-%u", n);
        layouts[n] = kvh_layout(layout_names[n], opt.block_bytes, 1, 0);
    }

    char dkill[48] = "never", ckill[48] = "never";
    if (opt.daemon_kill_every > 0)
        snprintf(dkill, sizeof dkill, "every ~%.1f s", opt.daemon_kill_every);
    if (opt.client_kill_every > 0)
        snprintf(ckill, sizeof ckill, "every ~%.1f s", opt.client_kill_every);
    printf("soak: kvnoded %s, %u s, %u procs x %u keys of %" PRIu64 " bytes over %u namespaces, host tier "
           "%" PRIu64 " MiB, fsync %s, kill -9 of the daemon %s, SIGKILL of a worker %s, "
           "write-behind window %.1f s, seed %" PRIu64 "\n",
           kvh_daemon_path(), opt.seconds, opt.procs, opt.keys, opt.block_bytes, opt.namespaces,
           opt.host_bytes >> 20, opt.fsync, dkill, ckill, opt.loss_window, opt.seed);

    struct run r = { .t0 = kvh_now_ns() };
    struct analysis *a = calloc(1, sizeof *a);
    struct outcome live = { 0 }, restarted = { 0 };
    int failed = 0, status;
    uint64_t rng = opt.seed ^ 0x6a09e667f3bcc909ull;
    if (!a) {
        fprintf(stderr, "kvnode-soak: out of memory\n");
        return 1;
    }
    if (daemon_start(&r) != 0) {
        failed = 1;
        goto cleanup;
    }
    for (unsigned i = 0; i < opt.procs; i++)
        if (spawn_worker(i) != 0) {
            failed = 1;
            goto cleanup;
        }

    uint64_t end = r.t0 + (uint64_t)opt.seconds * NS_PER_S, next_progress = r.t0 + 30 * NS_PER_S;
    uint64_t next_dkill = opt.daemon_kill_every > 0
        ? r.t0 + (uint64_t)(opt.daemon_kill_every * (0.5 + uniform(&rng)) * 1e9) : UINT64_MAX;
    uint64_t next_ckill = opt.client_kill_every > 0
        ? r.t0 + (uint64_t)(opt.client_kill_every * (0.5 + uniform(&rng)) * 1e9) : UINT64_MAX;
    while (!interrupted) {
        uint64_t now = kvh_now_ns();
        if (now >= end)
            break;
        check_workers(true);
        status = kvh_wait_exit(&r.d, 0);
        if (status != KVH_EXIT_TIMEOUT) {
            /* The daemon died without being told to: a crash of its own. */
            atomic_store(&sh->ready, 0);
            r.unexpected_daemon_exits++;
            record_kill(&r, kvh_now_ns());
            printf("soak: t=%.1fs kvnoded #%u exited by itself with status %d\n", rel_s(now, r.t0), r.epoch,
                   status);
            kvh_print_log(&r.d, "kvnoded exited by itself");
            harvest_log(&r);
            kvh_destroy(&r.d);
            r.up = false;
            if (daemon_start(&r) != 0) {
                failed = 1;
                goto cleanup;
            }
            continue;
        }
        if (now >= next_dkill) {
            daemon_crash(&r, rel_s(now, r.t0));
            if (daemon_start(&r) != 0) {
                failed = 1;
                goto cleanup;
            }
            next_dkill = kvh_now_ns() + (uint64_t)(opt.daemon_kill_every * (0.5 + uniform(&rng)) * 1e9);
            continue;
        }
        if (now >= next_ckill) {
            unsigned id = (unsigned)(splitmix64(&rng) % opt.procs);
            if (procs[id].pid > 0) {
                proc_stop(&procs[id].pid, SIGKILL, 10000);
                r.client_kills++;
                if (opt.verbose)
                    printf("soak: t=%.1fs SIGKILL worker %u\n", rel_s(now, r.t0), id);
                spawn_worker(id);
            }
            next_ckill = now + (uint64_t)(opt.client_kill_every * (0.5 + uniform(&rng)) * 1e9);
        }
        if (now >= next_progress) {
            unsigned long long gets = 0, puts = 0, dels = 0;
            for (unsigned i = 0; i < opt.procs; i++) {
                gets += atomic_load(&sh->w[i].gets);
                puts += atomic_load(&sh->w[i].puts);
                dels += atomic_load(&sh->w[i].deletes);
            }
            printf("soak: t=%.0fs %llu puts, %llu gets, %llu deletes so far; %u daemon kills, %u client kills\n",
                   rel_s(now, r.t0), puts, gets, dels, r.daemon_kills, r.client_kills);
            next_progress += 30 * NS_PER_S;
        }
        sleep_ms(20);
    }
    stop_workers();
    if (interrupted)
        goto cleanup;
    check_workers(false);

    /* Verification: on the running daemon, then after a clean restart. */
    if (analyse_journals(&r, a) != 0) {
        failed = 1;
        goto cleanup;
    }
    if (verify_keys(&r, a, "live", false, &live) != 0) {
        failed = 1;
        goto cleanup;
    }
    status = daemon_stop(&r);
    if (status != 0)
        printf("soak: kvnoded #%u did not stop cleanly (status %d)\n", r.epoch, status);
    if (interrupted || daemon_start(&r) != 0 || verify_keys(&r, a, "after restart", true, &restarted) != 0) {
        failed = 1;
        goto cleanup;
    }
    status = daemon_stop(&r);
    if (status != 0)
        printf("soak: kvnoded #%u did not stop cleanly (status %d)\n", r.epoch, status);

    unsigned unexpected_workers = 0;
    unsigned long long errs[KVNODE_ESHUTDOWN + 1] = { 0 }, gets = 0, exact = 0, reconnects = 0, matches = 0;
    for (unsigned i = 0; i < opt.procs; i++) {
        unexpected_workers += (unsigned)procs[i].unexpected;
        gets += atomic_load(&sh->w[i].gets);
        exact += atomic_load(&sh->w[i].gets_exact);
        reconnects += atomic_load(&sh->w[i].reconnects);
        matches += atomic_load(&sh->w[i].matches);
        for (int e = 0; e <= KVNODE_ESHUTDOWN; e++)
            errs[e] += atomic_load(&sh->w[i].errors[e]);
    }
    printf("soak: %u s, %u procs, %u daemon kills, %u client kills\n", opt.seconds, opt.procs, r.daemon_kills,
           r.client_kills);
    print_total(a, &a->traffic, &restarted);
    printf("  during the traffic: %llu gets (%llu read back byte-exact) and %llu MATCHes before re-puts found: ",
           gets, exact, matches);
    print_losses(&a->traffic);
    printf("\n");
    print_check("live daemon, after the traffic", &live);
    print_check("after a clean restart", &restarted);
    printf("  workers: %llu connections; in flight when their worker was killed (unacknowledged): %" PRIu64
           " puts, %" PRIu64 " deletes; failed puts and deletes (unacknowledged) %" PRIu64 "; errors:",
           reconnects, a->puts_unacked, a->deletes_unacked, a->failed_ops);
    const char *sep = " ";
    for (int e = 0; e <= KVNODE_ESHUTDOWN; e++)
        if (errs[e]) {
            printf("%s%s %llu", sep, e ? kvnode_strerror(-e) : "other", errs[e]);
            sep = ", ";
        }
    printf("%s\n", *sep == ' ' ? " none" : "");
    printf("  kvnoded: %" PRIu64 " blocks written to the store, %" PRIu64 " writes dropped (queue full), %" PRIu64
           " write failures, %" PRIu64 " writes deferred, %" PRIu64 " blocks evicted without a store copy, %"
           PRIu64 " failed promotions (as of each instance's last stats); log: %u errors, %u warnings; "
           "%u unclean stops, %u crashes of its own\n",
           r.sum.written, r.sum.dropped, r.sum.write_failures, r.sum.deferred, r.sum.evicted_unstored,
           r.sum.promotions_failed, r.log_errors, r.log_warnings, r.unclean_stops, r.unexpected_daemon_exits);
    for (unsigned i = 0; i < r.nfirst_errors; i++)
        printf("  kvnoded log: %s\n", r.first_errors[i]);
    if (a->unlisted)
        printf("soak: %u more problems not listed above (--verbose lists every one)\n", a->unlisted);

    struct outcome *phases[] = { &a->traffic, &live, &restarted };
    uint64_t n_wrong = 0, n_lost_other = 0, n_unreadable = 0;
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
        n_wrong += phases[i]->wrong;
        n_lost_other += phases[i]->lost[LOSS_OLD] + phases[i]->lost[LOSS_NO_KILL];
        n_unreadable += i > 0 ? phases[i]->unreadable : 0;
    }
    bool bad = outcome_bad(&a->traffic, false) || outcome_bad(&live, true) || outcome_bad(&restarted, true) ||
               unexpected_workers > 0 || r.unexpected_daemon_exits > 0;
    if (bad) {
        printf("soak: FAIL:");
        if (n_wrong)
            printf(" %" PRIu64 " wrong findings;", n_wrong);
        if (n_lost_other)
            printf(" %" PRIu64 " findings of keys lost otherwise than in the write-behind window;", n_lost_other);
        if (n_unreadable)
            printf(" %" PRIu64 " unreadable in the final checks;", n_unreadable);
        if (unexpected_workers)
            printf(" %u worker exits the soak did not cause;", unexpected_workers);
        if (r.unexpected_daemon_exits)
            printf(" kvnoded died by itself %u times;", r.unexpected_daemon_exits);
        printf(" see above\n");
    } else {
        printf("soak: PASS: nothing wrong or unreadable, every loss in the write-behind window before a kill -9\n");
    }
    failed = bad ? 1 : 0;

cleanup:
    atomic_store(&sh->stop, 1);
    for (unsigned i = 0; i < opt.procs; i++)
        if (procs[i].pid > 0)
            proc_stop(&procs[i].pid, SIGKILL, 10000);
    if (r.d.pid > 0 || r.d.dir[0]) {
        if (r.d.pid > 0)
            kvh_stop(&r.d, 10000);
        kvh_destroy(&r.d);
    }
    if (opt.keep_logs) {
        for (unsigned i = 0; i < opt.procs; i++) {
            char from[PATH_MAX + 32], to[PATH_MAX + 64];
            journal_path(from, sizeof from, i);
            snprintf(to, sizeof to, "%s/journal-%02u.bin", opt.keep_logs, i);
            copy_file(from, to);
        }
        printf("soak: daemon logs and journals kept in %s\n", opt.keep_logs);
    }
    for (unsigned i = 0; i < MAX_PROCS; i++) {
        free(a->j[i].recs);
        free(a->j[i].keys);
        free(a->j[i].live_exact);
    }
    free(a);
    free(r.kill_ns);
    free(daemon_config);
    free(opt.extra_config);
    if (interrupted) {
        fprintf(stderr, "soak: interrupted; processes stopped, temporary files removed\n");
        return 130;
    }
    return failed;
}

/* redisctl: real redis-server processes for the tests of the redis backend —
 * a cluster of M masters with R replicas each (redis-cli --cluster create),
 * or one plain server — on loopback ports in a temp dir, and redis-cli
 * calls against them. Header-only (static functions); children come from
 * proc.h (they die with the thread that started them). Functions return 0 /
 * -1 with the reason in rctl_err; tests wrap them in ck_assert_msg. */
#ifndef KVNODE_TESTS_REDISCTL_H
#define KVNODE_TESTS_REDISCTL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"
#include "rmtree.h"

#define RCTL_MAX_SERVERS 8
#define RCTL_NODE_TIMEOUT_MS 1000   /* cluster-node-timeout: a killed master fails over in ~2 s */

struct rctl {
    char dir[256];
    int n;
    int ports[RCTL_MAX_SERVERS];
    pid_t pids[RCTL_MAX_SERVERS];
    bool cluster;
    char password[64];
    char seeds[RCTL_MAX_SERVERS * 24];
};

static char rctl_err[512];

static inline void rctl_sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static inline bool rctl_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A port p with p and p + 10000 (the cluster bus) free, below the ephemeral range. */
static inline int rctl_pick_port(void)
{
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 1000; tries++) {
        int p = 16000 + (int)(rand_r(&seed) % 6000);
        if (rctl_port_free(p) && rctl_port_free(p + 10000))
            return p;
    }
    return -1;
}

/* redis-cli against server i with the arguments (NULL-terminated); *out
 * (malloc'd) gets its stdout. Returns the exit code or -1. */
static inline int rctl_cli_argv(const struct rctl *r, int i, char **out, const char *const *args)
{
    const char *argv[48];
    char port[16];
    int k = 0;
    snprintf(port, sizeof port, "%d", r->ports[i]);
    argv[k++] = "redis-cli";
    argv[k++] = "-h";
    argv[k++] = "127.0.0.1";
    argv[k++] = "-p";
    argv[k++] = port;
    if (r->password[0]) {
        argv[k++] = "--no-auth-warning";
        argv[k++] = "-a";
        argv[k++] = r->password;
    }
    for (int j = 0; args[j] && k < 47; j++)
        argv[k++] = args[j];
    argv[k] = NULL;
    struct proc_opts o = { .argv = argv, .in = PROC_NULL };
    char *err = NULL;
    int st = proc_run(&o, 60000, out, &err);
    if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        snprintf(rctl_err, sizeof rctl_err, "redis-cli -p %d %s: status %d: %.300s", r->ports[i],
                 args[0], st, err ? err : proc_error());
    free(err);
    return st < 0 ? -1 : proc_exit_code(st);
}

/* redis-cli with arguments as varargs (NULL-terminated). */
static inline int rctl_cli(const struct rctl *r, int i, char **out, ...)
{
    const char *args[40];
    int k = 0;
    va_list ap;
    va_start(ap, out);
    const char *a;
    while ((a = va_arg(ap, const char *)) && k < 39)
        args[k++] = a;
    va_end(ap);
    args[k] = NULL;
    return rctl_cli_argv(r, i, out, args);
}

static inline bool rctl_cli_has(const struct rctl *r, int i, const char *want, ...)
{
    const char *args[40];
    int k = 0;
    va_list ap;
    va_start(ap, want);
    const char *a;
    while ((a = va_arg(ap, const char *)) && k < 39)
        args[k++] = a;
    va_end(ap);
    args[k] = NULL;
    char *out = NULL;
    bool ok = rctl_cli_argv(r, i, &out, args) == 0 && out && strstr(out, want);
    free(out);
    return ok;
}

static inline int rctl_start_server(struct rctl *r, int i, const char *const *extra)
{
    char port[16], conf[320], logf[320];
    snprintf(port, sizeof port, "%d", r->ports[i]);
    snprintf(conf, sizeof conf, "nodes-%d.conf", r->ports[i]);
    snprintf(logf, sizeof logf, "%s/redis-%d.log", r->dir, r->ports[i]);
    const char *argv[64];
    int k = 0;
    argv[k++] = "redis-server";
    argv[k++] = "--port"; argv[k++] = port;
    argv[k++] = "--bind"; argv[k++] = "127.0.0.1";
    argv[k++] = "--dir"; argv[k++] = r->dir;
    argv[k++] = "--save"; argv[k++] = "";
    argv[k++] = "--appendonly"; argv[k++] = "no";
    argv[k++] = "--daemonize"; argv[k++] = "no";
    argv[k++] = "--logfile"; argv[k++] = logf;
    if (r->cluster) {
        static char nto[16];
        snprintf(nto, sizeof nto, "%d", RCTL_NODE_TIMEOUT_MS);
        argv[k++] = "--cluster-enabled"; argv[k++] = "yes";
        argv[k++] = "--cluster-config-file"; argv[k++] = conf;
        argv[k++] = "--cluster-node-timeout"; argv[k++] = nto;
        argv[k++] = "--cluster-replica-validity-factor"; argv[k++] = "0";
    }
    if (r->password[0]) {
        argv[k++] = "--requirepass"; argv[k++] = r->password;
        argv[k++] = "--masterauth"; argv[k++] = r->password;
    }
    for (int j = 0; extra && extra[j] && k < 62; j++)
        argv[k++] = extra[j];
    argv[k] = NULL;
    struct proc_opts o = { .argv = argv, .in = PROC_NULL, .out = PROC_NULL, .err = PROC_NULL };
    r->pids[i] = proc_spawn(&o, NULL);
    if (r->pids[i] < 0) {
        snprintf(rctl_err, sizeof rctl_err, "redis-server: %s", proc_error());
        r->pids[i] = 0;
        return -1;
    }
    for (int t = 0; t < 200; t++) {
        if (rctl_cli_has(r, i, "PONG", "ping", (const char *)NULL))
            return 0;
        rctl_sleep_ms(25);
    }
    snprintf(rctl_err, sizeof rctl_err, "redis-server on port %d did not answer PING", r->ports[i]);
    return -1;
}

/* Every server's CLUSTER INFO says ok and the slots are covered. */
static inline int rctl_wait_ok(const struct rctl *r, int timeout_ms)
{
    if (!r->cluster)
        return 0;
    for (int t = 0; t < timeout_ms / 100; t++) {
        bool ok = true;
        for (int i = 0; i < r->n && ok; i++)
            if (r->pids[i] > 0)
                ok = rctl_cli_has(r, i, "cluster_state:ok", "cluster", "info", (const char *)NULL) &&
                     rctl_cli_has(r, i, "cluster_slots_assigned:16384", "cluster", "info",
                                  (const char *)NULL);
        if (ok)
            return 0;
        rctl_sleep_ms(100);
    }
    snprintf(rctl_err, sizeof rctl_err, "cluster not ok after %d ms", timeout_ms);
    return -1;
}

/* Start masters * (1 + replicas) servers; masters == 0: one plain server.
 * password NULL/"": none. extra: more redis-server arguments for each. */
static inline int rctl_start(struct rctl *r, int masters, int replicas, const char *password,
                      const char *const *extra)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "/tmp/kvnode-redis-XXXXXX");
    if (!mkdtemp(r->dir)) {
        snprintf(rctl_err, sizeof rctl_err, "mkdtemp failed");
        return -1;
    }
    snprintf(r->password, sizeof r->password, "%s", password ? password : "");
    r->cluster = masters > 0;
    r->n = r->cluster ? masters * (1 + replicas) : 1;
    if (r->n > RCTL_MAX_SERVERS)
        return -1;
    size_t w = 0;
    for (int i = 0; i < r->n; i++) {
        int p;
        do
            p = rctl_pick_port();
        while (p > 0 && i > 0 && (p == r->ports[i - 1]));
        if (p < 0) {
            snprintf(rctl_err, sizeof rctl_err, "no free port pair");
            return -1;
        }
        r->ports[i] = p;
        if (rctl_start_server(r, i, extra) < 0)
            return -1;
        w += (size_t)snprintf(r->seeds + w, sizeof r->seeds - w, "%s127.0.0.1:%d", i ? "," : "", p);
    }
    if (!r->cluster)
        return 0;
    const char *args[40];
    char hp[RCTL_MAX_SERVERS][32], reps[8];
    int k = 0;
    args[k++] = "--cluster";
    args[k++] = "create";
    for (int i = 0; i < r->n; i++) {
        snprintf(hp[i], sizeof hp[i], "127.0.0.1:%d", r->ports[i]);
        args[k++] = hp[i];
    }
    snprintf(reps, sizeof reps, "%d", replicas);
    args[k++] = "--cluster-replicas";
    args[k++] = reps;
    args[k++] = "--cluster-yes";
    args[k] = NULL;
    char *out = NULL;
    int rc = rctl_cli_argv(r, 0, &out, args);
    free(out);
    if (rc != 0)
        return -1;
    return rctl_wait_ok(r, 20000);
}

/* kill -9 server i. */
static inline void rctl_kill(struct rctl *r, int i)
{
    if (r->pids[i] > 0)
        proc_stop(&r->pids[i], SIGKILL, 5000);
    r->pids[i] = 0;
}

static inline void rctl_stop(struct rctl *r)
{
    for (int i = 0; i < r->n; i++)
        if (r->pids[i] > 0)
            proc_stop(&r->pids[i], SIGKILL, 5000);
    test_rmtree(r->dir);
    memset(r, 0, sizeof *r);
}

/* The index of the server at port, or -1. */
static inline int rctl_index(const struct rctl *r, int port)
{
    for (int i = 0; i < r->n; i++)
        if (r->ports[i] == port)
            return i;
    return -1;
}

/* The index of the master serving key (CLUSTER KEYSLOT, then CLUSTER NODES:
 * "id host:port@cport flags master ping pong epoch link slot-ranges..."). */
static inline int rctl_master_of(const struct rctl *r, const char *key)
{
    int live = -1;
    for (int i = 0; i < r->n && live < 0; i++)
        if (r->pids[i] > 0)
            live = i;
    if (live < 0 || !r->cluster)
        return live;
    char *out = NULL;
    if (rctl_cli(r, live, &out, "cluster", "keyslot", key, (const char *)NULL) != 0) {
        free(out);
        return -1;
    }
    long slot = strtol(out, NULL, 10);
    free(out);
    out = NULL;
    if (rctl_cli(r, live, &out, "cluster", "nodes", (const char *)NULL) != 0) {
        free(out);
        return -1;
    }
    int found = -1;
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line && found < 0; line = strtok_r(NULL, "\n", &save)) {
        char *tok[64];
        int nt = 0;
        char *s2 = NULL;
        for (char *t = strtok_r(line, " ", &s2); t && nt < 64; t = strtok_r(NULL, " ", &s2))
            tok[nt++] = t;
        if (nt < 9 || !strstr(tok[2], "master") || strstr(tok[2], "fail"))
            continue;
        int port = atoi(strchr(tok[1], ':') ? strchr(tok[1], ':') + 1 : "0");
        for (int j = 8; j < nt; j++) {
            if (tok[j][0] == '[')
                continue;            /* a slot being migrated */
            long lo = strtol(tok[j], NULL, 10), hi = lo;
            char *dash = strchr(tok[j], '-');
            if (dash)
                hi = strtol(dash + 1, NULL, 10);
            if (slot >= lo && slot <= hi) {
                found = rctl_index(r, port);
                break;
            }
        }
    }
    free(out);
    return found;
}

#endif

/* kvnoded: wiring — arguments, config, signals, start and stop order. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/event.h>

#include "net/admin.h"
#include "net/kvs_server.h"
#include "cache/cache.h"
#include "config/config.h"
#include "daemon.h"
#include "gpu/gpu.h"
#include "kvnode.h"
#include "core/log.h"
#include "memcheck.h"
#include "metrics.h"
#include "kvcm/kvcm.h"
#include "kvcm/query.h"
#include "net/ops.h"
#include "persist/persist.h"
#include "reload.h"
#include "sdnotify.h"
#include "net/server.h"
#include "stats.h"
#include "tenants/tenants.h"
#include "takeover.h"
#include "warm.h"

#define DEFAULT_CONFIG_PATH "/etc/kvnode/kvnode.conf"


static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvnoded [-c|--config FILE] [-s|--set SECTION.KEY=VALUE]... [--check-config]\n"
            "               [--takeover SOCKET] [-V|--version] [-h|--help]\n"
            "\n"
            "  -c, --config FILE   configuration file (default " DEFAULT_CONFIG_PATH " if it exists)\n"
            "  -s, --set S.K=V     override one option, e.g. --set memory.host_bytes=4GiB\n"
            "      --check-config  validate the configuration, print the effective one, exit\n"
            "      --takeover SOCKET  take over from the daemon serving on SOCKET: it stops and\n"
            "                      hands its host tier over (warm restart without systemd)\n"
            "  -V, --version       print the version\n"
            "  -h, --help          this text\n"
            "\n"
            "Options are documented in kvnode.conf(5); the daemon in kvnoded(8).\n");
}


/* Descriptors the daemon needs besides its connections: listeners, the
 * event loop, arenas, store files, KVCM sockets, with room to spare. */
#define DAEMON_OWN_FDS 64u
#define DAEMON_TENANT_FDS 8u

/* Connections are bounded by server.max_clients and admin.max_connections;
 * past RLIMIT_NOFILE accepts fail and the listeners pause, so say so at
 * start rather than when it happens. */
static void daemon_check_fd_limit(const struct daemon *d)
{
    struct rlimit rl;
    /* Each tenant besides "default" brings its memfd and the memfd's
     * read-only reopen (for readers), its store's root and queue
     * descriptors: a few each, counted as DAEMON_TENANT_FDS. */
    uint64_t need = (uint64_t)d->cfg->max_clients + DAEMON_OWN_FDS +
                    (uint64_t)(tenants_count(d->tenants) - 1) * DAEMON_TENANT_FDS;
    char admin[96] = "";

    if (d->admin) {
        need += d->cfg->admin_max_connections;
        snprintf(admin, sizeof admin, " + admin.max_connections (%u)", d->cfg->admin_max_connections);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || need <= rl.rlim_cur)
        return;
    log_warn("server.max_clients (%u)%s + %u descriptors of the daemon's own = %llu exceed RLIMIT_NOFILE "
             "(%llu): at the limit new connections wait until descriptors free up; raise the limit "
             "(LimitNOFILE= in the unit, ulimit -n) or lower the options", d->cfg->max_clients, admin,
             DAEMON_OWN_FDS, (unsigned long long)need, (unsigned long long)rl.rlim_cur);
}

/* RELOAD requests from kvnodectl go through the same path as SIGHUP. */
static int daemon_reload_hook(void *arg, char *error, size_t errlen, char *not_applied, size_t nalen)
{
    struct reload_result res;
    int rc = reload_run(arg, &res);

    snprintf(error, errlen, "%s", res.error);
    snprintf(not_applied, nalen, "%s", res.not_applied);
    return rc;
}

/* The STATS op's document (ops_set_stats_hook), as its client may see it. */
static json_t *daemon_stats_document(void *arg, const struct session *viewer)
{
    struct daemon *d = arg;
    struct stats_view view = stats_client_view(d, viewer->tenant, viewer->uid);
    return stats_document_for(d, &view);
}

/* The admin pages (admin_deps): what stats.c and metrics.c build for d. */
static json_t *daemon_admin_stats(void *arg)
{
    return stats_document(arg);
}

static int daemon_admin_metrics(void *arg, struct evbuffer *out)
{
    return metrics_render(arg, out);
}

/* Before HBM is freed: whether the clients it was lent to let go of it
 * (closed after GoingAway) or may still map it (the server's stop counts;
 * the connections still open then were closed by server_destroy). */
static void daemon_log_hbm_release(const struct kvn_config *cfg, const struct server_stats *stop)
{
    uint64_t held = stop->hbm_held + stop->hbm_lent;

    if (held)
        log_warn("stop: freeing HBM while %" PRIu64 " client%s lent it still held it (the daemon closed %s "
                 "connection%s; hbm.release_timeout = %u ms%s)", held, held == 1 ? "" : "s",
                 held == 1 ? "its" : "their", held == 1 ? "" : "s", cfg->hbm_release_timeout_ms,
                 cfg->hbm_release_timeout_ms ? "" : ": not waited for");
    else if (stop->hbm_released)
        log_info("stop: freeing HBM: every client lent it (%" PRIu64 ") had closed its connection",
                 stop->hbm_released);
}

/* A clean stop: SIGTERM, SIGINT, or a takeover's request. */
static void daemon_begin_stop(void *arg)
{
    struct daemon *d = arg;
    sdn_stopping(d);
    admin_begin_shutdown(d->admin);
    kvs_server_begin_shutdown(d->kvs);
    server_begin_shutdown(d->server);
}

/* The longest a clean stop may take (README "Stop timeout"), and a margin:
 * how long `--takeover` waits for the old daemon's hand-over. */
static unsigned daemon_stop_bound_ms(const struct kvn_config *cfg)
{
    unsigned clients = cfg->shutdown_timeout_ms > cfg->hbm_release_timeout_ms ? cfg->shutdown_timeout_ms
                                                                             : cfg->hbm_release_timeout_ms;
    return clients + cfg->shutdown_timeout_ms + cfg->kvcm.host_down_timeout_ms + 30000u;
}

static void daemon_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    struct daemon *d = arg;
    (void)what;
    if (sig == SIGHUP) {
        struct reload_result res;
        reload_run(d, &res);
        return;
    }
    log_info("received %s: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    daemon_begin_stop(d);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "config", required_argument, NULL, 'c' },
        { "set", required_argument, NULL, 's' },
        { "check-config", no_argument, NULL, 'C' },
        { "takeover", required_argument, NULL, 'T' },
        { "version", no_argument, NULL, 'V' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    struct daemon d = { 0 };
    struct server_stats stop = { 0 };
    struct event *sigs[3] = { NULL, NULL, NULL };
    const int signums[3] = { SIGTERM, SIGINT, SIGHUP };
    char err[CONFIG_ERR_MAX];
    bool check_only = false;
    const char *takeover_path = NULL;
    struct takeover *tk = NULL;
    int opt, rc = 1, listen_fd = -1;

    while ((opt = getopt_long(argc, argv, "c:s:Vh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': d.config_path = optarg; break;
        case 's':
            if (d.noverrides == DAEMON_MAX_OVERRIDES) {
                fprintf(stderr, "kvnoded: at most %d --set options\n", DAEMON_MAX_OVERRIDES);
                return 2;
            }
            d.overrides[d.noverrides++] = optarg;
            break;
        case 'C': check_only = true; break;
        case 'T': takeover_path = optarg; break;
        case 'V': printf("kvnoded %s (protocol %u)\n", KVNODE_VERSION_STRING, 1u); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvnoded: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!d.config_path && access(DEFAULT_CONFIG_PATH, F_OK) == 0)
        d.config_path = DEFAULT_CONFIG_PATH;

    d.cfg = malloc(sizeof *d.cfg);
    if (!d.cfg) {
        fprintf(stderr, "kvnoded: out of memory\n");
        return 1;
    }
    if (daemon_load_config(&d, d.cfg, err, sizeof err) < 0) {
        fprintf(stderr, "kvnoded: invalid configuration:\n%s\n", err);
        free(d.cfg);
        return 2;
    }
    if (takeover_path && check_only) {
        fprintf(stderr, "kvnoded: --takeover and --check-config do not go together\n");
        free(d.cfg);
        return 2;
    }
    /* A warm restart's hand-over (warm.h): from the daemon taken over, else
     * from systemd's fd store, beside the engine socket it passed. */
    struct sdn_fd stored[WARM_FDS_MAX], sd_stored[WARM_FDS_MAX];
    size_t nstored = 0, nsd = 0;
    const char *source = "systemd";
    if (takeover_path) {
        if (takeover_request(takeover_path, daemon_stop_bound_ms(d.cfg), stored, WARM_FDS_MAX, &nstored, err,
                             sizeof err) < 0) {
            log_error("takeover refused: %s; the running daemon goes on", err);
            free(d.cfg);
            return 1;
        }
        source = "takeover";
    }
    if (!check_only && sdn_listen_fd(&listen_fd, takeover_path ? sd_stored : stored, WARM_FDS_MAX,
                                     takeover_path ? &nsd : &nstored, err, sizeof err) < 0) {
        log_error("%s", err);
        warm_close_fds(stored, nstored);
        free(d.cfg);
        return 1;
    }
    warm_close_fds(sd_stored, nsd);
    /* Admission, before anything is reserved: memfd pages being reserved
     * count toward no process's OOM score, so a tier larger than the
     * machine would get other processes (the engines) killed first.
     * --check-config checks the file on this machine too. */
    struct memcheck_room room;
    char admission[PATH_MAX + 1024];
    memcheck_probe(NULL, &room);
    int admitted = memcheck_admit(d.cfg, &room, admission, sizeof admission);
    if (admitted < 0 && nstored > 0) {
        /* The memory handed over is reserved already: counted as used. */
        log_warn("memory: %s; starting with the host memory handed over, which is reserved already",
                 admission);
    } else if (admitted < 0) {
        if (check_only)
            fprintf(stderr, "kvnoded: the configuration does not fit this machine:\n%s\n", admission);
        else
            log_error("refusing to start: %s", admission);
        free(d.cfg);
        return check_only ? 2 : 1;
    }
    if (check_only) {
        config_write(d.cfg, stdout);
        free(d.cfg);
        return 0;
    }
    log_set_level(d.cfg->log_level);
    signal(SIGPIPE, SIG_IGN);
    /* A store file over RLIMIT_FSIZE fails its write (EFBIG), not the daemon. */
    signal(SIGXFSZ, SIG_IGN);
    /* Frames of up to max_frame_bytes are allocated and freed per request:
     * keep them on the heap instead of a fresh (page-faulting) mmap each time,
     * and keep freed memory instead of trimming and faulting it back in. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);

    /* With libevent's changelist, the epoll_ctl calls a connection's events
     * make within one loop turn become one (or none): arming the write
     * event for a reply written at once, re-arming the read event after a
     * request. Its one hazard, two descriptors of one open file in the
     * loop, does not arise: the daemon never dup()s a descriptor it
     * watches. */
    struct event_config *ecfg = event_config_new();
    if (ecfg)
        event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    d.base = ecfg ? event_base_new_with_config(ecfg) : NULL;
    if (ecfg)
        event_config_free(ecfg);
    if (!d.base) {
        log_error("cannot create the event loop");
        goto out;
    }
    /* Before any socket exists: a SIGTERM from whoever sees the socket (a
     * service manager, a test) is then a graceful stop, run when the loop
     * starts, never the default action's abrupt death. */
    for (int i = 0; i < 3; i++) {
        sigs[i] = evsignal_new(d.base, signums[i], daemon_signal_cb, &d);
        if (!sigs[i] || evsignal_add(sigs[i], NULL) < 0) {
            log_error("cannot install signal handlers");
            goto out;
        }
    }
    if (room.unread[0])
        log_warn("memory: the admission check could not read everything: %s", room.unread);
    log_info("%s", admission);
    /* The hand-over read above (takeover or systemd's fd store): checked
     * here, then adopted (or refused, all of it) by tenants_create. */
    struct tenants_warm tw;
    struct warm_snapshot *snap = NULL;
    int warm = warm_open(stored, nstored, source, d.cfg, &tw, &snap);
    if (tenants_create(d.base, d.cfg, warm ? &tw : NULL, &d.tenants, err, sizeof err) < 0) {
        log_error("cannot create the host tier: %s", err);
        warm_finish(snap, &tw, NULL);
        goto out;
    }
    warm_finish(snap, &tw, d.tenants);
    if (tenants_start_gpu(d.tenants, d.base, d.cfg, &d.gpu, err, sizeof err) < 0) {
        log_error("cannot start the GPU tier: %s", err);
        goto out;
    }
    if (tenants_start_persist(d.tenants, d.base, d.cfg, err, sizeof err) < 0) {
        log_error("cannot start persistence: %s", err);
        goto out;
    }
    if (daemon_start_kvcm(&d, err, sizeof err) < 0) {
        log_error("cannot start the KVCM publisher: %s", err);
        goto out;
    }
    /* Adopted blocks were sealed before the publisher observed the caches. */
    if (warm_status()->blocks)
        kvcm_resync(d.kvcm);
    if (ops_create(d.tenants, d.cfg, &d.ops) < 0) {
        log_error("out of memory");
        goto out;
    }
    /* The admin and KVS listeners before the engine socket: once that one
     * accepts, every door the configuration opens exists (requests wait
     * for the loop either way). */
    const struct admin_deps admin_deps = {
        .base = d.base, .cfg = &d.cfg, .ctx = &d, .ready_notes = daemon_ready_notes,
        .stats_document = daemon_admin_stats, .metrics_page = daemon_admin_metrics,
    };
    if (admin_create(&admin_deps, &d.admin, err, sizeof err) < 0) {
        log_error("%s", err);
        goto out;
    }
    const struct kvs_server_deps kvs_deps = { .base = d.base, .cfg = &d.cfg, .tenants = d.tenants };
    if (kvs_server_create(&kvs_deps, &d.kvs, err, sizeof err) < 0) {
        log_error("%s", err);
        goto out;
    }
    struct server_handler handler = ops_server_handler(d.ops);
    if (server_create(d.base, d.cfg, &handler, listen_fd, &d.server, err, sizeof err) < 0) {
        log_error("%s", err);
        goto out;
    }
    if (listen_fd >= 0)
        log_info("socket activation: serving on the socket systemd passed (fd %d, %s)%s",
                 listen_fd, server_socket_path(d.server),
                 strcmp(server_socket_path(d.server), d.cfg->socket_path) == 0 ? "" :
                 "; server.socket_path is not used");
    if (takeover_listen(d.base, server_socket_path(d.server), daemon_begin_stop, &d, &tk, err, sizeof err) < 0)
        log_warn("%s: kvnoded --takeover cannot reach this daemon", err);
    ops_set_server(d.ops, d.server);
    ops_set_querier(d.ops, d.querier);
    ops_set_reload(d.ops, daemon_reload_hook, &d);
    ops_set_stats_hook(d.ops, daemon_stats_document, &d);
    daemon_check_fd_limit(&d);
    log_info("kvnoded %s serving on %s (config %s): host tier %llu MiB, slabs of %llu KiB",
             KVNODE_VERSION_STRING, server_socket_path(d.server),
             d.config_path ? d.config_path : "built-in defaults",
             (unsigned long long)(d.cfg->host_bytes >> 20),
             (unsigned long long)(d.cfg->slab_bytes >> 10));
    /* Serve while the store is scanned: MATCH sees what was found so far. */
    tenants_start_recovery(d.tenants);
    /* Listeners and arenas are usable: tell systemd (no-op outside it). */
    if (sdn_start(&d) < 0) {
        log_error("cannot create the systemd status/watchdog timers");
        goto out;
    }
    if (event_base_dispatch(d.base) < 0) {
        log_error("event loop failed");
        goto out;
    }
    log_info("stopped");
    rc = 0;
out:
    /* Connections first (their leases), then what is still queued for the
     * store (bounded), then the cache they all point into. */
    admin_destroy(d.admin);
    kvs_server_destroy(d.kvs);   /* its HTTP leases, before the caches */
    if (d.server)
        server_get_stats(d.server, &stop);
    server_destroy(d.server);
    if (d.tenants)
        tenants_stop_persist(d.tenants, d.cfg->shutdown_timeout_ms);
    /* A clean stop hands the host tier to the next start (warm.h). */
    if (rc == 0 && d.tenants && !takeover_handover(tk, d.tenants, d.cfg))
        warm_handover_systemd(d.tenants, d.cfg);
    /* KVCM last: HOST_DOWN tells it everything we held is gone (not when the
     * host tier went to the next start: its first snapshot says what is kept). */
    kvcm_querier_destroy(d.querier);
    if (warm_status()->handed_over)
        kvcm_stop_handed_over(d.kvcm);
    else
        kvcm_stop(d.kvcm);
    kvcm_destroy(d.kvcm);
    ops_destroy(d.ops);
    gpu_stop(d.gpu);
    tenants_destroy(d.tenants);
    daemon_log_hbm_release(d.cfg, &stop);
    gpu_destroy(d.gpu);
    for (int i = 0; i < 3; i++)
        if (sigs[i])
            event_free(sigs[i]);
    sdn_stop();
    takeover_destroy(tk);   /* its peer's connection stays open until the process exits */
    if (d.base)
        event_base_free(d.base);
    libevent_global_shutdown();
    free(d.cfg);
    return rc;
}

/* sdnotify: see sdnotify.h. */
#include "sdnotify.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <systemd/sd-daemon.h>

#include "cache/cache.h"
#include "daemon.h"
#include "tenants/tenants.h"
#include "core/log.h"
#include "persist/persist.h"
#include "net/server.h"
#include "core/liveness.h"

#define SDN_STATUS_INTERVAL_MS 5000
#define SDN_STATUS_MAX 2048   /* a line per tenant fits (17 of them) */

static struct {
    struct daemon *d;
    bool notify;                        /* NOTIFY_SOCKET set */
    struct event *status_ev;
    struct event *watchdog_ev;
    uint64_t watchdog_usec;
    bool watchdog_stalled;              /* last check failed (logged once) */
    bool stopping;                      /* STOPPING=1 sent: no more READY=1 */
    char last_status[SDN_STATUS_MAX];
} sdn;

int sdn_listen_fd(int *fd, struct sdn_fd *stored, size_t max, size_t *nstored, char *err, size_t errlen)
{
    char **names = NULL;
    int n = sd_listen_fds_with_names(1, &names), sockets = 0, rc = 0;

    *fd = -1;
    *nstored = 0;
    if (n < 0) {
        snprintf(err, errlen, "socket activation: cannot read LISTEN_FDS: %s", strerror(-n));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int f = SD_LISTEN_FDS_START + i;
        const char *name = names && names[i] ? names[i] : "unknown";
        if (strncmp(name, SDN_STORED_PREFIX, strlen(SDN_STORED_PREFIX)) != 0) {
            sockets++;
            if (*fd < 0)
                *fd = f;
            else
                close(f);
        } else if (*nstored < max && strlen(name) < SDN_FDNAME_MAX) {
            stored[*nstored].fd = f;
            snprintf(stored[*nstored].name, SDN_FDNAME_MAX, "%s", name);
            (*nstored)++;
        } else {
            close(f);
        }
    }
    if (sockets > 1) {
        snprintf(err, errlen, "socket activation: systemd passed %d sockets; kvnoded serves "
                 "exactly one (one ListenStream= in kvnoded.socket)", sockets);
        rc = -1;
    }
    for (int i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

bool sdn_under_systemd(void)
{
    const char *e = getenv("NOTIFY_SOCKET");
    return e && *e;
}

int sdn_fdstore(int fd, const char *name)
{
    char msg[32 + SDN_FDNAME_MAX];
    if (!sdn_under_systemd())
        return 0;
    snprintf(msg, sizeof msg, "FDSTORE=1\nFDNAME=%s", name);
    return sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
}

void sdn_fdstore_remove(const char *name)
{
    if (sdn_under_systemd())
        sd_notifyf(0, "FDSTOREREMOVE=1\nFDNAME=%s", name);
}

static void sdn_human_bytes(uint64_t v, char *buf, size_t len)
{
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    double x = (double)v;
    size_t u = 0;

    while (x >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
        x /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)v);
    else
        snprintf(buf, len, "%.1f %s", x, units[u]);
}

/* ", " between tiers; the first has only the space. */
static const char *sdn_sep(bool *first)
{
    const char *sep = *first ? "" : ",";
    *first = false;
    return sep;
}

void sdn_status_line(struct daemon *d, char *buf, size_t len)
{
    struct cache_stats *cs;
    struct server_stats ss;
    size_t off = 0;
    int n;

#define SDN_APPEND(...) do { \
        n = snprintf(buf + off, len - off, __VA_ARGS__); \
        off = (n < 0 || (size_t)n >= len - off) ? len - 1 : off + (size_t)n; \
    } while (0)

    if (!len)
        return;
    buf[0] = '\0';
    if (!(cs = malloc(sizeof *cs)))
        return;
    tenants_cache_totals(d->tenants, cs);
    server_get_stats(d->server, &ss);
    SDN_APPEND("serving on %s:", server_socket_path(d->server));
    bool first = true;
    char used[32], cap[32];
    sdn_human_bytes(cs->host.used_bytes, used, sizeof used);
    sdn_human_bytes(cs->host.capacity, cap, sizeof cap);
    SDN_APPEND("%s host %s of %s used", sdn_sep(&first), used, cap);
    /* Start-up reservation still running, or stopped short. */
    if (cs->populate_state && strcmp(cs->populate_state, "done") != 0) {
        char res[32];
        sdn_human_bytes(cs->host.reserved_bytes, res, sizeof res);
        SDN_APPEND(" (%s reserved, %s)", res,
                   strcmp(cs->populate_state, "running") == 0 ? "populating" : cs->populate_state);
    }
    /* hbm: one arena per GPU */
    for (unsigned i = 0; i < cs->nhbm; i++) {
        sdn_human_bytes(cs->hbm[i].mem.used_bytes, used, sizeof used);
        sdn_human_bytes(cs->hbm[i].mem.capacity, cap, sizeof cap);
        SDN_APPEND("%s hbm%d %s of %s used", sdn_sep(&first), cs->hbm[i].device, used, cap);
    }
    /* the store tier: blocks known only there */
    if (cs->has_store)
        SDN_APPEND("%s store %llu blocks", sdn_sep(&first), (unsigned long long)cs->store_blocks);
    unsigned long long clients = ss.connected;
    size_t nss = cs->namespaces;
    SDN_APPEND(", %llu client%s, %zu namespace%s", clients, clients == 1 ? "" : "s",
               nss, nss == 1 ? "" : "s");
    const struct cache_persist_stats *p = &cs->persist;
    if (p->on && p->store.state != PERSIST_STATE_OFF) {
        const char *perr = p->last_error;
        SDN_APPEND("; store %s %s, queue %llu", p->backend, persist_state_name(p->store.state),
                   (unsigned long long)p->store.queue_depth);
        if (p->store.scan_running)
            SDN_APPEND(", recovering (%llu found)", (unsigned long long)p->store.scan_found);
        /* Anyone may read STATUS; the store's error may name a deployment. */
        if (p->store.state == PERSIST_STATE_DEGRADED && perr && *perr && !tenants_configured(d->tenants))
            SDN_APPEND(": %.*s", (int)strcspn(perr, "\n") > 160 ? 160 : (int)strcspn(perr, "\n"), perr);
    }
    if (tenants_configured(d->tenants)) {
        /* Per tenant: its host memory and its clients (names only, no models). */
        for (size_t i = 0; i < tenants_count(d->tenants); i++) {
            const struct tenant *t = tenants_at(d->tenants, i);
            struct arena_stats hs = { 0 };
            if (t->cache)
                cache_host_stats(t->cache, &hs);
            sdn_human_bytes(hs.used_bytes, used, sizeof used);
            sdn_human_bytes(hs.capacity, cap, sizeof cap);
            SDN_APPEND("%s %s %s of %s, %u client%s", i ? "," : "; tenants", t->name, used, cap,
                       t->clients, t->clients == 1 ? "" : "s");
        }
    }
    if (d->last_reload_error[0]) {
        /* First line of the error only: STATUS is one line. */
        size_t el = strcspn(d->last_reload_error, "\n");
        SDN_APPEND("; last reload failed: %.*s", (int)(el > 200 ? 200 : el), d->last_reload_error);
    }
    if (sdn.watchdog_stalled)
        SDN_APPEND("; workers stalled, watchdog not pinged");
    free(cs);
#undef SDN_APPEND
}

/* STATUS=, only when it changed (or force). */
static void sdn_send_status(struct daemon *d, const char *prefix, bool force)
{
    char line[SDN_STATUS_MAX];

    sdn_status_line(d, line, sizeof line);
    if (!force && strcmp(line, sdn.last_status) == 0)
        return;
    memcpy(sdn.last_status, line, sizeof line);
    sd_notifyf(0, "%sSTATUS=%s", prefix, line);
}

static void sdn_status_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sdn_send_status(arg, "", false);
}

static void sdn_watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    const struct daemon *d = arg;
    char stalled[256];
    (void)fd;
    (void)what;
    /* Firing at all proves the loop thread runs; the workers prove
     * themselves with their heartbeats. */
    if (liveness_check(liveness_now_ms(), d->cfg->worker_stall_timeout_ms, stalled, sizeof stalled)) {
        if (sdn.watchdog_stalled)
            log_info("watchdog: every worker is alive again; pinging systemd");
        sdn.watchdog_stalled = false;
        sd_notify(0, "WATCHDOG=1");
        return;
    }
    if (!sdn.watchdog_stalled)
        log_error("watchdog: worker%s %s stalled (no heartbeat for %u ms); not pinging systemd",
                  strchr(stalled, ',') ? "s" : "", stalled, (unsigned)d->cfg->worker_stall_timeout_ms);
    sdn.watchdog_stalled = true;
}

static struct event *sdn_timer(struct event_base *base, uint64_t usec, event_callback_fn cb, void *arg)
{
    struct timeval tv = { .tv_sec = (time_t)(usec / 1000000u), .tv_usec = (suseconds_t)(usec % 1000000u) };
    struct event *ev = event_new(base, -1, EV_PERSIST, cb, arg);

    if (ev && event_add(ev, &tv) < 0) {
        event_free(ev);
        ev = NULL;
    }
    return ev;
}

int sdn_start(struct daemon *d)
{
    const char *ns = getenv("NOTIFY_SOCKET");
    uint64_t usec = 0;
    int wd;

    sdn.d = d;
    sdn.notify = ns && *ns;
    if (!sdn.notify)
        return 0;
    sdn_send_status(d, "READY=1\n", true);
    sdn.status_ev = sdn_timer(d->base, SDN_STATUS_INTERVAL_MS * 1000u, sdn_status_cb, d);
    if (!sdn.status_ev)
        return -1;
    wd = sd_watchdog_enabled(0, &usec);
    if (wd < 0)
        log_warn("systemd watchdog: cannot read WATCHDOG_USEC: %s; not pinging", strerror(-wd));
    if (wd > 0 && usec > 0) {
        sdn.watchdog_usec = usec;
        sdn.watchdog_ev = sdn_timer(d->base, usec / 2, sdn_watchdog_cb, d);
        if (!sdn.watchdog_ev)
            return -1;
        sd_notify(0, "WATCHDOG=1");
        log_info("systemd watchdog: %llu ms, pinging every %llu ms while every worker is alive",
                 (unsigned long long)(usec / 1000), (unsigned long long)(usec / 2000));
    }
    return 0;
}

void sdn_reloading(struct daemon *d)
{
    struct timespec ts;
    (void)d;
    if (!sdn.notify || sdn.stopping)
        return;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading the configuration",
               (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000u);
    snprintf(sdn.last_status, sizeof sdn.last_status, "reloading the configuration");
}

void sdn_ready(struct daemon *d)
{
    if (sdn.notify && !sdn.stopping)
        sdn_send_status(d, "READY=1\n", true);
}

void sdn_stopping(struct daemon *d)
{
    if (!sdn.notify || sdn.stopping)
        return;
    sdn.stopping = true;
    struct server_stats ss;
    server_get_stats(d->server, &ss);
    unsigned long long clients = ss.connected;
    sd_notifyf(0, "STOPPING=1\nSTATUS=stopping: finishing %llu client%s", clients,
               clients == 1 ? "" : "s");
    /* The status timer would overwrite that line with "serving ...". */
    if (sdn.status_ev) {
        event_free(sdn.status_ev);
        sdn.status_ev = NULL;
    }
}

void sdn_stop(void)
{
    if (sdn.status_ev)
        event_free(sdn.status_ev);
    if (sdn.watchdog_ev)
        event_free(sdn.watchdog_ev);
    memset(&sdn, 0, sizeof sdn);
}

/* ops control: the requests that are not about blocks — HELLO (protocol
 * version, the layout, binding the namespace, the arenas lent to the client),
 * STATS, PING and RELOAD (see ops.h). Loop thread only. */
#include "net/ops_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/busid.h"
#include "core/clock.h"
#include "core/errmsg.h"
#include "mem/index.h"
#include "kvnode.h"
#include "core/log.h"
#include "wire.h"

/* hbm_unusable is logged at most once a minute (the rest counted in /stats). */
#define OPS_UNUSABLE_LOG_MS 60000u

/* Copy a wire string into a fixed field, refusing what does not fit. */
static int ops_copy_field(char *dst, size_t cap, const char *src, const char *name,
                          char *err, size_t errlen)
{
    size_t len = src ? strlen(src) : 0;
    if (len >= cap) {
        snprintf(err, errlen, "layout.%s is %zu bytes long; the limit is %zu", name, len, cap - 1);
        return -KVNODE_ELAYOUT;
    }
    memcpy(dst, src ? src : "", len + 1);
    return 0;
}

static int ops_layout_from_wire(const Kvnode__Layout *w, struct ns_layout *l, char *err, size_t errlen)
{
    int rc;
    memset(l, 0, sizeof *l);
    if ((rc = ops_copy_field(l->model, sizeof l->model, w->model, "model", err, errlen)) < 0 ||
        (rc = ops_copy_field(l->dtype, sizeof l->dtype, w->dtype, "dtype", err, errlen)) < 0 ||
        (rc = ops_copy_field(l->extra, sizeof l->extra, w->extra, "extra", err, errlen)) < 0 ||
        (rc = ops_copy_field(l->revision, sizeof l->revision, w->revision, "revision", err, errlen)) < 0)
        return rc;
    l->block_tokens = w->block_tokens;
    l->block_bytes = w->block_bytes;
    l->num_layers = w->num_layers;
    l->kv_heads = w->kv_heads;
    l->head_dim = w->head_dim;
    l->tp_size = w->tp_size;
    l->tp_rank = w->tp_rank;
    return 0;
}

/* A reader's HELLO: the host arena must have its read-only descriptor (an
 * arena without one would be lent read-write or not at all; neither is what
 * the client asked for). */
static int ops_reader_check(const struct cache_arena_info *arenas, size_t n, char *err,
                            size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        if (arenas[i].tier == KVNODE_TIER_HOST && arenas[i].fd >= 0 && arenas[i].ro_fd < 0) {
            snprintf(err, errlen, "this connection declared itself a reader, but kvnoded cannot "
                     "lend its host memory read-only (%s); connect without the reader flag",
                     arenas[i].ro_why);
            return -KVNODE_EIO;
        }
    }
    return 0;
}

/* --- handlers ------------------------------------------------------------- */

bool ops_arena_is_clients_gpu(const struct cache_arena_info *a, int device, const char *bus_id)
{
    struct pci_busid ignored;

    if (device < 0 || a->tier != KVNODE_TIER_HBM)
        return false;
    if (!bus_id || !*bus_id)
        return a->device == device;
    if (busid_same(bus_id, a->pci_bus_id))
        return true;
    return !busid_parse(bus_id, &ignored) && a->pci_bus_id && strcmp(bus_id, a->pci_bus_id) == 0;
}

/* A client reconnected host-only because it could not map the HBM lent to
 * it before: counted, kept for /stats, logged (rate-limited: clients that
 * reconnect in a loop must not flood the log). */
static void ops_note_hbm_unusable(struct ops *o, const struct session *s, const char *reason)
{
    char text[200], note[96];
    uint64_t held;

    errmsg_snippet(reason, strlen(reason), text, sizeof text);
    o->hbm_unusable_clients++;
    snprintf(o->hbm_unusable_last, sizeof o->hbm_unusable_last, "pid %d (%s): %s", (int)s->pid, s->name, text);
    if (!log_limit_pass(&o->hbm_unusable_log, clock_now_ms(), OPS_UNUSABLE_LOG_MS, &held))
        return;
    log_warn("client pid %d uid %d (%s) could not use the GPU memory lent to it and connected host-only: %s "
             "(gpu.hbm_unusable_clients in /stats counts these)%s", (int)s->pid, (int)s->uid, s->name, text,
             log_limit_note(held, "such clients", note, sizeof note));
}

void ops_hello(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    const Kvnode__HelloRequest *h = req->hello;
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__HelloReply reply = KVNODE__HELLO_REPLY__INIT;
    struct cache_arena_info arenas[INDEX_MAX_ARENAS];
    Kvnode__Arena arena_msgs[INDEX_MAX_ARENAS], *arena_ptrs[INDEX_MAX_ARENAS];
    int fds[INDEX_MAX_ARENAS];
    size_t narenas = 0, nfds = 0;
    char err[512];
    int rc;

    if (s->hello_done) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "HELLO was already done on this connection");
        return;
    }
    if (h->min_version > WIRE_PROTOCOL_VERSION || h->max_version < WIRE_PROTOCOL_VERSION ||
        h->min_version > h->max_version) {
        snprintf(err, sizeof err, "no common protocol version: client speaks %u..%u, "
                 "kvnoded speaks %u", h->min_version, h->max_version, WIRE_PROTOCOL_VERSION);
        ops_fail(o, conn, req, -KVNODE_EVERSION, err);
        return;
    }
    snprintf(s->name, sizeof s->name, "%s", h->client_name && *h->client_name ? h->client_name : "?");
    if (h->layout && !ops_cache(s)) {
        /* Only a tenant without memory has no cache: "default" when the
         * sections take all of memory.host_bytes. */
        snprintf(err, sizeof err, "uid %d belongs to no [tenant.NAME] section, and tenant %s has no "
                 "host memory (the sections take all of memory.host_bytes): add uid %d to the uids "
                 "of a [tenant.NAME] section, or leave memory for tenant %s", (int)s->uid,
                 s->tenant->name, (int)s->uid, s->tenant->name);
        log_warn("refused HELLO from pid %d (%s): %s", (int)s->pid, s->name, err);
        ops_fail(o, conn, req, -KVNODE_EDENIED, err);
        return;
    }
    if (h->layout) {
        struct ns_layout layout;
        size_t all = cache_arenas(ops_cache(s), arenas, INDEX_MAX_ARENAS);
        /* A reader is lent host memory read-only or not served at all. */
        if (h->reader && (rc = ops_reader_check(arenas, all, err, sizeof err)) < 0) {
            log_warn("refused HELLO from pid %d (%s): %s", (int)s->pid, s->name, err);
            ops_fail(o, conn, req, rc, err);
            return;
        }
        rc = ops_layout_from_wire(h->layout, &layout, err, sizeof err);
        if (rc == 0)
            rc = cache_bind(ops_cache(s), &layout, &s->ns, err, sizeof err);
        if (rc < 0) {
            log_warn("refused HELLO from pid %d (%s): %s", (int)s->pid, s->name, err);
            ops_fail(o, conn, req, rc, err);
            return;
        }
        s->reader = h->reader;
        for (size_t i = 0; i < all; i++) {
            const struct cache_arena_info *a = &arenas[i];
            Kvnode__Arena *m = &arena_msgs[narenas];
            /* A device's HBM goes to the clients on that device only (no
             * peer mappings to set up or to fail): mapped for simulated
             * devices; real GPU memory as a VMM POSIX-fd handle to clients
             * that can import one (it crosses PID namespaces), else as a
             * legacy IPC handle to clients with a CUDA runtime. A reader
             * gets the read-only reopen of each memfd; CUDA has no
             * read-only form of either handle, so real HBM is lent to it as
             * to anyone. */
            int fd = s->reader ? a->ro_fd : a->fd;
            bool by_vmm = a->vmm_fd >= 0 && h->cuda_vmm;
            bool by_fd = fd >= 0 || by_vmm;
            bool by_ipc = a->fd < 0 && a->vmm_fd < 0 && a->ipc_handle && h->cuda_ipc;
            bool own_gpu = ops_arena_is_clients_gpu(a, h->cuda_device, h->cuda_pci_bus_id);
            if (by_vmm)
                fd = a->vmm_fd;
            if (a->tier == KVNODE_TIER_HBM && (!own_gpu || !(by_fd || by_ipc)))
                continue;
            if (!by_fd && !by_ipc)
                continue;
            kvnode__arena__init(m);
            m->id = a->id;
            m->tier = (Kvnode__Tier)a->tier;
            /* A lent GPU is named as the client numbers it. */
            m->device = a->tier == KVNODE_TIER_HBM ? h->cuda_device : a->device;
            m->size = a->size;
            m->fd_index = by_fd ? (int32_t)nfds : -1;
            m->cuda_vmm = by_vmm;
            if (by_fd)
                fds[nfds++] = fd;
            if (by_ipc) {
                m->cuda_ipc_handle.data = (uint8_t *)(uintptr_t)a->ipc_handle;
                m->cuda_ipc_handle.len = a->ipc_len;
            }
            arena_ptrs[narenas++] = m;
            if (a->id < 32)
                s->leases.mapped |= 1u << a->id;
            if (a->tier == KVNODE_TIER_HBM && !s->leases.put_arena)
                s->leases.put_arena = a->id;
            if (a->tier == KVNODE_TIER_HBM)
                s->hbm_lent = true;
        }
        uint32_t region = cache_host_region(ops_cache(s), h->cuda_device, h->cuda_pci_bus_id);
        s->leases.host_region = region == ARENA_ANY_REGION ? 0 : region + 1;
        reply.max_reserved_bytes = cache_reserve_limit(ops_cache(s));
        reply.namespace_id = s->ns->id;
        reply.deployment_id = s->ns->deployment_id;
        reply.block_bytes = s->ns->layout.block_bytes;
        if (h->hbm_unusable && *h->hbm_unusable)
            ops_note_hbm_unusable(o, s, h->hbm_unusable);
        log_info("client pid %d uid %d (%s) bound to namespace %u (%s rank %u); GPU %d%s%.32s%s, %s%s",
                 (int)s->pid, (int)s->uid, s->name, s->ns->id, s->ns->deployment_id,
                 s->ns->layout.tp_rank, (int)h->cuda_device,
                 h->cuda_pci_bus_id && *h->cuda_pci_bus_id ? " (" : "",
                 h->cuda_pci_bus_id ? h->cuda_pci_bus_id : "",
                 h->cuda_pci_bus_id && *h->cuda_pci_bus_id ? ")" : "",
                 s->leases.put_arena ? "HBM lent" : "host memory only",
                 s->reader ? ", reader (memory lent read-only)" : "");
    } else {
        s->observer = true;
    }
    s->hello_done = true;
    reply.reader = s->reader;
    reply.version = WIRE_PROTOCOL_VERSION;
    reply.server_version = (char *)KVNODE_VERSION_STRING;
    reply.n_arenas = narenas;
    reply.arenas = narenas ? arena_ptrs : NULL;
    reply.max_frame_bytes = o->cfg->max_frame_bytes;
    reply.max_keys = o->cfg->max_keys_per_request;
    reply.check_words = true;   /* the requests' check words are honoured (issue 19) */
    reply.per_key = true;       /* MATCH and DELETE answer per key when asked (issue 31) */
    reply.read_lease_ttl_ms = o->cfg->read_lease_ttl_ms;
    reply.write_lease_ttl_ms = o->cfg->write_lease_ttl_ms;
    resp.result_case = KVNODE__RESPONSE__RESULT_HELLO;
    resp.hello = &reply;
    ops_send(o, conn, req, &resp, fds, nfds);
}

void ops_stats(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__StatsReply reply = KVNODE__STATS_REPLY__INIT;
    json_t *doc;
    char *text;

    if (!s->hello_done) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "send HELLO first");
        return;
    }
    /* Count this request before the document is built, so it shows itself. */
    o->counts[KVNODE__REQUEST__OP_STATS].ok++;
    doc = o->stats_hook ? o->stats_hook(o->stats_hook_arg, s) : NULL;
    text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text) {
        o->counts[KVNODE__REQUEST__OP_STATS].ok--;
        ops_fail(o, conn, req, -KVNODE_ENOMEM, "cannot build the stats document");
        return;
    }
    reply.json = text;
    resp.result_case = KVNODE__RESPONSE__RESULT_STATS;
    resp.stats = &reply;
    resp.id = req->id;
    if (server_reply(conn, &resp, NULL, 0) < 0) {
        o->last_code = -KVNODE_EINTERNAL;
        server_reply_error(conn, req->id, -KVNODE_EINTERNAL, "cannot encode the stats reply");
    }
    free(text);
}

void ops_ping(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__PingReply reply = KVNODE__PING_REPLY__INIT;

    if (!s->hello_done) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "send HELLO first");
        return;
    }
    reply.nonce = req->ping->nonce;
    resp.result_case = KVNODE__RESPONSE__RESULT_PING;
    resp.ping = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
}

/* RELOAD: only root or the daemon's own user may change what it runs. */
void ops_reload(struct ops *o, struct conn *conn, struct session *s, const Kvnode__Request *req)
{
    Kvnode__Response resp = KVNODE__RESPONSE__INIT;
    Kvnode__ReloadReply reply = KVNODE__RELOAD_REPLY__INIT;
    char error[CONFIG_ERR_MAX], not_applied[1024] = "";

    if (s->uid != 0 && s->uid != geteuid()) {
        snprintf(error, sizeof error, "reload needs root or the daemon's user (uid %d); "
                 "this client runs as uid %d", (int)geteuid(), (int)s->uid);
        ops_fail(o, conn, req, -KVNODE_EDENIED, error);
        return;
    }
    if (!o->reload) {
        ops_fail(o, conn, req, -KVNODE_ESTATE, "this daemon cannot reload");
        return;
    }
    log_info("reload requested by pid %d uid %d (%s)", (int)s->pid, (int)s->uid, s->name);
    if (o->reload(o->reload_arg, error, sizeof error, not_applied, sizeof not_applied) < 0) {
        ops_fail(o, conn, req, -KVNODE_EINVAL, error);
        return;
    }
    reply.not_applied = not_applied;
    resp.result_case = KVNODE__RESPONSE__RESULT_RELOAD;
    resp.reload = &reply;
    ops_send(o, conn, req, &resp, NULL, 0);
}

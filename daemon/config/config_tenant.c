/* config_tenant: the [tenant.NAME] sections of kvnode.conf (issue 15).
 *
 * A section's keys are a second, small option table (tenant_options[])
 * whose rows hold offsets into struct config_tenant; config_tenant_option
 * turns a row into one for tenant i (offsets into cfg->tenants[i]), so the
 * value types of config_types.c parse, check, store, load and format them
 * as they do every other option. The three limits have no range of their
 * own: they take the type and range of the option they default to
 * ([server] max_namespaces, [server] max_clients, [leases]
 * max_reserved_per_client) and are 0 until config_resolve fills the ones
 * a section leaves unset: max_namespaces and max_reserved_per_client with
 * that option, max_clients with the tenant's share of [server] max_clients
 * (its host_bytes' part of memory.host_bytes, at least 1), so that no
 * tenant can take the connections another's share needs. The sections'
 * max_clients together are at most [server] max_clients; "default" gets
 * what they leave (config_tenant_default_clients).
 *
 * Sizes: host_bytes and hbm_bytes are a size or "N%" of memory.host_bytes
 * / hbm.bytes; a share is resolved (config_resolve) to that many bytes
 * rounded down to whole 64KiB, and kept as written for /config. */
#include "config/config.h"
#include "config/config_internal.h"

#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define TFIELD(f) .offset = offsetof(struct config_tenant, f), .width = sizeof(((struct config_tenant *)0)->f)
#define TPARSED(f) .parsed_offset = offsetof(struct config_tenant, f), \
                   .parsed_width = sizeof(((struct config_tenant *)0)->f)
#define TSHARE(f, of) .share_offset = offsetof(struct config_tenant, f), .share_of = of

/* A share resolves to whole units of this (the smallest memory.host_bytes). */
#define SHARE_UNIT (64 * KIB)

/* In config_write order. Restart-only: the sizes (each tenant's arenas are
 * made once, at start); adding or removing a section (config_tenant_restart_required). */
static const struct opt_def tenant_options[] = {
    { "tenant", "uids", &T_USERS, "", TFIELD(uids), TPARSED(uid_list) },
    { "tenant", "gids", &T_GROUPS, "", TFIELD(gids), TPARSED(gid_list) },
    { "tenant", "host_bytes", &T_SHARE, NULL, TFIELD(host_bytes), TSHARE(host_share, "memory.host_bytes"),
      .min = 64 * KIB, .max = UINT64_MAX, .restart = true },
    { "tenant", "hbm_bytes", &T_SHARE, "0", TFIELD(hbm_bytes), TSHARE(hbm_share, "hbm.bytes"), .min = 0,
      .max = UINT64_MAX, .restart = true },
    { "tenant", "max_namespaces", NULL, NULL, TFIELD(max_namespaces), .inherit = "server",
      .inherit_bit = CONFIG_TENANT_INHERIT_MAX_NAMESPACES },
    { "tenant", "max_clients", NULL, NULL, TFIELD(max_clients), .inherit = "server",
      .inherit_bit = CONFIG_TENANT_INHERIT_MAX_CLIENTS },
    { "tenant", "max_reserved_per_client", NULL, NULL, TFIELD(max_reserved_per_client), .inherit = "leases",
      .inherit_bit = CONFIG_TENANT_INHERIT_MAX_RESERVED },
};
#define TENANT_NOPTIONS (sizeof tenant_options / sizeof tenant_options[0])
_Static_assert(TENANT_NOPTIONS == 7, "TENANT_KEYS_HINT lists every key");
#define TENANT_KEYS_HINT "uids, gids, host_bytes, hbm_bytes, max_namespaces, max_clients or max_reserved_per_client"

/* ---- names and lookup ------------------------------------------------------ */

bool config_tenant_section(const char *s, size_t len)
{
    return len >= TENANT_PREFIX_LEN && memcmp(s, TENANT_PREFIX, TENANT_PREFIX_LEN) == 0;
}

/* NAME: 1..31 of [A-Za-z0-9_-], not "default" in any case. */
static int tenant_name_check(const char *s, size_t len, char *problem, size_t plen)
{
    int shown = (int)(len < VALUE_SHOW ? len : VALUE_SHOW);
    bool ok = len > 0 && len < CONFIG_TENANT_NAME_MAX;
    for (size_t i = 0; ok && i < len; i++)
        ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
             s[i] == '_' || s[i] == '-';
    if (!ok) {
        snprintf(problem, plen, "invalid tenant name '%.*s' (1 to %d letters, digits, '_' or '-')", shown, s,
                 CONFIG_TENANT_NAME_MAX - 1);
        return -1;
    }
    if (len == strlen(CONFIG_TENANT_DEFAULT) && strncasecmp(s, CONFIG_TENANT_DEFAULT, len) == 0) {
        snprintf(problem, plen, "'%.*s' is reserved: the tenant \"" CONFIG_TENANT_DEFAULT "\" is the clients no "
                 "[tenant.NAME] section lists, and gets the memory the sections leave; choose another name",
                 shown, s);
        return -1;
    }
    return 0;
}

static size_t tenant_count(const struct kvn_config *cfg)
{
    return cfg->ntenants < CONFIG_TENANTS_MAX ? cfg->ntenants : CONFIG_TENANTS_MAX;
}

static int tenant_find_n(const struct kvn_config *cfg, const char *s, size_t len)
{
    for (size_t i = 0; i < tenant_count(cfg); i++) {
        const char *name = cfg->tenants[i].name;
        if (strnlen(name, sizeof cfg->tenants[i].name) == len && memcmp(name, s, len) == 0)
            return (int)i;
    }
    return -1;
}

int config_tenant_find(const struct kvn_config *cfg, const char *name)
{
    return tenant_find_n(cfg, name, strlen(name));
}

int config_tenant_find_or_add(struct kvn_config *cfg, const char *s, size_t len, char *problem, size_t plen)
{
    if (tenant_name_check(s, len, problem, plen) < 0)
        return -1;
    int t = tenant_find_n(cfg, s, len);
    if (t >= 0)
        return t;
    if (cfg->ntenants >= CONFIG_TENANTS_MAX) {
        snprintf(problem, plen, "more than %d tenant sections (at most %d, CONFIG_TENANTS_MAX); engines that may "
                 "share memory go in one tenant", CONFIG_TENANTS_MAX, CONFIG_TENANTS_MAX);
        return -1;
    }
    struct config_tenant *nt = &cfg->tenants[cfg->ntenants];
    memset(nt, 0, sizeof *nt);   /* every key unset */
    memcpy(nt->name, s, len);
    return (int)cfg->ntenants++;
}

/* host_bytes: required, a share of memory.host_bytes. */
static bool is_host_row(const struct opt_def *o)
{
    return strcmp(o->key, "host_bytes") == 0;
}

static const struct opt_def *tenant_row(const char *key)
{
    for (size_t i = 0; i < TENANT_NOPTIONS; i++)
        if (strcmp(tenant_options[i].key, key) == 0)
            return &tenant_options[i];
    return NULL;
}

bool config_tenant_key_known(const char *key)
{
    return tenant_row(key) != NULL;
}

const char *config_tenant_keys_hint(void)
{
    return TENANT_KEYS_HINT;
}

bool config_tenant_option_at(size_t i, const char **key)
{
    if (i >= TENANT_NOPTIONS)
        return false;
    *key = tenant_options[i].key;
    return true;
}

/* The row as it applies to tenant i. */
static void tenant_option_for(const struct opt_def *row, size_t i, struct opt_def *out)
{
    size_t base = offsetof(struct kvn_config, tenants) + i * sizeof(struct config_tenant);
    if (row->inherit) {
        /* The type and range of the option it defaults to. */
        const struct opt_def *parent = config_find_option(row->inherit, row->key);
        *out = *parent;
        out->section = row->section;
        out->def = NULL;
        out->offset = row->offset;
        out->width = row->width;
        out->parsed_offset = out->parsed_width = 0;
        out->restart = row->restart;
        out->inherit = row->inherit;
        out->inherit_bit = row->inherit_bit;
    } else {
        *out = *row;
    }
    out->offset += base;
    if (out->parsed_width)
        out->parsed_offset += base;
    if (out->share_of)
        out->share_offset += base;
}

bool config_tenant_option(const char *key, size_t i, struct opt_def *out)
{
    const struct opt_def *row = tenant_row(key);
    if (!row)
        return false;
    tenant_option_for(row, i, out);
    return true;
}

/* ---- values ------------------------------------------------------------------ */

/* A share of total: whole SHARE_UNITs; a size: as it is. */
static uint64_t tenant_bytes(uint64_t total, uint32_t share, uint64_t bytes)
{
    if (share == 0)
        return bytes;
    if (share > 100)
        return 0;   /* refused by the checks */
    uint64_t b = total / 100 * share + total % 100 * share / 100;
    return b - b % SHARE_UNIT;
}

static uint64_t tenant_host_bytes(const struct kvn_config *cfg, const struct config_tenant *t)
{
    return tenant_bytes(cfg->host_bytes, t->host_share, t->host_bytes);
}

static uint64_t tenant_hbm_bytes(const struct kvn_config *cfg, const struct config_tenant *t)
{
    return tenant_bytes(cfg->hbm_bytes, t->hbm_share, t->hbm_bytes);
}

static uint64_t add_saturating(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

uint64_t config_tenant_share_of(const struct kvn_config *cfg, uint64_t host_bytes, uint64_t total)
{
    if (cfg->host_bytes == 0 || host_bytes >= cfg->host_bytes)
        return total;
    return (uint64_t)((long double)total * (long double)host_bytes / (long double)cfg->host_bytes);
}

/* The connections of tenant t: its max_clients, or when it leaves it unset
 * its memory's share of [server] max_clients (at least 1). */
static uint32_t tenant_max_clients(const struct kvn_config *cfg, const struct config_tenant *t)
{
    if (t->max_clients != 0 && !(t->inherited & CONFIG_TENANT_INHERIT_MAX_CLIENTS))
        return t->max_clients;
    uint64_t share = config_tenant_share_of(cfg, tenant_host_bytes(cfg, t), cfg->max_clients);
    return share ? (uint32_t)share : 1;
}

static uint64_t tenants_clients_taken(const struct kvn_config *cfg)
{
    uint64_t taken = 0;
    for (size_t i = 0; i < tenant_count(cfg); i++)
        taken += tenant_max_clients(cfg, &cfg->tenants[i]);
    return taken;
}

uint32_t config_tenant_default_clients(const struct kvn_config *cfg)
{
    uint64_t taken = tenants_clients_taken(cfg);
    return taken < cfg->max_clients ? (uint32_t)(cfg->max_clients - taken) : 0;
}

void config_tenant_default_bytes(const struct kvn_config *cfg, uint64_t *host, uint64_t *hbm)
{
    uint64_t host_taken = 0, hbm_taken = 0;
    for (size_t i = 0; i < tenant_count(cfg); i++) {
        host_taken = add_saturating(host_taken, tenant_host_bytes(cfg, &cfg->tenants[i]));
        hbm_taken = add_saturating(hbm_taken, tenant_hbm_bytes(cfg, &cfg->tenants[i]));
    }
    uint64_t h = cfg->host_bytes > host_taken ? cfg->host_bytes - host_taken : 0;
    uint64_t g = cfg->hbm_bytes > hbm_taken ? cfg->hbm_bytes - hbm_taken : 0;
    if (host)
        *host = h < cfg->slab_bytes ? 0 : h;
    if (hbm)
        *hbm = g < cfg->slab_bytes ? 0 : g;
}

/* A limit the section leaves to its option: 0 (not set) or marked inherited. */
static bool tenant_inherits(const struct config_tenant *t, const struct opt_def *o, const struct opt_value *v)
{
    bool zero = o->type == &T_FRACTION ? v->d == 0.0 : v->u == 0;
    return zero || (t->inherited & o->inherit_bit);
}

/* What [server] allow_uids/allow_gids do with a client running as uid
 * (net/server.c): empty lists admit everyone; root and the daemon's own user
 * always; else the uid listed, or its primary or a supplementary group (from
 * the user database) in allow_gids. */
static bool tenant_uid_admitted(uint32_t uid, const struct config_idlist *allow_uids,
                                const struct config_idlist *allow_gids)
{
    if (allow_uids->n == 0 && allow_gids->n == 0)
        return true;
    if (uid == 0 || uid == (uint32_t)geteuid() || config_idlist_has(allow_uids, uid))
        return true;
    if (allow_gids->n == 0)
        return false;
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r((uid_t)uid, &pw, buf, sizeof buf, &res) != 0 || !res)
        return false;
    if (config_idlist_has(allow_gids, (uint32_t)pw.pw_gid))
        return true;
    int n = 64;
    gid_t *groups = NULL;
    bool admitted = false;
    for (int attempt = 0; attempt < 3 && !admitted; attempt++) {
        gid_t *more = realloc(groups, (size_t)n * sizeof *groups);
        if (!more)
            break;
        groups = more;
        int want = n;
        if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &want) >= 0) {
            for (int i = 0; i < want && !admitted; i++)
                admitted = config_idlist_has(allow_gids, (uint32_t)groups[i]);
            break;
        }
        n = want > n ? want : n * 2;   /* too small: want says how many */
    }
    free(groups);
    return admitted;
}

/* The resolved list of an allow option (for the admission check); false
 * when it does not resolve (reported by the option checks). */
static bool allow_list(const struct kvn_config *cfg, const char *key, struct config_idlist *out)
{
    const struct opt_def *o = config_find_option("server", key);
    char text[VALUE_MAX], problem[PROBLEM_MAX];
    struct opt_value v = { 0 };
    o->type->load(cfg, o, &v, text, sizeof text);
    if (config_check_value(o, &v, NULL, problem, sizeof problem) < 0)
        return false;
    *out = v.parsed.ids;
    return true;
}

/* ---- validation -------------------------------------------------------------- */

/* What one section resolves to, for the rules between sections. */
struct tenant_ids {
    struct config_idlist uids, gids;
    bool ok;   /* both lists resolved */
};

/* Field checks of tenant i; its id lists into ids. */
static void tenant_check_one(const struct kvn_config *cfg, size_t i, struct kvn_config *resolved,
                             struct tenant_ids *ids, struct errbuf *errors)
{
    const struct config_tenant *t = &cfg->tenants[i];
    int nlen = (int)strnlen(t->name, sizeof t->name);
    char problem[PROBLEM_MAX], text[VALUE_MAX];
    bool uids_ok = false, gids_ok = false;

    for (size_t k = 0; k < TENANT_NOPTIONS; k++) {
        struct opt_def o;
        struct opt_value v = { 0 };
        tenant_option_for(&tenant_options[k], i, &o);
        o.type->load(cfg, &o, &v, text, sizeof text);
        if (o.inherit) {
            if (tenant_inherits(t, &o, &v)) {
                if (resolved) {
                    const struct opt_def *parent = config_find_option(o.inherit, o.key);
                    struct opt_value pv = { 0 };
                    parent->type->load(cfg, parent, &pv, text, sizeof text);
                    o.type->store(resolved, &o, &pv);
                    resolved->tenants[i].inherited |= o.inherit_bit;
                }
                continue;
            }
            if (resolved)
                resolved->tenants[i].inherited &= ~o.inherit_bit;
        }
        if (is_host_row(&o) && v.i == 0 && v.u == 0) {
            config_errbuf_add(errors, "[tenant.%.*s] %s: required (a size of at least %s, e.g. 4GiB, or a share "
                              "of %s, e.g. 25%%)", nlen, t->name, o.key, "64KiB", o.share_of);
            continue;
        }
        if (config_check_value(&o, &v, NULL, problem, sizeof problem) < 0) {
            config_errbuf_add(errors, "[tenant.%.*s] %s: %s", nlen, t->name, o.key, problem);
            continue;
        }
        if (o.parsed_width) {
            if (resolved)
                memcpy((char *)resolved + o.parsed_offset, &v.parsed, o.parsed_width);
            if (o.type == &T_USERS) {
                ids->uids = v.parsed.ids;
                uids_ok = true;
            } else {
                ids->gids = v.parsed.ids;
                gids_ok = true;
            }
        }
    }
    ids->ok = uids_ok && gids_ok;
    if (ids->ok && ids->uids.n == 0 && ids->gids.n == 0)
        config_errbuf_add(errors, "[tenant.%.*s] uids: neither uids nor gids lists anyone; a tenant is the clients "
                          "running as the users (uids) or groups (gids) it lists", nlen, t->name);

    /* The sizes as they resolve: each tenant's arenas hold whole slabs. */
    char size[32], slab[32];
    config_format_size(cfg->slab_bytes, slab, sizeof slab);
    uint64_t host = tenant_host_bytes(cfg, t), hbm = tenant_hbm_bytes(cfg, t);
    if ((t->host_share || t->host_bytes) && host < cfg->slab_bytes) {
        config_format_size(host, size, sizeof size);
        config_errbuf_add(errors, "[tenant.%.*s] host_bytes: %s is less than [memory] slab_bytes (%s); its arena "
                          "must hold at least one slab", nlen, t->name, size, slab);
    }
    if (hbm > 0 && hbm < cfg->slab_bytes) {
        config_format_size(hbm, size, sizeof size);
        config_errbuf_add(errors, "[tenant.%.*s] hbm_bytes: %s is less than [memory] slab_bytes (%s); each "
                          "device's arena must hold at least one slab (or set hbm_bytes = 0 for none)",
                          nlen, t->name, size, slab);
    }
    if (resolved) {
        resolved->tenants[i].host_bytes = host;
        resolved->tenants[i].hbm_bytes = hbm;
        if (resolved->tenants[i].inherited & CONFIG_TENANT_INHERIT_MAX_CLIENTS)
            resolved->tenants[i].max_clients = tenant_max_clients(cfg, t);
    }
}

/* A uid (gid) in more than one section. */
static void tenant_check_unique(const struct kvn_config *cfg, const struct tenant_ids *ids, size_t n, bool groups,
                                struct errbuf *errors)
{
    for (size_t i = 0; i < n; i++) {
        const struct config_idlist *l = groups ? &ids[i].gids : &ids[i].uids;
        for (size_t k = 0; k < l->n; k++) {
            bool again = false;   /* listed twice in this section: reported once */
            for (size_t m = 0; m < k && !again; m++)
                again = l->id[m] == l->id[k];
            for (size_t j = 0; j < i && !again; j++) {
                if (!config_idlist_has(groups ? &ids[j].gids : &ids[j].uids, l->id[k]))
                    continue;
                config_errbuf_add(errors, "[tenant.%.*s] %s: %s %" PRIu32 " is also in [tenant.%.*s]; a %s belongs "
                                  "to one tenant at most", (int)strnlen(cfg->tenants[i].name, CONFIG_TENANT_NAME_MAX),
                                  cfg->tenants[i].name, groups ? "gids" : "uids", groups ? "gid" : "uid",
                                  l->id[k], (int)strnlen(cfg->tenants[j].name, CONFIG_TENANT_NAME_MAX),
                                  cfg->tenants[j].name, groups ? "group" : "user");
                again = true;
            }
        }
    }
}

void config_tenant_check(const struct kvn_config *cfg, struct kvn_config *resolved, struct errbuf *errors)
{
    char problem[PROBLEM_MAX];
    size_t n = tenant_count(cfg);
    if (cfg->ntenants > CONFIG_TENANTS_MAX)
        config_errbuf_add(errors, "[tenant.NAME]: %" PRIu32 " sections, more than %d (CONFIG_TENANTS_MAX)",
                          cfg->ntenants, CONFIG_TENANTS_MAX);
    if (n == 0)
        return;
    struct tenant_ids *ids = calloc(n, sizeof *ids);
    if (!ids) {
        config_errbuf_add(errors, "[tenant.NAME]: out of memory while checking the sections");
        return;
    }
    uint64_t host_sum = 0, hbm_sum = 0;
    for (size_t i = 0; i < n; i++) {
        const struct config_tenant *t = &cfg->tenants[i];
        size_t nlen = strnlen(t->name, sizeof t->name);
        if (tenant_name_check(t->name, nlen, problem, sizeof problem) < 0)
            config_errbuf_add(errors, "[tenant.%.*s]: %s", (int)nlen, t->name, problem);
        else if (tenant_find_n(cfg, t->name, nlen) != (int)i)
            config_errbuf_add(errors, "[tenant.%.*s]: two tenants of this name (sections of one name are one "
                              "tenant)", (int)nlen, t->name);
        tenant_check_one(cfg, i, resolved, &ids[i], errors);
        host_sum = add_saturating(host_sum, tenant_host_bytes(cfg, t));
        hbm_sum = add_saturating(hbm_sum, tenant_hbm_bytes(cfg, t));
    }

    char sum[32], total[32];
    if (host_sum > cfg->host_bytes) {
        config_format_size(host_sum, sum, sizeof sum);
        config_format_size(cfg->host_bytes, total, sizeof total);
        config_errbuf_add(errors, "[tenant.NAME] host_bytes: the tenants take %s together, more than [memory] "
                          "host_bytes (%s); lower their host_bytes or raise memory.host_bytes", sum, total);
    }
    if (hbm_sum > cfg->hbm_bytes) {
        config_format_size(hbm_sum, sum, sizeof sum);
        config_format_size(cfg->hbm_bytes, total, sizeof total);
        config_errbuf_add(errors, "[tenant.NAME] hbm_bytes: the tenants take %s per device together, more than "
                          "[hbm] bytes (%s); lower their hbm_bytes or raise hbm.bytes", sum, total);
    }
    uint64_t clients = tenants_clients_taken(cfg);
    if (clients > cfg->max_clients)
        config_errbuf_add(errors, "[tenant.NAME] max_clients: the tenants take %" PRIu64 " connections together "
                          "(a section without max_clients takes its memory's share), more than [server] max_clients "
                          "(%" PRIu32 "); lower their max_clients or raise server.max_clients", clients,
                          cfg->max_clients);
    tenant_check_unique(cfg, ids, n, false, errors);
    tenant_check_unique(cfg, ids, n, true, errors);

    /* KVCM takes everything under one instance id as one reporter, and the
     * same layout in two tenants differs only in its fingerprint (which
     * mixes in the tenant): without {fingerprint} their instance ids are one. */
    if (cfg->kvcm.enabled == 1 && cfg->kvcm.instance_id[0] &&
        !(kvcm_config_template_vars(cfg->kvcm.instance_id) & KVCM_VAR_FINGERPRINT)) {
        char shown[VALUE_SHOW + 8];
        config_errbuf_add(errors, "[kvcm] instance_id: '%s' has no {fingerprint}, and the node has [tenant.NAME] "
                          "sections: two tenants serving the same layout would publish as one KVCM instance (their "
                          "deployments differ only in the fingerprint, which includes the tenant); add {fingerprint}, "
                          "e.g. {model}_{block_tokens}_{fingerprint}",
                          config_show(cfg->kvcm.instance_id, shown, sizeof shown));
    }

    /* A tenant's users must be able to connect at all. */
    struct config_idlist allow_uids, allow_gids;
    if (allow_list(cfg, "allow_uids", &allow_uids) && allow_list(cfg, "allow_gids", &allow_gids)) {
        char su[VALUE_SHOW + 8], sg[VALUE_SHOW + 8];
        const char *shown_uids = config_show(cfg->allow_uids, su, sizeof su);
        const char *shown_gids = config_show(cfg->allow_gids, sg, sizeof sg);
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; ids[i].ok && k < ids[i].uids.n; k++)
                if (!tenant_uid_admitted(ids[i].uids.id[k], &allow_uids, &allow_gids))
                    config_errbuf_add(errors, "[tenant.%.*s] uids: uid %" PRIu32 " is not admitted by [server] "
                                      "allow_uids (%s)%s%s%s: its clients would be refused; add it to allow_uids "
                                      "or remove it from the tenant",
                                      (int)strnlen(cfg->tenants[i].name, CONFIG_TENANT_NAME_MAX),
                                      cfg->tenants[i].name, ids[i].uids.id[k], allow_uids.n ? shown_uids : "empty",
                                      allow_gids.n ? " nor, through its groups, by allow_gids (" : "",
                                      allow_gids.n ? shown_gids : "", allow_gids.n ? ")" : "");
    }
    free(ids);
}

/* ---- output ------------------------------------------------------------------ */

void config_tenant_write(const struct kvn_config *cfg, FILE *out)
{
    char text[VALUE_MAX + 16], field[VALUE_MAX], size[32];
    for (size_t i = 0; i < tenant_count(cfg); i++) {
        const struct config_tenant *t = &cfg->tenants[i];
        fprintf(out, "\n[tenant.%.*s]\n", (int)strnlen(t->name, sizeof t->name), t->name);
        for (size_t k = 0; k < TENANT_NOPTIONS; k++) {
            struct opt_def o;
            struct opt_value v = { 0 };
            tenant_option_for(&tenant_options[k], i, &o);
            o.type->load(cfg, &o, &v, field, sizeof field);
            if (o.inherit && tenant_inherits(t, &o, &v)) {
                /* Left unset: a comment, so the text parses back unset. */
                const struct opt_def *parent = config_find_option(o.inherit, o.key);
                struct opt_value pv = { 0 };
                parent->type->load(cfg, parent, &pv, field, sizeof field);
                parent->type->format(parent, &pv, text, sizeof text);
                if (o.inherit_bit == CONFIG_TENANT_INHERIT_MAX_CLIENTS)
                    fprintf(out, "; %s: %" PRIu32 ", its memory's share of [%s] %s (%s)\n", o.key,
                            tenant_max_clients(cfg, t), o.inherit, o.key, text);
                else
                    fprintf(out, "; %s: %s, from [%s] %s\n", o.key, text, o.inherit, o.key);
                continue;
            }
            if (is_host_row(&o) && v.i == 0 && v.u == 0) {
                fprintf(out, "; %s: not set (required)\n", o.key);
                continue;
            }
            o.type->format(&o, &v, text, sizeof text);
            fprintf(out, "%s = %s\n", o.key, text);
            if (o.share_of && v.i != 0) {
                config_format_size(is_host_row(&o) ? tenant_host_bytes(cfg, t) : tenant_hbm_bytes(cfg, t), size,
                                   sizeof size);
                fprintf(out, "; %s: %s, %d%% of %s\n", o.key, size, v.i, o.share_of);
            }
        }
    }
}

/* ---- reload ------------------------------------------------------------------ */

static void name_append(char *buf, size_t buflen, size_t *used, const char *fmt_name, int nlen, const char *name,
                        const char *suffix)
{
    if (!buf || *used >= buflen)
        return;
    int n = snprintf(buf + *used, buflen - *used, "%s%s%.*s%s", *used ? ", " : "", fmt_name, nlen, name, suffix);
    if (n > 0)
        *used += (size_t)n;
}

int config_tenant_restart_required(const struct kvn_config *running, const struct kvn_config *next, char *buf,
                                   size_t buflen, size_t *used)
{
    int changed = 0;
    int last = -1;
    bool reordered = false;
    for (size_t i = 0; i < tenant_count(running); i++) {
        const struct config_tenant *r = &running->tenants[i];
        int nlen = (int)strnlen(r->name, sizeof r->name);
        int j = tenant_find_n(next, r->name, (size_t)nlen);
        if (j < 0) {   /* removed */
            changed++;
            name_append(buf, buflen, used, TENANT_PREFIX, nlen, r->name, "");
            continue;
        }
        reordered |= j < last;
        last = j;
        const struct config_tenant *nt = &next->tenants[j];
        if (tenant_host_bytes(running, r) != tenant_host_bytes(next, nt)) {
            changed++;
            name_append(buf, buflen, used, TENANT_PREFIX, nlen, r->name, ".host_bytes");
        }
        if (tenant_hbm_bytes(running, r) != tenant_hbm_bytes(next, nt)) {
            changed++;
            name_append(buf, buflen, used, TENANT_PREFIX, nlen, r->name, ".hbm_bytes");
        }
    }
    for (size_t j = 0; j < tenant_count(next); j++) {
        const struct config_tenant *nt = &next->tenants[j];
        int nlen = (int)strnlen(nt->name, sizeof nt->name);
        if (tenant_find_n(running, nt->name, (size_t)nlen) < 0) {   /* added */
            changed++;
            name_append(buf, buflen, used, TENANT_PREFIX, nlen, nt->name, "");
        }
    }
    if (reordered) {   /* which section wins a gid match */
        changed++;
        name_append(buf, buflen, used, TENANT_PREFIX, 5, "order", "");
    }
    return changed;
}

void config_tenant_keep_restart_only(struct kvn_config *next, const struct kvn_config *running)
{
    struct config_tenant kept[CONFIG_TENANTS_MAX];
    size_t n = tenant_count(running);
    for (size_t i = 0; i < n; i++) {
        const struct config_tenant *r = &running->tenants[i];
        kept[i] = *r;
        int j = tenant_find_n(next, r->name, strnlen(r->name, sizeof r->name));
        if (j < 0)
            continue;   /* removed: stays until restart */
        const struct config_tenant *nt = &next->tenants[j];
        memcpy(kept[i].uids, nt->uids, sizeof kept[i].uids);
        memcpy(kept[i].gids, nt->gids, sizeof kept[i].gids);
        kept[i].uid_list = nt->uid_list;
        kept[i].gid_list = nt->gid_list;
        kept[i].max_namespaces = nt->max_namespaces;
        kept[i].max_clients = nt->max_clients;
        kept[i].max_reserved_per_client = nt->max_reserved_per_client;
        kept[i].inherited = nt->inherited;
    }
    memset(next->tenants, 0, sizeof next->tenants);
    memcpy(next->tenants, kept, n * sizeof kept[0]);
    next->ntenants = (uint32_t)n;
}

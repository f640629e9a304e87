/* kvs_server_leases: lease ids and per-tenant lease counts of the KVS front
 * end (see kvs_server_leases.h). */
#include "net/kvs_server_leases.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "config/config.h"

void kvs_leases_init(struct kvs_leases *ls)
{
    memset(ls, 0, sizeof *ls);
    ls->pool_used = sizeof ls->pool;   /* drawn at the first lease */
}

/* Refill the pool when it cannot give one more id; false when the kernel
 * has no random bytes to give yet (never blocks). */
static bool kvs_leases_pool_ready(struct kvs_leases *ls)
{
    ssize_t got;

    if (ls->pool_used + sizeof(struct kvs_lease_id) <= sizeof ls->pool)
        return true;
    do
        got = getrandom(ls->pool, sizeof ls->pool, GRND_NONBLOCK);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof ls->pool)
        return false;
    ls->pool_used = 0;
    return true;
}

static uint32_t *kvs_leases_count(struct kvs_leases *ls, struct tenant *t)
{
    static uint32_t spare;   /* more tenants than there can be: counted nowhere */

    for (size_t i = 0; i < ls->ntenants; i++)
        if (ls->tenant[i] == t)
            return &ls->open[i];
    if (ls->ntenants == TENANTS_MAX)
        return &spare;
    ls->tenant[ls->ntenants] = t;
    ls->open[ls->ntenants] = 0;
    return &ls->open[ls->ntenants++];
}

int kvs_leases_room(struct kvs_leases *ls, const struct kvn_config *cfg, struct tenants *ts, struct tenant *t,
                    uint64_t open_total, char *msg, size_t msglen)
{
    uint32_t share = tenants_share_of(ts, cfg, t, cfg->kvs_max_leases), open = *kvs_leases_count(ls, t);

    if (open_total >= cfg->kvs_max_leases) {
        snprintf(msg, msglen, "%" PRIu64 " KVS leases are open ([kvs_server] max_leases); release some or wait "
                 "for their term", open_total);
        return 503;
    }
    if (open >= share) {
        snprintf(msg, msglen, "tenant %s holds %u KVS leases, its share of [kvs_server] max_leases (%u of %u, "
                 "in proportion to its host memory); release some or wait for their term", t->name, open, share,
                 cfg->kvs_max_leases);
        return 503;
    }
    if (!kvs_leases_pool_ready(ls)) {
        snprintf(msg, msglen, "the kernel's random number generator is not ready yet (lease ids are random); "
                 "try again");
        return 503;
    }
    return 0;
}

struct kvs_lease_id kvs_leases_open(struct kvs_leases *ls, struct tenant *t)
{
    struct kvs_lease_id id;

    memcpy(&id, ls->pool + ls->pool_used, sizeof id);
    memset(ls->pool + ls->pool_used, 0, sizeof id);   /* an id is given out once */
    ls->pool_used += sizeof id;
    (*kvs_leases_count(ls, t))++;
    return id;
}

void kvs_leases_close(struct kvs_leases *ls, struct tenant *t)
{
    uint32_t *open = kvs_leases_count(ls, t);
    if (*open)
        (*open)--;
}

void kvs_leases_note_ended(struct kvs_leases *ls, const struct kvs_lease_id *id, const struct tenant *t,
                           uint64_t now_ms)
{
    ls->ended[ls->ended_next] = (struct kvs_ended){ .id = *id, .tenant = t, .at_ms = now_ms };
    ls->ended_next = (ls->ended_next + 1) % KVS_ENDED_KEEP;
}

bool kvs_leases_ended(const struct kvs_leases *ls, const struct kvs_lease_id *id, const struct tenant *t,
                      uint64_t now_ms)
{
    for (size_t i = 0; i < KVS_ENDED_KEEP; i++) {
        const struct kvs_ended *e = &ls->ended[i];
        if (e->tenant == t && kvs_lease_id_eq(&e->id, id))
            return now_ms - e->at_ms <= KVS_ENDED_KEEP_MS;
    }
    return false;
}

void kvs_lease_id_format(const struct kvs_lease_id *id, char *out)
{
    snprintf(out, KVS_LEASE_ID_HEX + 1, "%016" PRIx64 "%016" PRIx64, id->hi, id->lo);
}

static int kvs_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool kvs_lease_id_parse(const char *s, size_t len, struct kvs_lease_id *out)
{
    uint64_t half[2] = { 0, 0 };

    if (len != KVS_LEASE_ID_HEX)
        return false;
    for (size_t i = 0; i < len; i++) {
        int d = kvs_hex_digit(s[i]);
        if (d < 0)
            return false;
        half[i / 16] = half[i / 16] << 4 | (uint64_t)d;
    }
    out->hi = half[0];
    out->lo = half[1];
    return true;
}

/* kvs_server keys: the KVS front end's object keys (rtp-llm's v1 parsed,
 * any other key an opaque object named by its SHA-256), the namespace
 * layout of a key (a namespace per object size, and the read lookup over
 * them), the uid of a loopback TCP peer (NETLINK_SOCK_DIAG) and the tenant
 * of a peer (see kvs_server.h). Loop thread only; nothing here blocks
 * (the netlink query is answered by the kernel from its socket table). */
#include "net/kvs_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache/cache.h"
#include "config/config.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "net/httpd.h"
#include "net/server.h"
#include "sha256.h"
#include "tenants/tenants.h"

/* --- object keys ------------------------------------------------------------- */

static int kvs_key_fail(char *err, size_t errlen, const char *key, size_t len, const char *why)
{
    errmsg_set(err, errlen, "object key '%.*s%s': %s; expected " KVS_KEY_FORMAT " (rtp-llm's v1 keys)",
               (int)(len > 96 ? 96 : len), key, len > 96 ? "..." : "", why);
    return -1;
}

/* Decimal digits only, no sign, no leading zero, fits uint32: one number
 * has one spelling, so that two key strings never name one object. */
static bool kvs_parse_u32(const char *s, size_t len, uint32_t *out)
{
    uint64_t v = 0;
    if (len == 0 || len > 10 || (len > 1 && s[0] == '0'))
        return false;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Signed decimal int64 as rtp-llm prints cache keys (std::to_string): no
 * '+', no leading zero, no "-0" (one spelling per number, as above). */
static bool kvs_parse_i64(const char *s, size_t len, int64_t *out)
{
    bool neg = len > 0 && s[0] == '-';
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    size_t i = neg ? 1 : 0;
    if (len == i || len - i > 19 || (s[i] == '0' && (neg || len - i > 1)))
        return false;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (lim - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    return true;
}

static bool kvs_prefixed(const char *s, size_t len, const char *prefix, const char **rest, size_t *restlen)
{
    size_t p = strlen(prefix);
    if (len < p || memcmp(s, prefix, p) != 0)
        return false;
    *rest = s + p;
    *restlen = len - p;
    return true;
}

/* Whether every layout the front end may make of a v1 key fits its extra:
 * kvs_key_layout's (deployment id, ns, version, group; the rank tag for a
 * rank past 0, which is served alone whatever tp_size is), then
 * kvs_bind_object_ns's size tag for the largest size. Decided from the key
 * alone, so that a key is v1 or opaque whatever the options and sizes.
 * plen: the lengths of the key's six parts. */
static bool kvs_key_fits_layouts(const size_t *plen, uint32_t tp_rank)
{
    size_t n = sizeof "kvs_deployment_id=;kvs_object_ns=;kvs_version=;kvs_group=" - 1 + plen[2] + plen[0] +
               (plen[1] - strlen("v")) + (plen[4] - strlen("group-"));
    if (tp_rank > 0)
        n += sizeof ";kvs_tp_rank=" - 1 + (plen[3] - strlen("tp-"));
    n += sizeof KVS_SIZE_TAG - 1 + sizeof "18446744073709551615" - 1;
    return n < NS_EXTRA_MAX;
}

int kvs_key_parse(const char *key, size_t len, struct kvs_key *out, char *err, size_t errlen)
{
    const char *part[6], *rest;
    size_t plen[6], np = 0, start = 0, restlen;

    memset(out, 0, sizeof *out);
    if (len == 0 || len > KVS_KEY_MAX)
        return kvs_key_fail(err, errlen, key, len, len ? "longer than 512 bytes" : "empty");
    if (memchr(key, '\0', len))
        return kvs_key_fail(err, errlen, key, len, "contains a NUL byte");
    for (size_t i = 0; i <= len; i++) {
        if (i < len && key[i] != '/')
            continue;
        if (np == 6)
            return kvs_key_fail(err, errlen, key, len, "more than 6 parts separated by '/'");
        part[np] = key + start;
        plen[np++] = i - start;
        start = i + 1;
    }
    if (np != 6)
        return kvs_key_fail(err, errlen, key, len, "fewer than 6 parts separated by '/'");
    if (plen[0] == 0 || plen[0] >= KVS_PART_MAX)
        return kvs_key_fail(err, errlen, key, len, "the namespace part is empty or longer than 127 bytes");
    if (!kvs_prefixed(part[1], plen[1], "v", &rest, &restlen) || !kvs_parse_u32(rest, restlen, &out->version))
        return kvs_key_fail(err, errlen, key, len, "the second part is not v<version> (canonical decimal)");
    if (plen[2] == 0 || plen[2] >= KVS_PART_MAX)
        return kvs_key_fail(err, errlen, key, len, "the deployment id is empty or longer than 127 bytes");
    if (!kvs_prefixed(part[3], plen[3], "tp-", &rest, &restlen) || !kvs_parse_u32(rest, restlen, &out->tp_rank))
        return kvs_key_fail(err, errlen, key, len, "the fourth part is not tp-<rank> (canonical decimal)");
    if (!kvs_prefixed(part[4], plen[4], "group-", &rest, &restlen) || !kvs_parse_u32(rest, restlen, &out->group))
        return kvs_key_fail(err, errlen, key, len, "the fifth part is not group-<g> (canonical decimal)");
    if (!kvs_prefixed(part[5], plen[5], "block-", &rest, &restlen) || !kvs_parse_i64(rest, restlen, &out->block))
        return kvs_key_fail(err, errlen, key, len, "the last part is not block-<signed 64-bit decimal> "
                            "(canonical: no '+', no leading zero, no -0)");
    /* A layout's model refuses DEL as well as bytes below 0x20. */
    for (size_t i = 0; i < plen[0]; i++)
        if ((unsigned char)part[0][i] < 0x20 || part[0][i] == 0x7f || part[0][i] == ';')
            return kvs_key_fail(err, errlen, key, len, "the namespace part has a control character or ';'");
    for (size_t i = 0; i < plen[2]; i++)
        if ((unsigned char)part[2][i] < 0x20 || part[2][i] == 0x7f || part[2][i] == ';')
            return kvs_key_fail(err, errlen, key, len, "the deployment id has a control character or ';'");
    if (!kvs_key_fits_layouts(plen, out->tp_rank))
        return kvs_key_fail(err, errlen, key, len, "the namespace part and the deployment id are too long for "
                            "a namespace layout (its extra, under 256 bytes, with the rank and size tags)");
    memcpy(out->object_ns, part[0], plen[0]);
    memcpy(out->deployment_id, part[2], plen[2]);
    return 0;
}

size_t kvs_key_prefix_len(const char *key, size_t len, const struct kvs_key *parsed)
{
    if (parsed->opaque)
        return 0;
    const char *slash = memrchr(key, '/', len);
    return slash ? (size_t)(slash - key) + sizeof "/block-" - 1 : 0;
}

bool kvs_key_same_prefix(const char *prev, size_t prefix_len, const char *key, size_t len, int64_t *block)
{
    return prefix_len && len > prefix_len && len <= KVS_KEY_MAX && memcmp(prev, key, prefix_len) == 0 &&
           kvs_parse_i64(key + prefix_len, len - prefix_len, block);
}

int kvs_key_classify(const char *key, size_t len, struct kvs_key *out, char *err, size_t errlen)
{
    unsigned char d[32];

    if (kvs_key_parse(key, len, out, err, errlen) == 0)
        return 0;
    memset(out, 0, sizeof *out);
    if (len == 0 || len > KVS_OPAQUE_KEY_MAX) {
        errmsg_set(err, errlen, "object key of %zu bytes: a key has 1 to %d bytes", len, KVS_OPAQUE_KEY_MAX);
        return -1;
    }
    sha256_digest(key, len, d);
    uint64_t b = 0, c = 0;
    for (int i = 0; i < 8; i++) {
        b = b << 8 | d[i];
        c = c << 8 | d[8 + i];
    }
    out->opaque = true;
    out->block = (int64_t)b;
    out->check = c;
    return 0;
}

static void kvs_opaque_layout(uint64_t block_bytes, struct ns_layout *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->model, sizeof out->model, "%s", KVS_OPAQUE_MODEL);
    snprintf(out->extra, sizeof out->extra, "kvs_opaque_objects=1");
    snprintf(out->dtype, sizeof out->dtype, "%s", KVS_LAYOUT_NAME);
    out->block_tokens = out->num_layers = out->kv_heads = out->head_dim = 1;
    out->block_bytes = block_bytes;
    out->tp_size = 1;
}

int kvs_key_layout(const struct kvs_key *k, uint32_t tp_size, uint64_t block_bytes, struct ns_layout *out,
                   char *err, size_t errlen)
{
    if (k->opaque) {
        kvs_opaque_layout(block_bytes, out);
        return 0;
    }
    /* A rank below [kvs_server] tp_size is one rank of a deployment of that
     * TP size; any other rank (every rank past 0 with the default tp_size 1)
     * is a deployment of its own, its rank named in extra. */
    bool alone = k->tp_rank >= tp_size;
    char rank[32] = "";

    memset(out, 0, sizeof *out);
    if (alone && k->tp_rank > 0)
        snprintf(rank, sizeof rank, ";kvs_tp_rank=%u", k->tp_rank);
    int n = snprintf(out->extra, sizeof out->extra, "kvs_deployment_id=%s;kvs_object_ns=%s;kvs_version=%u;"
                     "kvs_group=%u%s", k->deployment_id, k->object_ns, k->version, k->group, rank);
    if (n < 0 || (size_t)n >= sizeof out->extra ||
        snprintf(out->model, sizeof out->model, "%s", k->deployment_id) >= (int)sizeof out->model) {
        errmsg_set(err, errlen, "object key parts too long: deployment id '%s' and namespace '%s' must "
                   "fit a layout (model < %d bytes, extra < %d bytes)", k->deployment_id, k->object_ns,
                   NS_MODEL_MAX, NS_EXTRA_MAX);
        return -1;
    }
    snprintf(out->dtype, sizeof out->dtype, "%s", KVS_LAYOUT_NAME);
    out->block_tokens = 1;
    out->block_bytes = block_bytes;
    out->num_layers = 1;
    out->kv_heads = 1;
    out->head_dim = 1;
    out->tp_size = alone ? 1 : tp_size;
    out->tp_rank = alone ? 0 : k->tp_rank;
    return 0;
}

/* --- objects of any size: a namespace per size ------------------------------- */

int kvs_bind_object_ns(struct cache *c, struct ns_layout *l, struct kv_namespace **out, char *err, size_t errlen)
{
    int rc = cache_bind(c, l, out, err, errlen);
    if (rc != -KVNODE_ELAYOUT)
        return rc;
    /* The plain layout holds objects of another size: this size's own. */
    size_t used = strnlen(l->extra, sizeof l->extra);
    int n = snprintf(l->extra + used, sizeof l->extra - used, KVS_SIZE_TAG "%" PRIu64, l->block_bytes);
    if (n < 0 || (size_t)n >= sizeof l->extra - used) {
        l->extra[used] = '\0';
        errmsg_set(err, errlen, "object key parts too long for a namespace of %" PRIu64 "-byte objects "
                   "(extra < %d bytes)", l->block_bytes, NS_EXTRA_MAX);
        return -KVNODE_ELAYOUT;
    }
    return cache_bind(c, l, out, err, errlen);
}

/* Whether have is one of the namespaces of want's (deployment, rank, group):
 * its plain layout or one of its per-size ones. */
static bool kvs_layout_of_group(const struct ns_layout *have, const struct ns_layout *want)
{
    size_t n = strnlen(want->extra, sizeof want->extra);
    if (strcmp(have->model, want->model) != 0 || strcmp(have->dtype, want->dtype) != 0 ||
        have->tp_size != want->tp_size || have->tp_rank != want->tp_rank ||
        have->block_tokens != want->block_tokens || have->num_layers != want->num_layers ||
        have->kv_heads != want->kv_heads || have->head_dim != want->head_dim ||
        strncmp(have->extra, want->extra, n) != 0)
        return false;
    return have->extra[n] == '\0' || strncmp(have->extra + n, KVS_SIZE_TAG, strlen(KVS_SIZE_TAG)) == 0;
}

size_t kvs_held_at_other_size(struct cache *c, const struct ns_layout *plain, const struct kv_namespace *ns,
                              const int64_t *keys, const uint64_t *checks, size_t n, uint64_t *size)
{
    for (size_t j = 0;; j++) {
        struct kv_namespace *other = cache_ns_at(c, j);
        if (!other)
            return n;
        if (other == ns || !kvs_layout_of_group(&other->layout, plain))
            continue;
        size_t i = cache_first_held(c, other, keys, checks, n);
        if (i < n) {
            *size = other->layout.block_bytes;
            return i;
        }
    }
}

/* Ask ns for the m keys of want[] not found yet (their indexes in idx);
 * the hits' locations and sizes into locs/bytes. */
static int kvs_read_in(struct cache *c, struct kv_namespace *ns, struct kvs_read *r, const size_t *idx,
                       const int64_t *want, const uint64_t *checks, struct cache_loc *got, size_t m, char *err,
                       size_t errlen)
{
    /* Known only from the store (recovery): bind it once so that it has
     * its size class and its blocks can come back into memory. */
    if (ns->cls == UINT32_MAX && cache_bind(c, &ns->layout, &ns, err, errlen) == 0)
        cache_unbind(c, ns);
    struct cache_lent lent = { .locs = got };
    int rc = cache_get_each(c, &(struct cache_read_req){ .ns = ns, .keys = want, .checks = checks, .n = m,
                                                        .owner = r->owner },
                            &lent, err, errlen);
    if (rc != 0)
        return rc;
    if (lent.lease_id)
        r->lease_ids[(*r->nleases)++] = lent.lease_id;
    for (size_t i = 0; i < m; i++)
        if (got[i].present) {
            r->locs[idx[i]] = got[i];
            r->bytes[idx[i]] = ns->layout.block_bytes;
        }
    return 0;
}

int kvs_read_objects(struct cache *c, const struct ns_layout *l, struct kvs_read *r, char *err, size_t errlen)
{
    size_t *idx = malloc((r->n ? r->n : 1) * sizeof *idx);
    int64_t *want = malloc((r->n ? r->n : 1) * sizeof *want);
    struct cache_loc *got = malloc((r->n ? r->n : 1) * sizeof *got);
    uint64_t *checks = r->checks ? malloc(r->n * sizeof *checks) : NULL;
    int rc = 0;

    for (size_t i = 0; i < r->n; i++) {
        r->locs[i].present = false;
        r->bytes[i] = 0;
    }
    if (!idx || !want || !got || (r->checks && !checks)) {
        errmsg_set(err, errlen, "out of memory");
        rc = -KVNODE_ENOMEM;
    }
    /* Every namespace of the group, one per object size (a handful):
     * each asked for the keys the ones before it did not have. */
    for (size_t j = 0; rc == 0 && *r->nleases < r->max_leases; j++) {
        struct kv_namespace *ns = cache_ns_at(c, j);
        size_t m = 0;
        if (!ns)
            break;
        if (!kvs_layout_of_group(&ns->layout, l))
            continue;
        for (size_t i = 0; i < r->n; i++)
            if (!r->locs[i].present) {
                idx[m] = i;
                if (checks)
                    checks[m] = r->checks[i];
                want[m++] = r->keys[i];
            }
        if (m == 0)
            break;
        rc = kvs_read_in(c, ns, r, idx, want, checks, got, m, err, errlen);
    }
    free(idx);
    free(want);
    free(got);
    free(checks);
    return rc;
}

/* --- the uid of a loopback TCP peer ------------------------------------------ */

static bool kvs_addr_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* The diag socket is dropped after any failure, so no answer to an
 * earlier query can be waiting on the next one's. */
static void kvs_diag_drop(int *diag)
{
    close(*diag);
    *diag = -1;
}

int kvs_peer_tcp_uid(int fd, int *diag, uid_t *uid, char *err, size_t errlen)
{
    struct sockaddr_storage local, peer;
    socklen_t ll = sizeof local, pl = sizeof peer;
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 r;
    } req;
    struct sockaddr_nl nladdr = { .nl_family = AF_NETLINK };
    union {
        char buf[8192];
        struct nlmsghdr align;
    } ans;
    static uint32_t seq;
    ssize_t got;

    if (getsockname(fd, (struct sockaddr *)&local, &ll) < 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) < 0) {
        errmsg_set(err, errlen, "cannot name the connection's ends: %s", strerror(errno));
        return -1;
    }
    if (peer.ss_family != local.ss_family || !kvs_addr_loopback(&peer)) {
        errmsg_set(err, errlen, "the peer is not on loopback; the KVS front end serves engines on this node only");
        return -1;
    }
    memset(&req, 0, sizeof req);
    req.nlh.nlmsg_len = sizeof req;
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST;
    req.nlh.nlmsg_seq = ++seq;
    req.r.sdiag_family = (uint8_t)peer.ss_family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0u;
    /* The client's socket: its source is our peer, its destination us. */
    if (peer.ss_family == AF_INET) {
        const struct sockaddr_in *p = (const struct sockaddr_in *)&peer, *l = (const struct sockaddr_in *)&local;
        req.r.id.idiag_sport = p->sin_port;
        req.r.id.idiag_dport = l->sin_port;
        memcpy(req.r.id.idiag_src, &p->sin_addr, 4);
        memcpy(req.r.id.idiag_dst, &l->sin_addr, 4);
    } else {
        const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)&peer, *l = (const struct sockaddr_in6 *)&local;
        req.r.id.idiag_sport = p->sin6_port;
        req.r.id.idiag_dport = l->sin6_port;
        memcpy(req.r.id.idiag_src, &p->sin6_addr, 16);
        memcpy(req.r.id.idiag_dst, &l->sin6_addr, 16);
    }
    req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

    if (*diag < 0 && (*diag = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)) < 0) {
        errmsg_set(err, errlen, "NETLINK_SOCK_DIAG socket: %s", strerror(errno));
        return -1;
    }
    if (sendto(*diag, &req, sizeof req, 0, (struct sockaddr *)&nladdr, sizeof nladdr) != (ssize_t)sizeof req) {
        errmsg_set(err, errlen, "NETLINK_SOCK_DIAG query: %s", strerror(errno));
        kvs_diag_drop(diag);
        return -1;
    }
    got = recv(*diag, ans.buf, sizeof ans.buf, 0);
    if (got < 0) {
        errmsg_set(err, errlen, "NETLINK_SOCK_DIAG answer: %s", strerror(errno));
        kvs_diag_drop(diag);
        return -1;
    }
    /* A query for one socket is answered in one datagram, read whole. */
    for (struct nlmsghdr *h = &ans.align; NLMSG_OK(h, (size_t)got); h = NLMSG_NEXT(h, got)) {
        if (h->nlmsg_seq != req.nlh.nlmsg_seq) {
            errmsg_set(err, errlen, "NETLINK_SOCK_DIAG answered another query");
            kvs_diag_drop(diag);
            return -1;
        }
        if (h->nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *e = NLMSG_DATA(h);
            errmsg_set(err, errlen, "the kernel does not know the peer's socket: %s", strerror(-e->error));
            return -1;
        }
        if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
            continue;
        const struct inet_diag_msg *m = NLMSG_DATA(h);
        if (m->id.idiag_sport != req.r.id.idiag_sport || m->id.idiag_dport != req.r.id.idiag_dport)
            continue;
        /* A socket its owner has closed has no inode, and the kernel gives
         * it uid 0 (or keeps the old uid): nobody owns it any more. */
        if (m->idiag_inode == 0) {
            errmsg_set(err, errlen, "the client's socket was already closed when its connection was accepted");
            return -1;
        }
        *uid = (uid_t)m->idiag_uid;
        return 0;
    }
    errmsg_set(err, errlen, "the kernel's socket table has no entry for the peer");
    return -1;
}

void kvs_identify_tcp(void *arg, int fd, struct httpd_peer *out)
{
    int *diag = arg;
    out->known = fd >= 0 && kvs_peer_tcp_uid(fd, diag, &out->uid, out->why, sizeof out->why) == 0;
    if (fd < 0)
        errmsg_set(out->why, sizeof out->why, "the connection has no socket");
}

/* --- tenants ------------------------------------------------------------------- */

struct tenant *kvs_server_tenant(const struct kvn_config *cfg, struct tenants *ts, uid_t uid, gid_t gid,
                                 const gid_t *groups, size_t ngroups, bool groups_known, char *why,
                                 size_t whylen)
{
    bool uid_named = false, groups_matter = cfg->allow_gid_list.n > 0;
    uint32_t nt = cfg->ntenants < CONFIG_TENANTS_MAX ? cfg->ntenants : CONFIG_TENANTS_MAX;

    for (uint32_t i = 0; i < nt; i++) {
        uid_named = uid_named || config_idlist_has(&cfg->tenants[i].uid_list, (uint32_t)uid);
        groups_matter = groups_matter || cfg->tenants[i].gid_list.n > 0;
    }
    /* Admission, as the engine socket does it. */
    if (!config_peer_admitted(&cfg->allow_uid_list, &cfg->allow_gid_list, uid, groups_known ? gid : (gid_t)-1,
                              groups, groups_known ? ngroups : 0)) {
        errmsg_set(why, whylen, "uid %d is not in [server] allow_uids%s", (int)uid,
                   groups_known ? " and none of its groups is in allow_gids"
                                : " (over TCP only the uid is known: list it in allow_uids, or use a unix "
                                  "listen address)");
        return NULL;
    }
    if (!groups_known && !uid_named && groups_matter) {
        errmsg_set(why, whylen, "uid %d is named by no [tenant.NAME] uids, and tenants are also chosen by "
                   "group, which a TCP peer does not reveal: add uid %d to its tenant's uids, or set "
                   "[kvs_server] listen = unix:PATH", (int)uid, (int)uid);
        return NULL;
    }
    struct tenant *t = tenants_for_peer(ts, uid, groups_known ? gid : (gid_t)-1, groups_known ? groups : NULL,
                                        groups_known ? ngroups : 0);
    if (!t->cache) {
        errmsg_set(why, whylen, "uid %d belongs to tenant %s, which has no host memory: add uid %d to a "
                   "[tenant.NAME] section, or leave memory for tenant %s", (int)uid, t->name, (int)uid, t->name);
        return NULL;
    }
    return t;
}

struct tenant *kvs_server_unix_tenant(const struct kvn_config *cfg, struct tenants *ts, int fd, struct ucred *cred,
                                      char *why, size_t whylen)
{
    socklen_t len = sizeof *cred;
    gid_t buf[64], *heap = NULL;
    size_t n = 0;

    *cred = (struct ucred){ .pid = -1, .uid = (uid_t)-1, .gid = (gid_t)-1 };
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) != 0) {
        errmsg_set(why, whylen, "SO_PEERCRED: %s", strerror(errno));
        return NULL;
    }
    const gid_t *groups = server_peer_groups(fd, buf, sizeof buf / sizeof buf[0], &heap, &n);
    struct tenant *t = kvs_server_tenant(cfg, ts, cred->uid, cred->gid, groups, n, true, why, whylen);
    free(heap);
    return t;
}

/* Unit tests for daemon/mem/namespace.c: fingerprints, validation, registry. */
#include <check.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/kvcm_config.h"
#include "kvnode.h"
#include "mem/namespace.h"

static struct ns_layout sample_layout(void)
{
    struct ns_layout l;
    memset(&l, 0, sizeof(l));
    snprintf(l.model, sizeof(l.model), "qwen2-7b");
    snprintf(l.dtype, sizeof(l.dtype), "bf16");
    l.block_tokens = 16;
    l.block_bytes = 65536;
    l.num_layers = 28;
    l.kv_heads = 4;
    l.head_dim = 128;
    l.tp_size = 4;
    l.tp_rank = 0;
    snprintf(l.extra, sizeof(l.extra), "rope=yarn");
    return l;
}

/* --- FNV-1a and the canonical string ---------------------------------- */

START_TEST(test_fnv_golden)
{
    ck_assert_uint_eq(ns_fnv1a64("", 0), UINT64_C(0xcbf29ce484222325));
    ck_assert_uint_eq(ns_fnv1a64("a", 1), UINT64_C(0xaf63dc4c8601ec8c));
    ck_assert_uint_eq(ns_fnv1a64("foobar", 6), UINT64_C(0x85944171f73967e8));
    /* Bytes are unsigned and the length is honoured (embedded NUL). */
    ck_assert_uint_ne(ns_fnv1a64("a\0b", 3), ns_fnv1a64("a", 1));
    /* Bytes >= 0x80 are hashed as unsigned (values from a reference FNV-1a). */
    ck_assert_uint_eq(ns_fnv1a64("\xff", 1), UINT64_C(0xaf64724c8602eb6e));
    ck_assert_uint_eq(ns_fnv1a64("\xc3\xa9t\xc3\xa9", 5), UINT64_C(0x009a8f0e88b51857));
}
END_TEST

START_TEST(test_canonical_string)
{
    struct ns_layout l = sample_layout();
    const char *expect = "kvnode-layout-v1|model=qwen2-7b|dtype=bf16|block_tokens=16|num_layers=28"
                         "|kv_heads=4|head_dim=128|tp_size=4|extra=rope=yarn";
    char buf[1024];
    size_t n = ns_canonical_string(&l, buf, sizeof(buf));
    ck_assert_str_eq(buf, expect);
    ck_assert_uint_eq(n, strlen(expect));

    /* Truncation still reports the full length and terminates. */
    char small[10];
    ck_assert_uint_eq(ns_canonical_string(&l, small, sizeof(small)), strlen(expect));
    ck_assert_str_eq(small, "kvnode-la");
    ck_assert_uint_eq(ns_canonical_string(&l, NULL, 0), strlen(expect));

    /* Empty extra, large numbers in unsigned decimal, rank/bytes absent. */
    l.extra[0] = '\0';
    l.num_layers = UINT32_MAX;
    l.tp_rank = 3;
    l.block_bytes = 123456789;
    ns_canonical_string(&l, buf, sizeof(buf));
    ck_assert_str_eq(buf, "kvnode-layout-v1|model=qwen2-7b|dtype=bf16|block_tokens=16"
                          "|num_layers=4294967295|kv_heads=4|head_dim=128|tp_size=4|extra=");

    /* The fingerprint is the FNV-1a of exactly that text. */
    ck_assert_uint_eq(ns_fingerprint(&l), ns_fnv1a64(buf, strlen(buf)));
}
END_TEST

/* A canonical string of a layout with maximal fields fits and is hashed
 * whole (a field past the old end still changes the fingerprint). */
START_TEST(test_canonical_max_fields)
{
    struct ns_layout l = sample_layout();
    memset(l.model, 'm', NS_MODEL_MAX - 1);
    l.model[NS_MODEL_MAX - 1] = '\0';
    memset(l.dtype, 'd', NS_DTYPE_MAX - 1);
    l.dtype[NS_DTYPE_MAX - 1] = '\0';
    memset(l.extra, 'e', NS_EXTRA_MAX - 1);
    l.extra[NS_EXTRA_MAX - 1] = '\0';
    l.block_tokens = l.num_layers = l.kv_heads = l.head_dim = l.tp_size = UINT32_MAX;
    char buf[2048];
    size_t n = ns_canonical_string(&l, buf, sizeof(buf));
    ck_assert_uint_eq(n, strlen(buf));
    ck_assert_uint_eq(ns_fingerprint(&l), ns_fnv1a64(buf, n));
    uint64_t fp = ns_fingerprint(&l);
    l.extra[NS_EXTRA_MAX - 2] = 'f';
    ck_assert_uint_ne(ns_fingerprint(&l), fp);
}
END_TEST

/* --- fingerprint: which fields count ---------------------------------- */

START_TEST(test_fingerprint_ignores_rank_and_bytes)
{
    struct ns_layout l = sample_layout();
    uint64_t fp = ns_fingerprint(&l);
    for (uint32_t r = 0; r < l.tp_size; r++) {
        struct ns_layout m = l;
        m.tp_rank = r;
        ck_assert_uint_eq(ns_fingerprint(&m), fp);
    }
    struct ns_layout m = l;
    m.block_bytes = 131072;
    ck_assert_uint_eq(ns_fingerprint(&m), fp);
}
END_TEST

/* Each mutator changes one field of the canonical string. */
static void mut_model(struct ns_layout *l) { snprintf(l->model, sizeof(l->model), "qwen2-7c"); }
static void mut_dtype(struct ns_layout *l) { snprintf(l->dtype, sizeof(l->dtype), "fp8"); }
static void mut_block_tokens(struct ns_layout *l) { l->block_tokens++; }
static void mut_num_layers(struct ns_layout *l) { l->num_layers++; }
static void mut_kv_heads(struct ns_layout *l) { l->kv_heads++; }
static void mut_head_dim(struct ns_layout *l) { l->head_dim++; }
static void mut_tp_size(struct ns_layout *l) { l->tp_size++; }
static void mut_extra(struct ns_layout *l) { snprintf(l->extra, sizeof(l->extra), "rope=none"); }
static void mut_extra_empty(struct ns_layout *l) { l->extra[0] = '\0'; }

static const struct {
    const char *field;
    void (*mutate)(struct ns_layout *);
} mutators[] = {
    {"model", mut_model},       {"dtype", mut_dtype},         {"block_tokens", mut_block_tokens},
    {"num_layers", mut_num_layers}, {"kv_heads", mut_kv_heads}, {"head_dim", mut_head_dim},
    {"tp_size", mut_tp_size},   {"extra", mut_extra},         {"extra", mut_extra_empty},
};
#define NMUTATORS ((int)(sizeof(mutators) / sizeof(mutators[0])))

START_TEST(test_fingerprint_depends_on_field)
{
    struct ns_layout l = sample_layout();
    uint64_t fp = ns_fingerprint(&l);
    struct ns_layout m = l;
    mutators[_i].mutate(&m);
    ck_assert_msg(ns_fingerprint(&m) != fp, "fingerprint ignores %s", mutators[_i].field);
    /* and the field is in the canonical text under its own name */
    char buf[1024], key[64];
    ns_canonical_string(&l, buf, sizeof(buf));
    snprintf(key, sizeof(key), "|%s=", mutators[_i].field);
    ck_assert_ptr_nonnull(strstr(buf, key));
    /* the mutated layout binds a different deployment */
    struct ns_registry *r = NULL;
    ck_assert_int_eq(ns_registry_create(4, &r), 0);
    struct kv_namespace *a = NULL, *b = NULL;
    int created = 0;
    char err[256] = "";
    ck_assert_int_eq(ns_bind(r, &l, &a, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(ns_bind(r, &m, &b, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 1);
    ck_assert_ptr_ne(a, b);
    ck_assert_str_ne(a->deployment_id, b->deployment_id);
    ns_registry_destroy(r);
}
END_TEST

/* --- deployment id ------------------------------------------------------ */

START_TEST(test_deployment_id)
{
    struct ns_layout l = sample_layout();
    uint64_t fp = ns_fingerprint(&l);
    char expect[64], buf[NS_DEPLOYMENT_ID_MAX];
    snprintf(expect, sizeof(expect), "qwen2-7b-%" PRIx64, fp);
    ck_assert_uint_eq(ns_deployment_id(&l, fp, buf, sizeof(buf)), strlen(expect));
    ck_assert_str_eq(buf, expect);

    /* '/', space (and tab/newline) become '_'; lowercase hex, no padding. */
    snprintf(l.model, sizeof(l.model), "Qwen/Qwen2 7B/x");
    ns_deployment_id(&l, UINT64_C(0x00000abc0def), buf, sizeof(buf));
    ck_assert_str_eq(buf, "Qwen_Qwen2_7B_x-abc0def");
    snprintf(l.model, sizeof(l.model), "a\tb\nc");
    ns_deployment_id(&l, UINT64_C(0xFEDCBA9876543210), buf, sizeof(buf));
    ck_assert_str_eq(buf, "a_b_c-fedcba9876543210");
    ns_deployment_id(&l, 0, buf, sizeof(buf));
    ck_assert_str_eq(buf, "a_b_c-0");

    /* The longest model still fits the namespace's field. */
    memset(l.model, 'x', NS_MODEL_MAX - 1);
    l.model[NS_MODEL_MAX - 1] = '\0';
    ck_assert_uint_lt(ns_deployment_id(&l, UINT64_MAX, buf, sizeof(buf)), sizeof(buf));
    ck_assert_uint_eq(strlen(buf), NS_MODEL_MAX - 1 + 1 + 16);

    /* The registry uses the same id. */
    struct ns_layout k = sample_layout();
    snprintf(k.model, sizeof(k.model), "org/m 1");
    struct ns_registry *r = NULL;
    ck_assert_int_eq(ns_registry_create(2, &r), 0);
    struct kv_namespace *ns = NULL;
    ck_assert_int_eq(ns_bind(r, &k, &ns, NULL, NULL, 0), 0);
    snprintf(expect, sizeof(expect), "org_m_1-%" PRIx64, ns_fingerprint(&k));
    ck_assert_str_eq(ns->deployment_id, expect);
    ck_assert_uint_eq(ns->fingerprint, ns_fingerprint(&k));
    ns_registry_destroy(r);
}
END_TEST

/* --- validation --------------------------------------------------------- */

static void bad_empty_model(struct ns_layout *l) { l->model[0] = '\0'; }
static void bad_empty_dtype(struct ns_layout *l) { l->dtype[0] = '\0'; }
static void bad_ctl_model(struct ns_layout *l) { l->model[3] = '\n'; }
static void bad_ctl_dtype(struct ns_layout *l) { l->dtype[1] = 0x7f; }
static void bad_long_model(struct ns_layout *l) { memset(l->model, 'm', NS_MODEL_MAX); }
static void bad_long_dtype(struct ns_layout *l) { memset(l->dtype, 'd', NS_DTYPE_MAX); }
static void bad_long_extra(struct ns_layout *l) { memset(l->extra, 'e', NS_EXTRA_MAX); }
static void bad_block_tokens(struct ns_layout *l) { l->block_tokens = 0; }
static void bad_block_bytes(struct ns_layout *l) { l->block_bytes = 0; }
static void bad_tp_size(struct ns_layout *l) { l->tp_size = 0; }
static void bad_tp_rank(struct ns_layout *l) { l->tp_rank = 4; }

static const struct {
    void (*mutate)(struct ns_layout *);
    const char *needle;     /* must appear in the message */
} invalid[] = {
    {bad_empty_model, "model is empty"},
    {bad_empty_dtype, "dtype is empty"},
    {bad_ctl_model, "model contains control character 0x0a at byte 3"},
    {bad_ctl_dtype, "dtype contains control character 0x7f"},
    {bad_long_model, "model is longer than 127 bytes"},
    {bad_long_dtype, "dtype is longer than 31 bytes"},
    {bad_long_extra, "extra is longer than 255 bytes"},
    {bad_block_tokens, "block_tokens"},
    {bad_block_bytes, "block_bytes"},
    {bad_tp_size, "tp_size"},
    {bad_tp_rank, "layout: tp_rank 4 is not below tp_size 4"},
};
#define NINVALID ((int)(sizeof(invalid) / sizeof(invalid[0])))

START_TEST(test_validate_rejects)
{
    struct ns_layout l = sample_layout();
    char err[256] = "";
    ck_assert_int_eq(ns_layout_validate(&l, err, sizeof(err)), 0);
    invalid[_i].mutate(&l);
    ck_assert_int_eq(ns_layout_validate(&l, err, sizeof(err)), -KVNODE_ELAYOUT);
    ck_assert_msg(strstr(err, invalid[_i].needle) != NULL, "message '%s' lacks '%s'", err,
                  invalid[_i].needle);
    /* NULL err is fine. */
    ck_assert_int_eq(ns_layout_validate(&l, NULL, 0), -KVNODE_ELAYOUT);
    /* bind refuses it the same way and registers nothing */
    struct ns_registry *r = NULL;
    ck_assert_int_eq(ns_registry_create(4, &r), 0);
    struct kv_namespace *ns = (struct kv_namespace *)(uintptr_t)1;
    int created = 7;
    err[0] = '\0';
    ck_assert_int_eq(ns_bind(r, &l, &ns, &created, err, sizeof(err)), -KVNODE_ELAYOUT);
    ck_assert_ptr_null(ns);
    ck_assert_int_eq(created, 0);
    ck_assert_ptr_nonnull(strstr(err, invalid[_i].needle));
    ck_assert_uint_eq(ns_count(r), 0);
    ns_registry_destroy(r);
}
END_TEST

START_TEST(test_validate_accepts_edges)
{
    struct ns_layout l = sample_layout();
    char err[256];
    l.tp_size = 1;
    l.tp_rank = 0;
    l.extra[0] = '\0';                    /* extra may be empty */
    ck_assert_int_eq(ns_layout_validate(&l, err, sizeof(err)), 0);
    l.tp_size = 8;
    l.tp_rank = 7;
    snprintf(l.extra, sizeof(l.extra), "a\tb");   /* extra is free-form */
    memset(l.model, 'm', NS_MODEL_MAX - 1);
    l.model[NS_MODEL_MAX - 1] = '\0';
    ck_assert_int_eq(ns_layout_validate(&l, err, sizeof(err)), 0);
    /* num_layers / kv_heads / head_dim are not range-checked (0 allowed). */
    l.num_layers = l.kv_heads = l.head_dim = 0;
    ck_assert_int_eq(ns_layout_validate(&l, err, sizeof(err)), 0);
}
END_TEST

/* --- registry ------------------------------------------------------------ */

START_TEST(test_bind_same_and_other_rank)
{
    struct ns_registry *r = NULL;
    ck_assert_int_eq(ns_registry_create(16, &r), 0);
    ck_assert_uint_eq(ns_count(r), 0);
    ck_assert_ptr_null(ns_get(r, 0));
    ck_assert_ptr_null(ns_get(r, 1));
    ck_assert_ptr_null(ns_at(r, 0));

    struct ns_layout l = sample_layout();
    struct kv_namespace *a = NULL, *again = NULL, *b = NULL;
    int created = -1;
    char err[256] = "";
    ck_assert_int_eq(ns_bind(r, &l, &a, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 1);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->id, 1);
    ck_assert_uint_eq(a->fingerprint, ns_fingerprint(&l));
    ck_assert_str_eq(a->layout.model, l.model);
    ck_assert_str_eq(a->layout.dtype, l.dtype);
    ck_assert_str_eq(a->layout.extra, l.extra);
    ck_assert_uint_eq(a->layout.block_tokens, l.block_tokens);
    ck_assert_uint_eq(a->layout.block_bytes, l.block_bytes);
    ck_assert_uint_eq(a->layout.num_layers, l.num_layers);
    ck_assert_uint_eq(a->layout.kv_heads, l.kv_heads);
    ck_assert_uint_eq(a->layout.head_dim, l.head_dim);
    ck_assert_uint_eq(a->layout.tp_size, l.tp_size);
    ck_assert_uint_eq(a->layout.tp_rank, l.tp_rank);
    ck_assert_uint_eq(a->blocks, 0);
    ck_assert_uint_eq(a->bytes, 0);
    ck_assert_uint_eq(a->clients, 0);
    ck_assert_uint_eq(a->cls, UINT32_MAX);

    /* Same layout again: the same namespace, not created. */
    ck_assert_int_eq(ns_bind(r, &l, &again, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 0);
    ck_assert_ptr_eq(again, a);
    ck_assert_uint_eq(ns_count(r), 1);

    /* Another rank: a new namespace of the same deployment. */
    struct ns_layout l1 = l;
    l1.tp_rank = 1;
    ck_assert_int_eq(ns_bind(r, &l1, &b, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 1);
    ck_assert_ptr_ne(b, a);
    ck_assert_uint_eq(b->id, 2);
    ck_assert_uint_eq(b->layout.tp_rank, 1);
    ck_assert_uint_eq(b->fingerprint, a->fingerprint);
    ck_assert_str_eq(b->deployment_id, a->deployment_id);
    ck_assert_uint_eq(ns_count(r), 2);

    /* Ids are 1-based and stable; ns_at is creation order. */
    ck_assert_ptr_eq(ns_get(r, 1), a);
    ck_assert_ptr_eq(ns_get(r, 2), b);
    ck_assert_ptr_null(ns_get(r, 3));
    ck_assert_ptr_eq(ns_at(r, 0), a);
    ck_assert_ptr_eq(ns_at(r, 1), b);
    ck_assert_ptr_null(ns_at(r, 2));

    /* State set by the cache survives a re-bind. */
    a->cls = 3;
    a->clients = 2;
    ck_assert_int_eq(ns_bind(r, &l, &again, &created, err, sizeof(err)), 0);
    ck_assert_ptr_eq(again, a);
    ck_assert_uint_eq(again->cls, 3);
    ck_assert_uint_eq(again->clients, 2);

    /* A different deployment gets id 3. */
    struct ns_layout o = l;
    snprintf(o.dtype, sizeof(o.dtype), "fp16");
    struct kv_namespace *c = NULL;
    ck_assert_int_eq(ns_bind(r, &o, &c, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 1);
    ck_assert_uint_eq(c->id, 3);
    ck_assert_uint_ne(c->fingerprint, a->fingerprint);
    /* Ranks of one deployment form a ring; another deployment is alone. */
    ck_assert_ptr_eq(a->sibling, b);
    ck_assert_ptr_eq(b->sibling, a);
    ck_assert_uint_eq(a->ranks, 2);
    ck_assert_uint_eq(b->ranks, 2);
    ck_assert_ptr_eq(c->sibling, c);
    ck_assert_uint_eq(c->ranks, 1);
    ns_registry_destroy(r);
}
END_TEST

START_TEST(test_bind_block_bytes_conflict)
{
    struct ns_registry *r = NULL;
    ck_assert_int_eq(ns_registry_create(16, &r), 0);
    struct ns_layout l = sample_layout();
    struct kv_namespace *a = NULL, *ns = NULL;
    int created;
    char err[256] = "";
    ck_assert_int_eq(ns_bind(r, &l, &a, &created, err, sizeof(err)), 0);

    /* Same rank, other block size. */
    struct ns_layout m = l;
    m.block_bytes = 131072;
    ns = (struct kv_namespace *)(uintptr_t)1;
    ck_assert_int_eq(ns_bind(r, &m, &ns, &created, err, sizeof(err)), -KVNODE_ELAYOUT);
    ck_assert_ptr_null(ns);
    ck_assert_int_eq(created, 0);
    char expect[256];
    snprintf(expect, sizeof(expect),
             "layout conflict: deployment %s already registered with block_bytes 65536, "
             "engine announced 131072", a->deployment_id);
    ck_assert_str_eq(err, expect);

    /* Another rank of the same deployment with another size: refused too. */
    m.tp_rank = 2;
    err[0] = '\0';
    ck_assert_int_eq(ns_bind(r, &m, &ns, &created, err, sizeof(err)), -KVNODE_ELAYOUT);
    ck_assert_ptr_nonnull(strstr(err, "65536"));
    ck_assert_ptr_nonnull(strstr(err, "131072"));
    ck_assert_ptr_nonnull(strstr(err, a->deployment_id));
    ck_assert_uint_eq(ns_count(r), 1);

    /* With the right size that rank binds. */
    m.block_bytes = 65536;
    ck_assert_int_eq(ns_bind(r, &m, &ns, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 1);
    ck_assert_uint_eq(ns_count(r), 2);
    ns_registry_destroy(r);
}
END_TEST

/* Two layouts with the same v1 canonical string: '|' inside a string
 * shifts the field boundaries. Their identities (issue 27) differ, so they
 * are two deployments that both bind. */
START_TEST(test_bind_shifted_fields_are_two_deployments)
{
    struct ns_layout a = sample_layout(), b = sample_layout();
    snprintf(a.model, sizeof(a.model), "m|dtype=x");
    snprintf(a.dtype, sizeof(a.dtype), "y");
    snprintf(b.model, sizeof(b.model), "m");
    snprintf(b.dtype, sizeof(b.dtype), "x|dtype=y");
    char ca[1024], cb[1024];
    ns_canonical_string(&a, ca, sizeof ca);
    ns_canonical_string(&b, cb, sizeof cb);
    ck_assert_str_eq(ca, cb);
    ck_assert_uint_eq(ns_fingerprint_v1(&a, NULL), ns_fingerprint_v1(&b, NULL));
    ck_assert_uint_ne(ns_fingerprint(&a), ns_fingerprint(&b));

    struct ns_registry *r = NULL;
    ck_assert_int_eq(ns_registry_create(16, &r), 0);
    struct kv_namespace *na = NULL, *nb = NULL;
    int created;
    char err[256] = "";
    ck_assert_int_eq(ns_bind(r, &a, &na, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 1);
    ck_assert_int_eq(ns_bind(r, &b, &nb, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 1);
    ck_assert_ptr_ne(na, nb);
    ck_assert_str_ne(na->deployment_id, nb->deployment_id);
    ck_assert_uint_eq(na->ranks, 1);
    ck_assert_uint_eq(nb->ranks, 1);
    ns_registry_destroy(r);
}
END_TEST

/* Only active namespaces count; at the limit of records an idle one's
 * record is reused for a new namespace. */
START_TEST(test_idle_namespaces_are_reused)
{
    struct ns_registry *r = NULL;
    struct ns_layout l = sample_layout();
    struct kv_namespace *a, *b, *c;
    int created;
    char err[256] = "";
    ck_assert_int_eq(ns_registry_create(2, &r), 0);
    l.tp_size = 4;
    l.tp_rank = 0;
    ck_assert_int_eq(ns_bind(r, &l, &a, &created, err, sizeof err), 0);
    l.tp_rank = 1;
    ck_assert_int_eq(ns_bind(r, &l, &b, &created, err, sizeof err), 0);
    ck_assert_uint_eq(a->ranks, 2);
    a->clients = 1;
    b->stored = 3;            /* store-only: does not count, is not reused */
    ck_assert_uint_eq(ns_active_count(r), 1);
    l.tp_rank = 2;
    ck_assert_int_eq(ns_bind(r, &l, &c, &created, err, sizeof err), 0);   /* b does not count */
    ck_assert_uint_eq(c->id, 3);
    ck_assert_uint_eq(a->ranks, 3);
    c->clients = 1;
    /* Two active: a new one is refused, with how to recover. */
    struct kv_namespace *x;
    l.tp_rank = 3;
    ck_assert_int_eq(ns_bind(r, &l, &x, &created, err, sizeof err), -KVNODE_ELIMIT);
    ck_assert_ptr_nonnull(strstr(err, "server.max_namespaces"));
    /* b idle (nothing stored any more), c's client gone: a record is reused. */
    b->stored = 0;
    c->clients = 0;
    ck_assert_int_eq(ns_bind(r, &l, &x, &created, err, sizeof err), 0);
    ck_assert_int_eq(created, 1);
    ck_assert_ptr_eq(x, b);
    ck_assert_uint_eq(x->id, 2);
    ck_assert_uint_eq(x->layout.tp_rank, 3);
    ck_assert_uint_eq(ns_count(r), 3);
    ck_assert_uint_eq(a->ranks, 3);   /* rank 1 left the ring, rank 3 joined */
    ck_assert_uint_eq(x->ranks, 3);
    /* Recovery registers store-only namespaces past the limit. */
    a->clients = 0;
    x->clients = 1;
    c->clients = 1;
    l.tp_size = 8;
    l.tp_rank = 0;
    ck_assert_int_eq(ns_bind(r, &l, &x, &created, err, sizeof err), -KVNODE_ELIMIT);
    ck_assert_int_eq(ns_bind_ex(r, &l, false, &x, &created, err, sizeof err), 0);
    ns_registry_destroy(r);
}
END_TEST

START_TEST(test_bind_limit)
{
    struct ns_registry *r = NULL;
    ck_assert_int_eq(ns_registry_create(0, &r), -KVNODE_EINVAL);
    ck_assert_ptr_null(r);
    ck_assert_int_eq(ns_registry_create(3, &r), 0);
    struct ns_layout l = sample_layout();
    struct kv_namespace *ns[3];
    int created;
    char err[256] = "";
    for (uint32_t i = 0; i < 3; i++) {
        l.tp_rank = i;
        ck_assert_int_eq(ns_bind(r, &l, &ns[i], &created, err, sizeof(err)), 0);
        ck_assert_int_eq(created, 1);
        ck_assert_uint_eq(ns[i]->id, i + 1);
        ns[i]->clients = 1;   /* bound, as the cache does: it counts */
    }
    l.tp_rank = 3;
    struct kv_namespace *x = (struct kv_namespace *)(uintptr_t)1;
    ck_assert_int_eq(ns_bind(r, &l, &x, &created, err, sizeof(err)), -KVNODE_ELIMIT);
    ck_assert_ptr_null(x);
    ck_assert_int_eq(created, 0);
    ck_assert_ptr_nonnull(strstr(err, "namespace limit"));
    ck_assert_ptr_nonnull(strstr(err, "3"));
    ck_assert_uint_eq(ns_count(r), 3);
    /* Existing namespaces still bind at the limit. */
    l.tp_rank = 1;
    ck_assert_int_eq(ns_bind(r, &l, &x, &created, err, sizeof(err)), 0);
    ck_assert_ptr_eq(x, ns[1]);
    ck_assert_int_eq(created, 0);
    /* A conflict is still reported as a conflict, not as the limit. */
    l.block_bytes = 1;
    ck_assert_int_eq(ns_bind(r, &l, &x, &created, err, sizeof(err)), -KVNODE_ELAYOUT);
    ns_registry_destroy(r);
    ns_registry_destroy(NULL);
}
END_TEST

/* --- tenants (issue 15) ------------------------------------------------ */

/* "default" keeps the fingerprint of a node without tenants; a named
 * tenant's is FNV-1a of the canonical string + "|tenant=<name>" (layouts
 * without '|' in their strings: test_identity_string has the others). */
START_TEST(test_fingerprint_tenant)
{
    struct ns_layout l = sample_layout();
    char buf[1024];
    size_t n = ns_canonical_string(&l, buf, sizeof(buf));

    ck_assert_uint_eq(ns_fingerprint_tenant(&l, NULL), ns_fingerprint(&l));
    ck_assert_uint_eq(ns_fingerprint_tenant(&l, ""), ns_fingerprint(&l));
    snprintf(buf + n, sizeof(buf) - n, "|tenant=alpha");
    ck_assert_uint_eq(ns_fingerprint_tenant(&l, "alpha"), ns_fnv1a64(buf, strlen(buf)));
    ck_assert_uint_ne(ns_fingerprint_tenant(&l, "alpha"), ns_fingerprint(&l));
    ck_assert_uint_ne(ns_fingerprint_tenant(&l, "alpha"), ns_fingerprint_tenant(&l, "beta"));
    /* Ranks of one deployment still share it within a tenant. */
    struct ns_layout m = l;
    m.tp_rank = 3;
    ck_assert_uint_eq(ns_fingerprint_tenant(&m, "alpha"), ns_fingerprint_tenant(&l, "alpha"));
}
END_TEST

/* --- identities no field can imitate (issue 27) ------------------------ */

/* One (tenant, layout) pair and the identities computed from it. */
struct ident {
    const char *tenant;                 /* "" for "default" */
    struct ns_layout l;
    uint64_t fp;
    char dep[NS_DEPLOYMENT_ID_MAX];
    char inst[256];                     /* under the default [kvcm] instance_id template */
};

static void ident_fill(struct ident *x, const char *tenant, const struct ns_layout *l)
{
    x->tenant = tenant;
    x->l = *l;
    x->fp = ns_fingerprint_tenant(l, tenant);
    ns_deployment_id(l, x->fp, x->dep, sizeof x->dep);
    struct config_kvcm_vars v = { .model = l->model, .dtype = l->dtype, .block_tokens = l->block_tokens,
                                  .tp_size = l->tp_size, .fingerprint = x->fp };
    ck_assert_int_ge(config_kvcm_expand("{model}_{block_tokens}_{fingerprint}", &v, x->inst, sizeof x->inst), 0);
}

/* The same tenant and the same deployment: every identity field equal
 * (tp_rank and block_bytes are not part of it). */
static bool ident_same(const struct ident *a, const struct ident *b)
{
    return strcmp(a->tenant, b->tenant) == 0 && strcmp(a->l.model, b->l.model) == 0 &&
           strcmp(a->l.dtype, b->l.dtype) == 0 && strcmp(a->l.extra, b->l.extra) == 0 &&
           a->l.block_tokens == b->l.block_tokens && a->l.num_layers == b->l.num_layers &&
           a->l.kv_heads == b->l.kv_heads && a->l.head_dim == b->l.head_dim &&
           a->l.tp_size == b->l.tp_size;
}

static void ident_describe(const struct ident *x, char *buf, size_t len)
{
    snprintf(buf, len, "tenant \"%s\" model \"%s\" dtype \"%s\" block_tokens %u num_layers %u kv_heads %u "
             "head_dim %u tp_size %u extra \"%s\"", x->tenant, x->l.model, x->l.dtype, x->l.block_tokens,
             x->l.num_layers, x->l.kv_heads, x->l.head_dim, x->l.tp_size, x->l.extra);
}

/* No two different pairs share a fingerprint, deployment id or instance id. */
static void idents_distinct(const struct ident *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = i + 1; j < n; j++) {
            if (ident_same(&v[i], &v[j]))
                continue;
            const char *what = v[i].fp == v[j].fp ? "fingerprint"
                             : strcmp(v[i].dep, v[j].dep) == 0 ? "deployment id"
                             : strcmp(v[i].inst, v[j].inst) == 0 ? "KVCM instance id" : NULL;
            if (what) {
                char a[512], b[512];
                ident_describe(&v[i], a, sizeof a);
                ident_describe(&v[j], b, sizeof b);
                ck_abort_msg("%s shared (%s / %s) by\n  %s\n  %s", what, v[i].dep, v[i].inst, a, b);
            }
        }
    }
}

/* Separator text, other fields' labels, the tenant suffix and the shapes a
 * length prefix or an escape could be imitated with. */
static const char *const forged_text[] = {
    "", "x", "|", "||", "=", "|tenant=a", "|tenant=alpha", "x|tenant=a", "|tenant=", "|tenant=a|",
    "|tenant=default", "|model=m", "|dtype=bf16", "|extra=", "|extra=|tenant=a", "|block_tokens=16",
    "|num_layers=28|kv_heads=4|head_dim=128|tp_size=4|extra=", "|tp_size=4|extra=rope=yarn",
    "kvnode-layout-v1|model=m", "kvnode-layout-v2|", "1:", "0:", "1:a", "9:|tenant=a", ":", "\\",
    "\\|tenant=a", "%7Ctenant=a", ";tenant=a", "tenant=a",
};
#define NFORGED (sizeof forged_text / sizeof forged_text[0])
static const char *const forged_tenants[] = { "", "a", "alpha", "a-b", "x" };
#define NFTENANTS (sizeof forged_tenants / sizeof forged_tenants[0])

/* Every string field, and the fields next to each other, carrying that
 * text in every tenant: no two pairs share an identity. */
START_TEST(test_identity_fields_cannot_imitate)
{
    size_t cap = NFTENANTS * (NFORGED * 7 + 8), n = 0;
    struct ident *v = calloc(cap, sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t t = 0; t < NFTENANTS; t++) {
        const char *tn = forged_tenants[t];
        struct ns_layout base = sample_layout();
        ident_fill(&v[n++], tn, &base);
        for (size_t i = 0; i < NFORGED; i++) {
            struct ns_layout l = base;
            const char *f = forged_text[i];
            snprintf(l.extra, sizeof l.extra, "%s", f);                 /* extra = the text */
            ident_fill(&v[n++], tn, &l);
            snprintf(l.extra, sizeof l.extra, "rope=yarn%s", f);        /* ... after a value */
            ident_fill(&v[n++], tn, &l);
            l = base;
            snprintf(l.model, sizeof l.model, "m%s", f);                /* model */
            ident_fill(&v[n++], tn, &l);
            snprintf(l.model, sizeof l.model, "%sm", f);
            ident_fill(&v[n++], tn, &l);
            l = base;
            snprintf(l.dtype, sizeof l.dtype, "bf16%s", f);             /* dtype */
            ident_fill(&v[n++], tn, &l);
            l = base;                                                    /* model and dtype share it */
            snprintf(l.model, sizeof l.model, "m%s", f);
            snprintf(l.dtype, sizeof l.dtype, "%sbf16", f);
            ident_fill(&v[n++], tn, &l);
            l = base;                                                    /* dtype and extra */
            snprintf(l.dtype, sizeof l.dtype, "d%s", f);
            snprintf(l.extra, sizeof l.extra, "%s", f);
            ident_fill(&v[n++], tn, &l);
        }
        /* Field contents shifted across boundaries (the old canonical
         * string made each of these equal to its neighbour). */
        struct ns_layout l = base;
        snprintf(l.model, sizeof l.model, "m|dtype=x");
        snprintf(l.dtype, sizeof l.dtype, "y");
        ident_fill(&v[n++], tn, &l);
        snprintf(l.model, sizeof l.model, "m");
        snprintf(l.dtype, sizeof l.dtype, "x|dtype=y");
        ident_fill(&v[n++], tn, &l);
        l = base;   /* numbers carried by dtype, then by extra */
        snprintf(l.dtype, sizeof l.dtype, "d|block_tokens=1|num_layers=1");
        l.block_tokens = 2;
        l.num_layers = 2;
        snprintf(l.extra, sizeof l.extra, "e");
        ident_fill(&v[n++], tn, &l);
        l = base;
        snprintf(l.dtype, sizeof l.dtype, "d");
        l.block_tokens = 1;
        l.num_layers = 1;
        snprintf(l.extra, sizeof l.extra, "e");
        ident_fill(&v[n++], tn, &l);
        l = base;
        snprintf(l.model, sizeof l.model, "m_16");   /* the instance id's own separator */
        l.block_tokens = 1;
        ident_fill(&v[n++], tn, &l);
        l = base;
        snprintf(l.model, sizeof l.model, "m");
        l.block_tokens = 161;
        ident_fill(&v[n++], tn, &l);
    }
    ck_assert_uint_le(n, cap);
    idents_distinct(v, n);
    free(v);
}
END_TEST

/* The report of issue 27: a client of "default" declaring tenant a's
 * layout with extra "|tenant=a" got a's fingerprint, deployment id and
 * instance id. */
START_TEST(test_default_cannot_take_tenant_identity)
{
    struct ns_layout l = sample_layout();
    struct ident a, forged;
    ident_fill(&a, "a", &l);
    const char *extra = "rope=yarn";
    ck_assert_str_eq(l.extra, extra);
    snprintf(l.extra, sizeof l.extra, "rope=yarn|tenant=a");
    ident_fill(&forged, "", &l);
    ck_assert_uint_ne(forged.fp, a.fp);
    ck_assert_str_ne(forged.dep, a.dep);
    ck_assert_str_ne(forged.inst, a.inst);
    /* and through the registries, as HELLO binds them */
    struct ns_registry *rd = NULL, *ra = NULL;
    ck_assert_int_eq(ns_registry_create(4, &rd), 0);
    ck_assert_int_eq(ns_registry_create_tenant(4, "a", &ra), 0);
    struct kv_namespace *nd = NULL, *na = NULL;
    int created;
    char err[256] = "";
    ck_assert_int_eq(ns_bind(rd, &l, &nd, &created, err, sizeof err), 0);
    snprintf(l.extra, sizeof l.extra, "%s", extra);
    ck_assert_int_eq(ns_bind(ra, &l, &na, &created, err, sizeof err), 0);
    ck_assert_uint_ne(nd->fingerprint, na->fingerprint);
    ck_assert_str_ne(nd->deployment_id, na->deployment_id);
    ns_registry_destroy(rd);
    ns_registry_destroy(ra);
}
END_TEST

/* The identity text: v1 (+ tenant) without '|' in the strings, else v2
 * with every string length-prefixed. */
START_TEST(test_identity_string)
{
    struct ns_layout l = sample_layout();
    char buf[1024], v1[1024];
    size_t n1 = ns_canonical_string(&l, v1, sizeof v1);
    ck_assert(ns_identity_is_v1(&l));
    ck_assert_uint_eq(ns_identity_string(&l, NULL, buf, sizeof buf), n1);
    ck_assert_str_eq(buf, v1);
    ns_identity_string(&l, "alpha", buf, sizeof buf);
    ck_assert_str_eq(buf, "kvnode-layout-v1|model=qwen2-7b|dtype=bf16|block_tokens=16|num_layers=28"
                          "|kv_heads=4|head_dim=128|tp_size=4|extra=rope=yarn|tenant=alpha");

    snprintf(l.extra, sizeof l.extra, "rope=yarn|tenant=a");
    ck_assert(!ns_identity_is_v1(&l));
    const char *want = "kvnode-layout-v2|tenant=0:|model=8:qwen2-7b|dtype=4:bf16|block_tokens=16"
                       "|num_layers=28|kv_heads=4|head_dim=128|tp_size=4|extra=18:rope=yarn|tenant=a";
    ck_assert_uint_eq(ns_identity_string(&l, NULL, buf, sizeof buf), strlen(want));
    ck_assert_str_eq(buf, want);
    ck_assert_uint_eq(ns_fingerprint(&l), ns_fnv1a64(want, strlen(want)));
    ns_identity_string(&l, "a", buf, sizeof buf);
    ck_assert_str_eq(buf, "kvnode-layout-v2|tenant=1:a|model=8:qwen2-7b|dtype=4:bf16|block_tokens=16"
                          "|num_layers=28|kv_heads=4|head_dim=128|tp_size=4|extra=18:rope=yarn|tenant=a");
    /* '|' in model or dtype switches to v2 as well */
    l = sample_layout();
    snprintf(l.model, sizeof l.model, "a|b");
    ck_assert(!ns_identity_is_v1(&l));
    l = sample_layout();
    snprintf(l.dtype, sizeof l.dtype, "|");
    ck_assert(!ns_identity_is_v1(&l));

    /* Maximal fields and tenant fit and are hashed whole. */
    l = sample_layout();
    memset(l.model, '|', NS_MODEL_MAX - 1);
    l.model[NS_MODEL_MAX - 1] = '\0';
    memset(l.dtype, 'd', NS_DTYPE_MAX - 1);
    l.dtype[NS_DTYPE_MAX - 1] = '\0';
    memset(l.extra, 'e', NS_EXTRA_MAX - 1);
    l.extra[NS_EXTRA_MAX - 1] = '\0';
    l.block_tokens = l.num_layers = l.kv_heads = l.head_dim = l.tp_size = UINT32_MAX;
    char tenant[NS_TENANT_MAX];
    memset(tenant, 't', sizeof tenant - 1);
    tenant[sizeof tenant - 1] = '\0';
    char big[2048];
    size_t n = ns_identity_string(&l, tenant, big, sizeof big);
    ck_assert_uint_eq(n, strlen(big));
    ck_assert_uint_eq(ns_fingerprint_tenant(&l, tenant), ns_fnv1a64(big, n));
    uint64_t fp = ns_fingerprint_tenant(&l, tenant);
    l.extra[NS_EXTRA_MAX - 2] = 'f';
    ck_assert_uint_ne(ns_fingerprint_tenant(&l, tenant), fp);
}
END_TEST

/* Compatibility: layouts without '|' keep the fingerprints (hence deployment
 * ids, file store records, redis keys, KVCM instance ids) of earlier
 * versions, pinned here; a layout with '|' has its old fingerprint only in
 * ns_fingerprint_v1 (for the file store's recovery). */
START_TEST(test_fingerprint_v1_kept)
{
    struct ns_layout l = sample_layout();
    ck_assert_uint_eq(ns_fingerprint_tenant(&l, NULL), UINT64_C(0x08d24d1801698ed0));
    ck_assert_uint_eq(ns_fingerprint_tenant(&l, "alpha"), UINT64_C(0xd70e95a5d6bc4ffd));
    ck_assert_uint_eq(ns_fingerprint_v1(&l, NULL), UINT64_C(0x08d24d1801698ed0));
    ck_assert_uint_eq(ns_fingerprint_v1(&l, "alpha"), UINT64_C(0xd70e95a5d6bc4ffd));
    char dep[NS_DEPLOYMENT_ID_MAX];
    ns_deployment_id(&l, ns_fingerprint_tenant(&l, "alpha"), dep, sizeof dep);
    ck_assert_str_eq(dep, "qwen2-7b-d70e95a5d6bc4ffd");

    /* The layout of the report: its old fingerprint was tenant a's. */
    struct ns_layout f = l;
    snprintf(f.extra, sizeof f.extra, "rope=yarn|tenant=a");
    ck_assert_uint_eq(ns_fingerprint_v1(&f, NULL), ns_fingerprint_v1(&l, "a"));
    ck_assert_uint_ne(ns_fingerprint(&f), ns_fingerprint_v1(&f, NULL));
    ck_assert_uint_eq(ns_fingerprint_tenant(&l, "a"), ns_fingerprint_v1(&l, "a"));
}
END_TEST

/* Revisions (issue 31): "" is the identity and fingerprint pinned above; a
 * revision is version 3, whose fields cannot imitate each other or the
 * tenant; the registry keeps two revisions apart. */
START_TEST(test_revision_identity)
{
    struct ns_layout l = sample_layout();
    char buf[2048];
    l.revision[0] = '\0';
    ck_assert_uint_eq(ns_fingerprint_tenant(&l, NULL), UINT64_C(0x08d24d1801698ed0));
    ck_assert_uint_eq(ns_fingerprint_tenant(&l, "alpha"), UINT64_C(0xd70e95a5d6bc4ffd));

    snprintf(l.revision, sizeof l.revision, "abc123");
    ck_assert(!ns_identity_is_v1(&l));
    const char *want = "kvnode-layout-v3|tenant=0:|model=8:qwen2-7b|dtype=4:bf16|block_tokens=16"
                       "|num_layers=28|kv_heads=4|head_dim=128|tp_size=4|extra=9:rope=yarn"
                       "|revision=6:abc123";
    ck_assert_uint_eq(ns_identity_string(&l, NULL, buf, sizeof buf), strlen(want));
    ck_assert_str_eq(buf, want);
    ck_assert_uint_eq(ns_fingerprint(&l), ns_fnv1a64(want, strlen(want)));
    uint64_t fa = ns_fingerprint(&l);
    ck_assert_uint_ne(fa, UINT64_C(0x08d24d1801698ed0));
    snprintf(l.revision, sizeof l.revision, "abc124");
    ck_assert_uint_ne(ns_fingerprint(&l), fa);
    /* The revision cannot be spelled into extra, nor extra into the revision. */
    struct ns_layout m = sample_layout();
    snprintf(m.extra, sizeof m.extra, "rope=yarn|revision=6:abc123");
    ck_assert_uint_ne(ns_fingerprint(&m), fa);
    m = sample_layout();
    snprintf(m.extra, sizeof m.extra, "rope");
    snprintf(m.revision, sizeof m.revision, "=yarn");
    ck_assert_uint_ne(ns_fingerprint(&m), ns_fingerprint(&l));

    /* Validation: a control character in the revision is refused, named. */
    char err[256] = "";
    snprintf(l.revision, sizeof l.revision, "a\tb");
    ck_assert_int_eq(ns_layout_validate(&l, err, sizeof err), -KVNODE_ELAYOUT);
    ck_assert_msg(strstr(err, "revision") != NULL, "%s", err);

    /* Two revisions are two deployments in one registry. */
    struct ns_registry *r;
    struct kv_namespace *a, *b, *none;
    ck_assert_int_eq(ns_registry_create(8, &r), 0);
    l = sample_layout();
    ck_assert_int_eq(ns_bind(r, &l, &none, NULL, err, sizeof err), 0);
    snprintf(l.revision, sizeof l.revision, "A");
    ck_assert_int_eq(ns_bind(r, &l, &a, NULL, err, sizeof err), 0);
    snprintf(l.revision, sizeof l.revision, "B");
    ck_assert_int_eq(ns_bind(r, &l, &b, NULL, err, sizeof err), 0);
    ck_assert_ptr_ne(a, b);
    ck_assert_ptr_ne(a, none);
    ck_assert_uint_ne(a->fingerprint, b->fingerprint);
    ck_assert_uint_eq(none->fingerprint, UINT64_C(0x08d24d1801698ed0));
    ck_assert_str_eq(a->layout.revision, "A");
    ns_registry_destroy(r);
}
END_TEST

/* A tenant's registry: the same layout is another deployment (id and
 * fingerprint), and its limit message names the tenant's option. */
START_TEST(test_registry_tenant)
{
    struct ns_registry *d, *a;
    struct kv_namespace *nd, *na, *x;
    struct ns_layout l = sample_layout();
    char err[512];
    int created;

    ck_assert_int_eq(ns_registry_create(1, &d), 0);
    ck_assert_int_eq(ns_registry_create_tenant(1, "alpha", &a), 0);
    ck_assert_str_eq(ns_registry_tenant(d), "");
    ck_assert_str_eq(ns_registry_tenant(a), "alpha");
    ck_assert_int_eq(ns_bind(d, &l, &nd, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(ns_bind(a, &l, &na, &created, err, sizeof(err)), 0);
    ck_assert_uint_eq(nd->fingerprint, ns_fingerprint(&l));
    ck_assert_uint_eq(na->fingerprint, ns_fingerprint_tenant(&l, "alpha"));
    ck_assert_str_ne(nd->deployment_id, na->deployment_id);
    nd->clients = na->clients = 1;
    l.tp_rank = 1;
    ck_assert_int_eq(ns_bind(a, &l, &x, &created, err, sizeof(err)), -KVNODE_ELIMIT);
    ck_assert_msg(strstr(err, "([tenant.alpha] max_namespaces)") && strstr(err, "(reload)"), "%s", err);
    ck_assert_int_eq(ns_bind(d, &l, &x, &created, err, sizeof(err)), -KVNODE_ELIMIT);
    ck_assert_msg(strstr(err, "(server.max_namespaces)") && strstr(err, "(restart)"), "%s", err);
    /* A raised limit (reload) lets the next one in. */
    ck_assert_int_eq(ns_registry_set_max(a, 2), 0);
    ck_assert_int_eq(ns_registry_set_max(a, 0), -KVNODE_EINVAL);
    ck_assert_int_eq(ns_bind(a, &l, &x, &created, err, sizeof(err)), 0);
    ck_assert_int_eq(created, 1);
    ns_registry_destroy(d);
    ns_registry_destroy(a);
}
END_TEST

static Suite *namespace_suite(void)
{
    Suite *s = suite_create("namespace");
    TCase *tc = tcase_create("fingerprint");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_fnv_golden);
    tcase_add_test(tc, test_canonical_string);
    tcase_add_test(tc, test_canonical_max_fields);
    tcase_add_test(tc, test_fingerprint_ignores_rank_and_bytes);
    tcase_add_loop_test(tc, test_fingerprint_depends_on_field, 0, NMUTATORS);
    tcase_add_test(tc, test_deployment_id);
    tcase_add_loop_test(tc, test_validate_rejects, 0, NINVALID);
    tcase_add_test(tc, test_validate_accepts_edges);
    suite_add_tcase(s, tc);

    tc = tcase_create("registry");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_bind_same_and_other_rank);
    tcase_add_test(tc, test_bind_block_bytes_conflict);
    tcase_add_test(tc, test_bind_shifted_fields_are_two_deployments);
    tcase_add_test(tc, test_bind_limit);
    tcase_add_test(tc, test_idle_namespaces_are_reused);
    suite_add_tcase(s, tc);

    tc = tcase_create("tenants");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_fingerprint_tenant);
    tcase_add_test(tc, test_registry_tenant);
    suite_add_tcase(s, tc);

    tc = tcase_create("identity");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_identity_fields_cannot_imitate);
    tcase_add_test(tc, test_default_cannot_take_tenant_identity);
    tcase_add_test(tc, test_identity_string);
    tcase_add_test(tc, test_fingerprint_v1_kept);
    tcase_add_test(tc, test_revision_identity);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(namespace_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

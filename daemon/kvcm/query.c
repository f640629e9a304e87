/* kvcm/query: remote prefix queries with one deadline, a negative cache and
 * a circuit breaker (see query.h). */
#include "kvcm/query.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "core/clock.h"
#include "config/kvcm_config.h"
#include "core/errmsg.h"
#include "kvnode.h"
#include "core/log.h"
#include "core/workq.h"

#define QUERY_QUEUE 64u

struct kvcm_querier {
    struct event_base *base;
    struct kvcm_query_settings st;
    const char *endpoints[CONFIG_KVCM_ENDPOINTS_MAX];
    char endpoint_text[CONFIG_KVCM_ENDPOINTS_MAX][CONFIG_URL_MAX];
    char host_ip_port[CONFIG_KVCM_NAME_MAX];
    char instance_tmpl[CONFIG_KVCM_TEMPLATE_MAX];
    char trace_prefix[CONFIG_KVCM_NAME_MAX + 40];
    struct workq *wq;
    /* breaker and negative cache (loop thread) */
    uint32_t failures_in_row;
    uint64_t negative_until_ms, open_until_ms;
    uint64_t negative_ttl_now_ms;     /* the current (backed-off) negative TTL */
    bool half_open_trial;             /* a trial call is out while the breaker is open */
    /* counters */
    uint64_t asked, ok, failed, deadline, local_only, breaker_opened;
    char last_error[256];
};

struct kvcm_query {
    struct workq_job job;
    struct kvcm_querier *q;
    int64_t *keys;
    size_t n;
    uint32_t max_hosts;
    char instance_id[CONFIG_KVCM_TEMPLATE_MAX];
    uint64_t deadline_ms;
    bool trial;
    /* worker -> loop */
    int status;
    struct kvcm_result res;
    struct kvcm_query_answer ans;
    /* loop */
    bool answered, cancelled;
    struct event *timer;
    kvcm_answer_fn fn;
    void *arg;
};

static int query_thread_init(void *arg, unsigned index, void **ctx)
{
    struct kvcm_querier *q = arg;
    struct kvcm_client_config cc = {
        .endpoints = q->endpoints, .n_endpoints = q->st.n_endpoints,
        .connect_timeout_ms = q->st.connect_timeout_ms, .request_timeout_ms = q->st.deadline_ms,
        .max_response_bytes = 1u << 20, .trace_prefix = q->trace_prefix,
    };
    char err[256];
    struct kvcm_client *c = NULL;
    (void)index;
    if (kvcm_client_create(&cc, &c, err, sizeof err) < 0) {
        log_error("kvcm: query client: %s", err);
        return -KVNODE_EINVAL;
    }
    *ctx = c;
    return 0;
}

static void query_thread_fini(void *arg, void *ctx)
{
    (void)arg;
    kvcm_client_destroy(ctx);
}

static void query_run(struct workq_job *job, void *ctx)
{
    struct kvcm_query *qq = (struct kvcm_query *)job;
    uint64_t now = clock_now_ms();
    size_t n = 0;

    memset(&qq->res, 0, sizeof qq->res);
    if (now >= qq->deadline_ms) {
        qq->status = KVCM_TRANSPORT;
        snprintf(qq->res.message, sizeof qq->res.message, "the deadline passed before the query ran");
        return;
    }
    qq->status = kvcm_host_cache_state(ctx, qq->instance_id, qq->keys, qq->n,
                                       (uint32_t)(qq->deadline_ms - now), qq->ans.hosts,
                                       KVCM_QUERY_MAX_HOSTS, &n, &qq->res);
    qq->ans.n = n;
}

static void query_free(struct kvcm_query *qq)
{
    if (qq->timer)
        event_free(qq->timer);
    free(qq->keys);
    free(qq);
}

static void query_answer(struct kvcm_query *qq, const struct kvcm_query_answer *a)
{
    if (qq->answered || qq->cancelled)
        return;
    qq->answered = true;
    if (qq->timer)
        evtimer_del(qq->timer);
    qq->fn(qq->arg, a);
}

/* Keep peers only (not this node), best first, at most max. */
static void query_filter(const struct kvcm_querier *q, struct kvcm_query_answer *a, uint32_t max)
{
    size_t out = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (strcmp(a->hosts[i].host_ip_port, q->host_ip_port) == 0 || a->hosts[i].matched == 0)
            continue;
        a->hosts[out++] = a->hosts[i];
    }
    /* insertion sort by matched, descending (n <= 64) */
    for (size_t i = 1; i < out; i++) {
        struct kvcm_host_match h = a->hosts[i];
        size_t j = i;
        while (j > 0 && a->hosts[j - 1].matched < h.matched) {
            a->hosts[j] = a->hosts[j - 1];
            j--;
        }
        a->hosts[j] = h;
    }
    a->n = out < max ? out : max;
}

static void query_done(struct workq_job *job)
{
    struct kvcm_query *qq = (struct kvcm_query *)job;
    struct kvcm_querier *q = qq->q;
    uint64_t now = clock_now_ms();

    if (qq->trial)
        q->half_open_trial = false;
    if (job->cancelled) {
        query_free(qq);
        return;
    }
    /* No instance: nobody has published this deployment, so no peer holds it. */
    if (qq->status == KVCM_INSTANCE_NOT_EXIST) {
        qq->status = KVCM_OK;
        qq->ans.n = 0;
    }
    if (qq->status == KVCM_OK) {
        if (q->failures_in_row >= q->st.breaker_failures && q->st.breaker_failures > 0)
            log_info("kvcm: queries answer again; circuit breaker closed");
        q->failures_in_row = 0;
        q->negative_until_ms = 0;
        q->open_until_ms = 0;
        q->ok++;
        qq->ans.ok = true;
        query_filter(q, &qq->ans, qq->max_hosts);
    } else {
        q->failed++;
        q->failures_in_row++;
        /* Remembered for negative_ttl, doubling with each failure in a row
         * (backoff), at most breaker_open. */
        uint64_t ttl = q->st.negative_ttl_ms;
        for (uint32_t i = 1; i < q->failures_in_row && ttl < q->st.breaker_open_ms; i++)
            ttl *= 2;
        if (ttl > q->st.breaker_open_ms && q->st.breaker_open_ms > q->st.negative_ttl_ms)
            ttl = q->st.breaker_open_ms;
        q->negative_ttl_now_ms = ttl;
        q->negative_until_ms = now + ttl;
        errmsg_set(q->last_error, sizeof q->last_error, "%s: %s", kvcm_status_name(qq->status),
                 qq->res.message);
        if (q->st.breaker_failures > 0 && q->failures_in_row >= q->st.breaker_failures) {
            if (q->open_until_ms <= now)
                q->breaker_opened++;
            q->open_until_ms = now + q->st.breaker_open_ms;
            log_warn("kvcm: %u queries failed in a row (%s); circuit breaker open for %u ms",
                     q->failures_in_row, q->last_error, q->st.breaker_open_ms);
        }
        qq->ans.ok = false;
        qq->ans.n = 0;
        if (!qq->answered && !qq->cancelled && now + 1 >= qq->deadline_ms) {
            /* The call gave up at the request's deadline (its timeout is the time left,
             * libcurl may end it up to 1 ms early) before the deadline timer ran: the two
             * race, and the deadline is the reason either way. */
            q->deadline++;
            errmsg_set(qq->ans.why, sizeof qq->ans.why, "KVCM did not answer within the "
                       "query deadline (%u ms)", q->st.deadline_ms);
        } else {
            errmsg_set(qq->ans.why, sizeof qq->ans.why, "KVCM query failed: %s", q->last_error);
        }
    }
    query_answer(qq, &qq->ans);
    query_free(qq);
}

static void query_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    struct kvcm_query *qq = arg;
    struct kvcm_query_answer a = { .ok = false };
    (void)fd;
    (void)what;
    qq->q->deadline++;
    errmsg_set(a.why, sizeof a.why, "KVCM did not answer within the query deadline (%u ms)",
             qq->q->st.deadline_ms);
    query_answer(qq, &a);   /* the call goes on; its result only feeds the breaker */
}

int kvcm_query_start(struct kvcm_querier *q, const struct kv_namespace *ns, const int64_t *keys,
                     size_t n, uint32_t max_hosts, kvcm_answer_fn fn, void *arg,
                     struct kvcm_query_answer *now_ans, struct kvcm_query **out)
{
    uint64_t now = clock_now_ms();
    struct kvcm_query *qq;
    struct timeval tv;
    bool trial = false;

    *out = NULL;
    memset(now_ans, 0, sizeof *now_ans);
    q->asked++;
    if (max_hosts == 0 || max_hosts > q->st.max_hosts)
        max_hosts = q->st.max_hosts;
    if (n == 0) {
        now_ans->ok = true;
        return 1;
    }
    if (q->open_until_ms > now) {
        q->local_only++;
        errmsg_set(now_ans->why, sizeof now_ans->why, "circuit breaker open for %" PRIu64
                 " ms more after %u failures: %s", q->open_until_ms - now, q->failures_in_row,
                 q->last_error);
        return 1;
    }
    if (q->failures_in_row >= q->st.breaker_failures && q->st.breaker_failures > 0) {
        /* half-open: one trial call at a time */
        if (q->half_open_trial) {
            q->local_only++;
            errmsg_set(now_ans->why, sizeof now_ans->why, "circuit breaker half-open: a trial "
                     "query is in flight");
            return 1;
        }
        trial = true;
    } else if (q->negative_until_ms > now) {
        q->local_only++;
        errmsg_set(now_ans->why, sizeof now_ans->why, "a query failed %" PRIu64 " ms ago: %s",
                 q->negative_ttl_now_ms - (q->negative_until_ms - now), q->last_error);
        return 1;
    }
    qq = calloc(1, sizeof *qq);
    if (!qq || !(qq->keys = malloc(n * sizeof *keys))) {
        free(qq);
        q->local_only++;
        errmsg_set(now_ans->why, sizeof now_ans->why, "out of memory");
        return 1;
    }
    struct config_kvcm_vars v = { .model = ns->layout.model, .dtype = ns->layout.dtype,
                                  .block_tokens = ns->layout.block_tokens,
                                  .tp_size = ns->layout.tp_size, .fingerprint = ns->fingerprint };
    if (config_kvcm_expand(q->instance_tmpl, &v, qq->instance_id, sizeof qq->instance_id) < 0) {
        query_free(qq);
        q->local_only++;
        errmsg_set(now_ans->why, sizeof now_ans->why, "[kvcm] instance_id does not expand");
        return 1;
    }
    memcpy(qq->keys, keys, n * sizeof *keys);
    qq->n = n;
    qq->q = q;
    qq->max_hosts = max_hosts;
    qq->deadline_ms = now + q->st.deadline_ms;
    qq->fn = fn;
    qq->arg = arg;
    qq->trial = trial;
    qq->job.run = query_run;
    qq->job.done = query_done;
    qq->timer = evtimer_new(q->base, query_deadline_cb, qq);
    if (!qq->timer || workq_submit(q->wq, &qq->job) < 0) {
        query_free(qq);
        q->local_only++;
        errmsg_set(now_ans->why, sizeof now_ans->why, "too many queries in flight (%u)", QUERY_QUEUE);
        return 1;
    }
    if (trial)
        q->half_open_trial = true;
    tv.tv_sec = (time_t)(q->st.deadline_ms / 1000u);
    tv.tv_usec = (suseconds_t)((q->st.deadline_ms % 1000u) * 1000u);
    evtimer_add(qq->timer, &tv);
    *out = qq;
    return 0;
}

void kvcm_query_cancel(struct kvcm_querier *q, struct kvcm_query *qq)
{
    (void)q;
    if (!qq)
        return;
    qq->cancelled = true;
    if (qq->timer)
        evtimer_del(qq->timer);
}

int kvcm_querier_create(struct event_base *base, const struct kvcm_query_settings *st,
                        struct kvcm_querier **out, char *err, size_t errlen)
{
    struct kvcm_querier *q = calloc(1, sizeof *q);
    *out = NULL;
    if (!q) {
        errmsg_set(err, errlen, "kvcm query: out of memory");
        return -KVNODE_ENOMEM;
    }
    q->base = base;
    q->st = *st;
    for (size_t i = 0; i < st->n_endpoints && i < CONFIG_KVCM_ENDPOINTS_MAX; i++) {
        snprintf(q->endpoint_text[i], sizeof q->endpoint_text[i], "%s", st->endpoints[i]);
        q->endpoints[i] = q->endpoint_text[i];
    }
    q->st.n_endpoints = st->n_endpoints < CONFIG_KVCM_ENDPOINTS_MAX ? st->n_endpoints
                                                                    : CONFIG_KVCM_ENDPOINTS_MAX;
    q->st.endpoints = q->endpoints;
    snprintf(q->host_ip_port, sizeof q->host_ip_port, "%s", st->host_ip_port);
    snprintf(q->instance_tmpl, sizeof q->instance_tmpl, "%s", st->instance_id_template);
    snprintf(q->trace_prefix, sizeof q->trace_prefix, "%s-%" PRIu64 "-query", st->host_ip_port,
             st->epoch);
    if (q->st.max_hosts == 0 || q->st.max_hosts > KVCM_QUERY_MAX_HOSTS)
        q->st.max_hosts = KVCM_QUERY_MAX_HOSTS;
    const struct workq_thread_hooks hooks = { query_thread_init, query_thread_fini, q };
    int rc = workq_create_hooks(base, "kvcm-query", 1, QUERY_QUEUE, &hooks, &q->wq, err, errlen);
    if (rc < 0) {
        free(q);
        return rc;
    }
    *out = q;
    return 0;
}

void kvcm_querier_destroy(struct kvcm_querier *q)
{
    if (!q)
        return;
    workq_destroy(q->wq);
    free(q);
}

void kvcm_querier_get_stats(const struct kvcm_querier *q, struct kvcm_query_stats *out)
{
    *out = (struct kvcm_query_stats){
        .asked = q->asked, .ok = q->ok, .failed = q->failed, .deadline = q->deadline,
        .local_only = q->local_only, .breaker_opened = q->breaker_opened,
        .breaker_open = q->open_until_ms > clock_now_ms(), .last_error = q->last_error,
    };
}

/* persist health: whether the store answers — the failure kind of a
 * backend call's result, the OK / DEGRADED state, and the health probe that
 * brings the state back to OK while nothing else reaches the store (see
 * persist.h, persist_internal.h).
 *
 * State. OK after a call that reached the store succeeded (0 or KVS_MISS);
 * but after a failed write only a successful write (or the cache saying no
 * failed write waits for a retry: persist_write_failures_settled) ends
 * DEGRADED, because a store that answers probes and reads can still refuse
 * writes (a full disk). So while writes fail the probe is a write: the
 * cache's write probe hook writes one block that waits for a retry, and the
 * first one that lands ends DEGRADED (and the cache sends the others). DEGRADED after a failure of any kind but CORRUPT (the store answered) —
 * except -KVNODE_EINVAL and -KVNODE_ENOMEM, which are the caller's or this
 * process's problem, not the store's: they are counted (as IO) but leave the
 * state alone. While DEGRADED, a 0.5 s timer on the loop submits a probe
 * (one health job at a time; the write probe keeps one write under way), so
 * the state returns to OK when the store comes back even with no traffic.
 * Health jobs are not requests: they are not counted in submitted/completed
 * (but occupy a queue slot while outstanding). Every probe's result is
 * counted by kind (probes_ok, probes_failed). */
#include "persist/persist_internal.h"

#include <stdio.h>
#include <string.h>
#include <sys/time.h>

#include "kvnode.h"
#include "core/log.h"

#define PERSIST_HEALTH_MS    500u    /* probe period while degraded */

/* --- failure kinds ----------------------------------------------------------------- */

/* The failure kind of a backend call's negative result. */
int persist_failure_kind(int rc)
{
    switch (rc) {
    case -KVNODE_ETIMEDOUT: return PERSIST_FAIL_TIMEOUT;
    case -KVNODE_ENOSPC: return PERSIST_FAIL_NOSPACE;
    case -KVNODE_ECONNECT:
    case -KVNODE_ECLOSED: return PERSIST_FAIL_UNAVAILABLE;
    case -KVNODE_EPROTO: return PERSIST_FAIL_PROTOCOL;
    default: return PERSIST_FAIL_IO;
    }
}

/* --- state (loop thread) --------------------------------------------------------- */

void persist_health_arm(struct persist *p)
{
    struct timeval tv = { PERSIST_HEALTH_MS / 1000u, (PERSIST_HEALTH_MS % 1000u) * 1000 };
    if (!p->destroying && !event_pending(p->health_ev, EV_TIMEOUT, NULL))
        event_add(p->health_ev, &tv);
}

void persist_state_ok(struct persist *p, int op)
{
    if (op == PERSIST_OP_WRITE)
        p->writes_failing = false;
    else if (p->writes_failing)
        return;   /* the store answers, but the last write it got failed */
    p->last_error[0] = '\0';
    if (p->c.state == PERSIST_STATE_DEGRADED)
        log_info("persist: the %s store answers again", p->be->name);
    p->c.state = PERSIST_STATE_OK;
    event_del(p->health_ev);
}

void persist_state_failed(struct persist *p, int op, int rc, int kind, const char *err)
{
    p->c.failures[op][kind]++;
    snprintf(p->last_error, sizeof p->last_error, "%s: %s", persist_op_name(op),
             err && *err ? err : kvnode_strerror(rc));
    if (kind == PERSIST_FAIL_CORRUPT || rc == -KVNODE_EINVAL || rc == -KVNODE_ENOMEM)
        return;   /* not the store's health: see the header comment */
    if (op == PERSIST_OP_WRITE)
        p->writes_failing = true;
    if (p->c.state != PERSIST_STATE_DEGRADED)
        log_warn("persist: the %s store is degraded: %s", p->be->name, p->last_error);
    p->c.state = PERSIST_STATE_DEGRADED;
    persist_health_arm(p);
}

void persist_write_failures_settled(struct persist *p)
{
    if (!p || !p->writes_failing)
        return;
    p->writes_failing = false;
    persist_health_arm(p);   /* the next probe decides */
}

bool persist_writes_failing(const struct persist *p)
{
    return p && p->writes_failing;
}

void persist_set_write_probe(struct persist *p, persist_write_probe_fn fn, void *arg)
{
    p->write_probe = fn;
    p->write_probe_arg = arg;
}

void persist_probe_result(struct persist *p, int kind, int rc)
{
    if (rc < 0 || rc == KVS_CORRUPT)
        p->c.probes_failed[kind]++;
    else
        p->c.probes_ok[kind]++;
}

/* --- health probe (loop thread) --------------------------------------------------- */

void persist_health_cb(evutil_socket_t fd, short what, void *arg)
{
    struct persist *p = arg;

    (void)fd;
    (void)what;
    if (p->destroying || p->c.state != PERSIST_STATE_DEGRADED) {
        event_del(p->health_ev);
        return;
    }
    /* Writes fail: a block's write is the probe (a write, not the store's
     * health call, is what can end DEGRADED). None waits: the call decides. */
    if (p->writes_failing && p->write_probe) {
        if (p->write_probe(p->write_probe_arg))
            return;
        p->writes_failing = false;
    }
    if (p->health_busy)
        return;
    memset(&p->health, 0, sizeof p->health);
    p->health.job.run = persist_job_run;
    p->health.job.done = persist_job_done;
    p->health.p = p;
    p->health.op = PERSIST_OP_HEALTH;
    /* A full queue is traffic: its results update the state anyway. */
    if (workq_submit(p->q, &p->health.job) == 0)
        p->health_busy = true;
}

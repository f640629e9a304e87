/* kvnode-bench-kvs: the KVS front end (issue 18) next to libkvnode, same run,
 * same daemon, same traffic. For batches of 64 and 256 blocks of 64 KiB:
 *   - acquire/seal round trip: acquire(create) and seal (then release)
 *     through the front end, as rtp-llm's KVSClient does them (a fresh curl
 *     handle, i.e. a new TCP connection, per call); put_begin and put_commit
 *     through libkvnode;
 *   - write throughput: the whole store (reserve, copy into the shared
 *     mapping, commit) per batch;
 *   - read throughput: acquire(read) + copy out + release, against
 *     get_begin + copy out + get_end.
 * Prints median and p90 per step and MiB/s per batch size. Not a test: no
 * figure is asserted. --rounds N (default 20). */
#define BENCH_NAME "kvnode-bench-kvs"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "harness.h"
#include "kvs_client.h"

#define BB     (64u << 10)
#define DEP    "bench-model-0123456789abcdef"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void pct(uint64_t *v, size_t n, double *p50, double *p90)
{
    qsort(v, n, sizeof *v, cmp_u64);
    *p50 = (double)v[n / 2] / 1000.0;
    *p90 = (double)v[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1] / 1000.0;
}

struct figures {
    uint64_t *acq, *seal, *write, *read;   /* ns per round */
};

static double mibps(uint64_t *ns, size_t rounds, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < rounds; i++)
        total += ns[i];
    return (double)n * BB * rounds / (1 << 20) / ((double)total / 1e9);
}

static void kvs_round(const kvsc *c, size_t n, int round, uint8_t *src, uint8_t *dst, struct figures *f, size_t r)
{
    char **names = calloc(n, sizeof *names);
    for (size_t i = 0; i < n; i++) {
        names[i] = malloc(128);
        snprintf(names[i], 128, "rtp_llm/v1/" DEP "/tp-0/group-0/block-%" PRId64,
                 (int64_t)(n * 1000000 + (size_t)round * n + i));
    }
    const char *const *keys = (const char *const *)names;
    kvsc_reply rep;
    uint64_t t0 = kvh_now_ns();
    char *body = kvsc_acquire_body("create", keys, n, BB, 60);
    if (kvsc_call(c->url, "acquire", body, &rep) < 0 || rep.status != 200) {
        char m[512];
        snprintf(m, sizeof m, "status %ld: %.400s", rep.status,
                 json_string_value(json_object_get(rep.body, "error")) ?: "(no reply)");
        die("acquire(create)", m);
    }
    free(body);
    uint64_t t1 = kvh_now_ns();
    for (size_t i = 0; i < n; i++) {
        uint64_t off, sz;
        if (!kvsc_object(&rep, keys[i], &off, &sz))
            die("acquire(create)", "an object is missing");
        memcpy(c->base + off, src + i * BB, BB);
    }
    char lease[64];
    snprintf(lease, sizeof lease, "%s", kvsc_lease_id(&rep));
    kvsc_reply_free(&rep);
    uint64_t t2 = kvh_now_ns();
    if (kvsc_lease_call(c, "seal", lease) != 204)
        die("seal", "not 204");
    uint64_t t3 = kvh_now_ns();
    if (kvsc_lease_call(c, "release", lease) != 204)
        die("release", "not 204");
    uint64_t t4 = kvh_now_ns();
    f->acq[r] = t1 - t0;
    f->seal[r] = t3 - t2;
    f->write[r] = t4 - t0;
    size_t hits;
    uint8_t **outs = malloc(n * sizeof *outs);
    for (size_t i = 0; i < n; i++)
        outs[i] = dst + i * BB;
    uint64_t t5 = kvh_now_ns();
    if (kvsc_read(c, keys, n, outs, BB, 60, &hits, NULL) != 0 || hits != n)
        die("acquire(read)", "not every block");
    f->read[r] = kvh_now_ns() - t5;
    if (memcmp(src, dst, n * BB) != 0)
        die("read", "bytes differ");
    free(outs);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static void lib_round(kvnode_client *cl, size_t n, int round, uint8_t *src, uint8_t *dst, struct figures *f, size_t r)
{
    kvnode_key *keys = malloc(n * sizeof *keys);
    kvnode_loc *locs = malloc(n * sizeof *locs);
    kvnode_lease lease;
    size_t got;
    for (size_t i = 0; i < n; i++)
        keys[i] = (kvnode_key)(n * 2000000 + (size_t)round * n + i);
    uint64_t t0 = kvh_now_ns();
    check(cl, kvnode_put_begin(cl, keys, n, KVNODE_TIER_HOST, &lease, locs), "put_begin");
    uint64_t t1 = kvh_now_ns();
    for (size_t i = 0; i < n; i++)
        memcpy(locs[i].ptr, src + i * BB, BB);
    uint64_t t2 = kvh_now_ns();
    check(cl, kvnode_put_commit(cl, lease), "put_commit");
    uint64_t t3 = kvh_now_ns();
    f->acq[r] = t1 - t0;
    f->seal[r] = t3 - t2;
    f->write[r] = t3 - t0;
    uint64_t t4 = kvh_now_ns();
    check(cl, kvnode_get_begin(cl, keys, n, &lease, locs, &got), "get_begin");
    if (got != n)
        die("get_begin", "short prefix");
    for (size_t i = 0; i < n; i++)
        memcpy(dst + i * BB, locs[i].ptr, BB);
    check(cl, kvnode_get_end(cl, lease), "get_end");
    f->read[r] = kvh_now_ns() - t4;
    if (memcmp(src, dst, n * BB) != 0)
        die("read", "bytes differ");
    free(keys);
    free(locs);
}

int main(int argc, char **argv)
{
    size_t rounds = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--quick") == 0)
            rounds = 5;
        else
            die("usage", "kvnode-bench-kvs [--rounds N] [--quick]");
    }
    if (rounds < 2)
        rounds = 2;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char dir[PATH_MAX], conf[PATH_MAX + 256], why[256];
    if (kvh_mkdtemp(dir, sizeof dir) != 0)
        die("mkdtemp", kvh_error());
    size_t need = 2 * rounds * (64 + 256) * (size_t)BB;   /* both doors keep what they wrote */
    snprintf(conf, sizeof conf, "memory.host_bytes=%zuMiB\nkvs_server.enabled=on\nkvs_server.listen=127.0.0.1:0\n"
             "kvs_server.socket_path=%s/kvs.sock\nlog.level=warn\n", (need >> 20) + 128, dir);
    kvh_daemon d;
    if (kvh_start(&d, conf) != 0)
        die("start kvnoded", kvh_error());
    json_t *st = kvh_stats(&d);
    const char *addr = st ? json_string_value(kvh_json_get(st, "kvs_server.http_address")) : NULL;
    if (!addr)
        die("stats", "no kvs_server.http_address");
    char url[128], sock[PATH_MAX + 16];
    snprintf(url, sizeof url, "http://%s", addr);
    json_decref(st);
    snprintf(sock, sizeof sock, "%s/kvs.sock", dir);
    kvsc c;
    if (kvsc_open(&c, url, sock, why, sizeof why) != 0)
        die("kvs handshake", why);
    kvnode_layout l = { .model = DEP, .dtype = "rtp_llm_group_block_v1", .block_tokens = 1, .block_bytes = BB,
                        .num_layers = 1, .kv_heads = 1, .head_dim = 1, .tp_size = 1, .tp_rank = 0,
                        .extra = "kvs_deployment_id=" DEP ";kvs_object_ns=rtp_llm;kvs_version=1;kvs_group=0" };
    kvnode_client *cl;
    if (kvh_connect(&d, &l, &cl) != 0)
        die("kvnode_connect", kvh_error());

    printf("kvnode-bench-kvs: %zu rounds per batch size, blocks of 64 KiB, one daemon, one namespace\n", rounds);
    printf("%-9s %6s  %10s %10s  %10s %10s  %10s %10s\n", "door", "blocks", "acq p50ms", "acq p90ms",
           "seal p50ms", "seal p90ms", "write MiB/s", "read MiB/s");
    static const size_t sizes[2] = { 64, 256 };
    for (int s = 0; s < 2; s++) {
        size_t n = sizes[s];
        uint8_t *src = malloc(n * BB), *dst = malloc(n * BB);
        for (size_t i = 0; i < n * BB; i++)
            src[i] = (uint8_t)(i * 131 + n);
        struct figures fk = { calloc(rounds, 8), calloc(rounds, 8), calloc(rounds, 8), calloc(rounds, 8) };
        struct figures fl = { calloc(rounds, 8), calloc(rounds, 8), calloc(rounds, 8), calloc(rounds, 8) };
        for (size_t r = 0; r < rounds; r++) {   /* interleaved: the same conditions for both */
            kvs_round(&c, n, (int)r, src, dst, &fk, r);
            lib_round(cl, n, (int)r, src, dst, &fl, r);
        }
        struct figures *fs[2] = { &fk, &fl };
        const char *names[2] = { "kvs", "libkvnode" };
        for (int k = 0; k < 2; k++) {
            double a50, a90, s50, s90;
            double w = mibps(fs[k]->write, rounds, n), rd = mibps(fs[k]->read, rounds, n);
            pct(fs[k]->acq, rounds, &a50, &a90);
            pct(fs[k]->seal, rounds, &s50, &s90);
            printf("%-9s %6zu  %10.3f %10.3f  %10.3f %10.3f  %10.0f %10.0f\n", names[k], n, a50 / 1000.0,
                   a90 / 1000.0, s50 / 1000.0, s90 / 1000.0, w, rd);
            free(fs[k]->acq);
            free(fs[k]->seal);
            free(fs[k]->write);
            free(fs[k]->read);
        }
        free(src);
        free(dst);
    }
    kvnode_close(cl);
    kvsc_close(&c);
    int rc = kvh_stop(&d, 0);
    kvh_destroy(&d);
    return rc == 0 ? 0 : 1;
}

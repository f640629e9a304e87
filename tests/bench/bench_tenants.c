/* What a tenant costs (issue 15): the idle daemon's memory, threads and
 * descriptors with 0, 1 and 16 small tenants (no store, and the file store),
 * and the time of kvnode_connect (socket, HELLO, mapping the lent arena) with
 * 0, 1 and 16 tenants, this process's uid listed by the last section (the
 * worst case of tenants_for_peer). Prints figures; asserts nothing.
 *
 *   KVNODED=build/kvnoded build/kvnode-bench-tenants [--quick]
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define TENANT_BYTES "4MiB"
#define HOST_BYTES   "68MiB"   /* room for 16 tenants of 4 MiB and a default */

static int count_fds(pid_t pid)
{
    char path[64];
    int n = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* A config with ntenants sections of TENANT_BYTES each; the last one lists
 * this process's uid, the others uids nobody runs as. */
static void tenants_config(char *buf, size_t len, int ntenants, const char *extra)
{
    size_t o = (size_t)snprintf(buf, len, "memory.host_bytes=" HOST_BYTES "\nmemory.slab_bytes=1MiB\n%s", extra);
    for (int i = 0; i < ntenants && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "tenant.t%d.uids=%u\ntenant.t%d.host_bytes=" TENANT_BYTES "\n", i,
                              i == ntenants - 1 ? (unsigned)getuid() : 50000u + (unsigned)i, i);
}

static void start_or_die(kvh_daemon *d, const char *conf)
{
    if (kvh_start(d, conf) != 0) {
        fprintf(stderr, "bench-tenants: kvnoded did not start: %s\n", kvh_error());
        exit(1);
    }
}

static void idle_footprint(int ntenants, const char *persist)
{
    char conf[8192];
    kvh_daemon d;

    tenants_config(conf, sizeof conf, ntenants, persist);
    start_or_die(&d, conf);
    kvh_sleep_ms(1000);   /* recovery scans and pinning settle */
    printf("tenants %2d, %-10s: RSS %6lld KiB (anon %5lld KiB), threads %3lld, descriptors %3d\n", ntenants,
           *persist ? "file store" : "no store", kvh_proc_status_kib(d.pid, "VmRSS"),
           kvh_proc_status_kib(d.pid, "RssAnon"), kvh_proc_status_kib(d.pid, "Threads"), count_fds(d.pid));
    kvh_stop(&d, 5000);
    kvh_destroy(&d);
}

/* Mean microseconds of one connect + HELLO (+ map, with a layout) + close. */
static double connect_us(const kvh_daemon *d, const kvnode_layout *layout, int rounds)
{
    uint64_t t0 = kvh_now_ns();
    for (int i = 0; i < rounds; i++) {
        kvnode_client *c;
        if (kvnode_connect(d->sock, layout, &c) != 0) {
            fprintf(stderr, "bench-tenants: connect: %s\n", kvnode_connect_error());
            exit(1);
        }
        kvnode_close(c);
    }
    return (double)(kvh_now_ns() - t0) / rounds / 1000.0;
}

/* The three daemons run side by side and are measured in turns, so that
 * the machine's drift falls on all of them alike. */
static void connect_times(int rounds, int reps)
{
    static const int counts[3] = { 0, 1, 16 };
    kvh_daemon d[3];
    double observer[3] = { 0 }, bound[3] = { 0 };
    kvnode_layout layout = kvh_layout("bench-tenants", 64 * 1024, 1, 0);
    char conf[8192];

    for (int k = 0; k < 3; k++) {
        tenants_config(conf, sizeof conf, counts[k], "");
        start_or_die(&d[k], conf);
        connect_us(&d[k], &layout, rounds / 10 + 1);   /* warm up */
    }
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 3; k++) {
            observer[k] += connect_us(&d[k], NULL, rounds);
            bound[k] += connect_us(&d[k], &layout, rounds);
        }
    for (int k = 0; k < 3; k++)
        printf("tenants %2d: connect + HELLO %.1f us (observer), connect + HELLO + map %.1f us "
               "(arena of %s; mean of %d x %d)\n",
               counts[k], observer[k] / reps, bound[k] / reps, counts[k] ? TENANT_BYTES : HOST_BYTES, reps,
               rounds);
    for (int k = 0; k < 3; k++) {
        kvh_stop(&d[k], 5000);
        kvh_destroy(&d[k]);
    }
}

int main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    char store[PATH_MAX], persist[PATH_MAX + 64];

    if (argc > 1 && !quick) {
        fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
        return 2;
    }
    connect_times(quick ? 200 : 2000, quick ? 1 : 5);
    for (int n = 0; n <= 16; n += n ? 15 : 1)
        idle_footprint(n, "");
    if (kvh_mkdtemp(store, sizeof store) != 0) {
        fprintf(stderr, "bench-tenants: cannot make a store directory\n");
        return 1;
    }
    snprintf(persist, sizeof persist, "persist.backend=file\npersist.path=%s\n", store);
    for (int n = 0; n <= 16; n += n ? 15 : 1)
        idle_footprint(n, persist);
    return 0;
}

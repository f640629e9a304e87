/* Start-up of a large host tier (issue 16): for host tiers of 1, 4 and
 * 8 GiB (--sizes to change; never more than the machine can spare), the time
 * from exec of kvnoded to the first PING answered and to
 * tiers.host.populate_state "done", next to a bare memfd fallocate and a
 * mmap(MAP_POPULATE) of it, of the same size, measured in the same run.
 * --huge-pages runs every size again with memory.huge_pages = on (the bare
 * reservation then uses MFD_HUGETLB too); when the hugetlb pool has too few
 * free 2 MiB pages, the bench (as root) raises vm.nr_hugepages for the run
 * and puts it back afterwards. Prints figures; asserts nothing. Not part of
 * `make test`. A warm-up bare pass runs before each measured one (see one_size).
 *
 *   KVNODED=build/kvnoded build/kvnode-bench-startup [--sizes 1,4,8] [--huge-pages]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define GIB (1024ull * 1024ull * 1024ull)
#define HUGE_2M (2ull * 1024ull * 1024ull)
#define NR_HUGEPAGES "/proc/sys/vm/nr_hugepages"

/* Seconds of memfd_create + fallocate of bytes, then of mmap(MAP_POPULATE)
 * of it (the daemon's start-up before issue 16). */
static void bare_populate_s(uint64_t bytes, bool huge, double *fallocate_s, double *map_s)
{
    uint64_t t0 = kvh_now_ns();
    int fd = memfd_create("bench-startup", MFD_CLOEXEC | (huge ? MFD_HUGETLB : 0));
    if (fd < 0 || fallocate(fd, 0, 0, (off_t)bytes) != 0) {
        fprintf(stderr, "bench-startup: bare fallocate of %llu bytes: %s\n", (unsigned long long)bytes,
                strerror(errno));
        exit(1);
    }
    uint64_t t1 = kvh_now_ns();
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "bench-startup: mmap: %s\n", strerror(errno));
        exit(1);
    }
    *fallocate_s = (double)(t1 - t0) / 1e9;
    *map_s = (double)(kvh_now_ns() - t1) / 1e9;
    munmap(p, bytes);
    close(fd);
}

static long read_long(const char *path, const char *key)
{
    char line[256];
    long v = -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (!key) {
            v = strtol(line, NULL, 10);
            break;
        }
        if (strncmp(line, key, strlen(key)) == 0) {
            v = strtol(line + strlen(key), NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static bool write_long(const char *path, long v)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    bool ok = fprintf(f, "%ld\n", v) > 0;
    return fclose(f) == 0 && ok;
}

static const char *populate_state(const kvh_daemon *d, long long *reserved)
{
    static char state[16];
    json_t *st = kvh_stats(d);
    const char *s = st ? json_string_value(kvh_json_get(st, "tiers.host.populate_state")) : NULL;
    snprintf(state, sizeof state, "%s", s ? s : "?");
    *reserved = st ? kvh_json_int(st, "tiers.host.reserved_bytes") : -1;
    json_decref(st);
    return state;
}

static void one_size(unsigned gib, bool huge)
{
    char conf[256];
    kvh_daemon d;
    uint64_t bytes = (uint64_t)gib * GIB;

    snprintf(conf, sizeof conf, "memory.host_bytes=%uGiB\nmemory.huge_pages=%s\n", gib,
             huge ? "on" : "off");
    /* In a VM the first touch of guest memory also pays the hypervisor's
     * allocation, and whichever runs first pays it (measured here: 2.2 s
     * against 0.11 s for the same 1 GiB hugetlb fallocate). An unmeasured
     * bare pass first, so the measured bare pass and the daemon both find
     * the memory warm. */
    double fall_s, map_s;
    bare_populate_s(bytes, huge, &fall_s, &map_s);
    bare_populate_s(bytes, huge, &fall_s, &map_s);

    uint64_t t0 = kvh_now_ns();
    if (kvh_spawn(&d, conf) != 0) {
        fprintf(stderr, "bench-startup: spawn: %s\n", kvh_error());
        exit(1);
    }
    /* Poll: connect as an observer and PING, every millisecond. */
    double ping_s = -1;
    kvnode_client *c = NULL;
    while ((double)(kvh_now_ns() - t0) / 1e9 < 120) {
        if (kvnode_connect(d.sock, NULL, &c) == 0) {
            if (kvnode_ping(c) == 0) {
                ping_s = (double)(kvh_now_ns() - t0) / 1e9;
                break;
            }
            kvnode_close(c);
            c = NULL;
        }
        kvh_sleep_ms(1);
    }
    if (c)
        kvnode_close(c);
    if (ping_s < 0) {
        kvh_print_log(&d, "no PING answered");
        exit(1);
    }
    long long reserved = 0;
    const char *state = "?";
    while ((double)(kvh_now_ns() - t0) / 1e9 < 300 &&
           strcmp(state = populate_state(&d, &reserved), "running") == 0)
        kvh_sleep_ms(50);
    double done_s = (double)(kvh_now_ns() - t0) / 1e9;
    kvh_stop(&d, 10000);
    kvh_destroy(&d);

    printf("host tier %2u GiB, %-10s: first PING %6.3f s; population %-6s %6.2f s from exec "
           "(%lld bytes); bare: fallocate %5.2f s + MAP_POPULATE %5.2f s = %5.2f s\n", gib,
           huge ? "huge pages" : "4 KiB pages", ping_s, state, done_s, reserved, fall_s, map_s,
           fall_s + map_s);
    fflush(stdout);
}

/* One size on 2 MiB hugetlb pages: the daemon's arena and the bare
 * reservation each need the whole size free in the pool (one after the
 * other). Raises the pool for the run when it is short, then restores it. */
static void huge_size(unsigned gib)
{
    long need = (long)((uint64_t)gib * GIB / HUGE_2M);
    long free_pages = read_long("/proc/meminfo", "HugePages_Free:");
    long nr = read_long(NR_HUGEPAGES, NULL);
    long raised = -1;

    if (free_pages < need) {
        if (nr < 0 || !write_long(NR_HUGEPAGES, nr + (need - free_pages)) ||
            read_long("/proc/meminfo", "HugePages_Free:") < need) {
            printf("host tier %2u GiB, huge pages: skipped: the hugetlb pool has %ld free 2 MiB pages "
                   "and %ld are needed (reserve them: sysctl vm.nr_hugepages=%ld, as root)\n", gib,
                   free_pages, need, (nr > 0 ? nr : 0) + need - (free_pages > 0 ? free_pages : 0));
            if (nr >= 0)
                write_long(NR_HUGEPAGES, nr);
            return;
        }
        raised = nr;
    }
    one_size(gib, true);
    if (raised >= 0 && !write_long(NR_HUGEPAGES, raised))
        fprintf(stderr, "bench-startup: could not put vm.nr_hugepages back to %ld\n", raised);
}

int main(int argc, char **argv)
{
    const char *sizes = "1,4,8";
    bool huge = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            sizes = argv[++i];
        } else if (strcmp(argv[i], "--huge-pages") == 0) {
            huge = true;
        } else {
            fprintf(stderr, "usage: %s [--sizes 1,4,8] [--huge-pages]   (GiB of host tier, each at "
                    "most 64)\n", argv[0]);
            return 2;
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("bench-startup: %ld cores; kvnoded %s; populate threads min(cores/4, 8) = %ld\n", cores,
           kvh_daemon_path(), cores / 4 < 1 ? 1 : cores / 4 > 8 ? 8 : cores / 4);
    for (const char *p = sizes; *p;) {
        char *end;
        unsigned long g = strtoul(p, &end, 10);
        if (end == p || g == 0 || g > 64) {
            fprintf(stderr, "bench-startup: bad size list '%s'\n", sizes);
            return 2;
        }
        one_size((unsigned)g, false);
        if (huge)
            huge_size((unsigned)g);
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

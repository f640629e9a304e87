/* Start-up of a large host tier (issue 16): for host tiers of 1, 4 and
 * 8 GiB (--sizes to change; never more than the machine can spare), the time
 * from exec of kvnoded to the first PING answered and to
 * tiers.host.populate_state "done", next to a bare fallocate + mmap
 * (MAP_POPULATE) of a memfd of the same size measured in the same run.
 * Prints figures; asserts nothing. Not part of `make test`.
 *
 *   KVNODED=build/kvnoded build/kvnode-bench-startup [--sizes 1,4,8]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define GIB (1024ull * 1024ull * 1024ull)

/* Seconds of memfd_create + fallocate + mmap(MAP_POPULATE) of bytes. */
static double bare_populate_s(uint64_t bytes)
{
    uint64_t t0 = kvh_now_ns();
    int fd = memfd_create("bench-startup", MFD_CLOEXEC);
    if (fd < 0 || fallocate(fd, 0, 0, (off_t)bytes) != 0) {
        fprintf(stderr, "bench-startup: bare fallocate of %llu bytes: %s\n", (unsigned long long)bytes,
                strerror(errno));
        exit(1);
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "bench-startup: mmap: %s\n", strerror(errno));
        exit(1);
    }
    double s = (double)(kvh_now_ns() - t0) / 1e9;
    munmap(p, bytes);
    close(fd);
    return s;
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

static void one_size(unsigned gib)
{
    char conf[256];
    kvh_daemon d;
    uint64_t bytes = (uint64_t)gib * GIB;

    snprintf(conf, sizeof conf, "memory.host_bytes=%uGiB\n", gib);
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

    double bare_s = bare_populate_s(bytes);
    printf("host tier %2u GiB: first PING %6.3f s; population %-6s %7.2f s from exec (%lld bytes); "
           "bare fallocate + MAP_POPULATE %6.2f s\n", gib, ping_s, state, done_s, reserved, bare_s);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *sizes = "1,4,8";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            sizes = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--sizes 1,4,8]   (GiB of host tier, each at most 64)\n", argv[0]);
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
        one_size((unsigned)g);
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* index_table: one table of entry ids in cache-line groups. See index_table.h. */
#include "mem/index_table.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>

uint64_t itab_random_seed(void)
{
    uint64_t s;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) == (ssize_t)sizeof s)
        return s;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return itab_mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40));
}

int itab_init(struct itab *t, size_t groups)
{
    /* calloc, not aligned_alloc + memset: a big table comes from fresh
     * zero pages, so growing is not an O(n) pass on the loop thread. */
    void *mem = calloc(groups * sizeof(struct itab_group) + 64, 1);
    if (!mem)
        return -1;
    t->mem = mem;
    t->g = (struct itab_group *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    t->mask = groups - 1;
    return 0;
}

void itab_free(struct itab *t)
{
    free(t->mem);
    t->mem = NULL;
    t->g = NULL;
    t->mask = 0;
}

/* prefault: populate a process's page tables for mapped ranges on a
 * background thread (kvnode_prefault). Knows nothing of clients: it is given
 * ranges that stay mapped until prefault_stop returns. */
#ifndef KVNODE_PREFAULT_H
#define KVNODE_PREFAULT_H

#include <stddef.h>
#include <stdint.h>

struct prefault;

struct prefault_range {
    void *base;
    uint64_t size;
};

enum {
    PREFAULT_WRITE = 1u << 0,   /* populate writable (the mapping must be PROT_WRITE) */
    PREFAULT_WAIT  = 1u << 1,   /* walk on the calling thread, return when done */
    PREFAULT_TOUCH = 1u << 2,   /* touch pages even where MADV_POPULATE_* exists (tests) */
};
/* Start the walk over ranges[0..n) (copied) with PREFAULT_* flags. NULL with
 * errno set when the thread cannot be made. */
struct prefault *prefault_start(const struct prefault_range *ranges, size_t n, unsigned flags);
/* 1: ended, 0: running, -1: stopped on an error (prefault_error says which). */
int prefault_state(const struct prefault *p, uint64_t *done, uint64_t *total);
const char *prefault_error(const struct prefault *p);
/* Wait until the walk has ended (or failed). */
void prefault_join(struct prefault *p);
/* Ask the walk to stop after its current chunk, join it and free p. */
void prefault_stop(struct prefault *p);

#endif

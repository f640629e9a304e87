/* keylock: per-key ordering of the store operations that change a key.
 *
 * The persistence pool runs requests on several workers, so two requests
 * for one key (a write, then a delete, then the re-put's write) could land
 * in any order, and a late one could remove or overwrite a newer copy. The
 * cache takes a key's lock before it hands a write or a delete of that key
 * to the store and releases it when the request's result is back: the next
 * waiter (FIFO) is then started. A table entry exists only while a key is
 * held, so its size is bounded by the store requests in flight and queued.
 *
 * Waiters are the caller's (embedded in its request record); a waiter's
 * start(w) runs from keylock_release, on the loop, when its turn comes: it
 * then holds the key and must release it once, like a direct acquirer.
 *
 * Loop thread only. */
#ifndef KVNODE_KEYLOCK_H
#define KVNODE_KEYLOCK_H

#include <stddef.h>
#include <stdint.h>

struct keylock_waiter {
    void (*start)(struct keylock_waiter *w);
    struct keylock_waiter *next;
};

struct keylock;

int  keylock_create(struct keylock **out);
/* Frees the table; waiters still queued are not started. */
void keylock_destroy(struct keylock *t);
/* 1: the key is now held by the caller; 0: w is queued behind the holder
 * (w->start runs when its turn comes), or, with w NULL, the key is held by
 * someone else and nothing was queued; -KVNODE_ENOMEM. */
int  keylock_acquire(struct keylock *t, uint32_t ns, int64_t key, struct keylock_waiter *w);
/* The holder is done: the next waiter (if any) now holds the key and is
 * started; otherwise the key is free. */
void keylock_release(struct keylock *t, uint32_t ns, int64_t key);
/* Keys held now. */
size_t keylock_held(const struct keylock *t);

#endif

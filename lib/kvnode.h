/* libkvnode — client API of kvnoded, the node-local KV-cache daemon.
 *
 * An engine process connects once per TP rank with its layout, then asks how
 * long a prefix of block keys is cached (match), reads blocks in place under a
 * read lease (get_begin / get_end), and writes new blocks in place under a
 * write lease (put_begin / put_commit or put_abort). kvnode_get / kvnode_put
 * are copying conveniences over those pairs; kvnode_get_inline /
 * kvnode_put_inline move the bytes inside the messages instead, for callers
 * that cannot map the daemon's memory.
 *
 * The keys of one call form a chain: keys[i-1] is the parent of keys[i].
 * match and get answer with the longest cached prefix.
 *
 * Threading: every call on a client may be made from any number of threads
 * at once (requests from different threads are pipelined over the one
 * connection and matched to their replies by id), except kvnode_close,
 * kvnode_prefault and kvnode_pin_host, which the caller must not overlap
 * with other calls on that client. kvnode_last_error gives each thread the
 * message of its own last failed call. A client used only synchronously has
 * no thread of its own (a waiting caller reads the socket), unless it was
 * lent real GPU memory; the first asynchronous MATCH/DELETE (or a connect
 * that was lent real GPU memory) starts its I/O thread and the first
 * asynchronous GET/PUT its batch thread; they block every signal. After
 * fork(), only the parent may use a client.
 *
 * Asynchronous calls: kvnode_submit_* send a batch and return at once with a
 * ticket; its completion is collected with kvnode_drain, without blocking,
 * when kvnode_event_fd polls readable (see "Asynchronous calls" below).
 *
 * Errors: every function returning int returns 0 on success or a negative
 * KVNODE_E* code; kvnode_strerror() names the code and kvnode_last_error()
 * gives the daemon's (or library's) message for the last failed call.
 * Every call that talks to the daemon has a timeout (default 10 s,
 * environment KVNODE_TIMEOUT_MS, or kvnode_set_timeout()).
 */
#ifndef KVNODE_H
#define KVNODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int64_t  kvnode_key;
typedef uint64_t kvnode_lease;
typedef struct kvnode_client kvnode_client;

typedef struct kvnode_layout {
    const char *model, *dtype;          /* e.g. "qwen2-7b", "bf16" */
    uint32_t block_tokens;              /* tokens per block */
    uint64_t block_bytes;               /* bytes of one block held by this rank */
    uint32_t num_layers, kv_heads, head_dim, tp_size, tp_rank;
    const char *extra;                  /* free-form layout discriminator, may be NULL */
} kvnode_layout;

enum { KVNODE_TIER_HOST = 1, KVNODE_TIER_HBM = 2 };

/* Where a block is, in this process's address space. tier KVNODE_TIER_HOST:
 * ptr is host memory (device -1). tier KVNODE_TIER_HBM: the block is in the
 * GPU memory of CUDA device `device`; ptr is a device pointer (GPU memory
 * lent as a CUDA VMM fd or a CUDA IPC handle: never dereference it on the
 * CPU, use cudaMemcpyAsync or kernels) or, when the daemon simulates its
 * GPUs, a host mapping. A device pointer is valid until its lease ends and
 * never after the connection ends (see kvnode_connect_device). */
typedef struct kvnode_loc { void *ptr; int tier; int device; } kvnode_loc;

/* Error codes (negated on return). Stable: they travel on the wire. */
enum {
    KVNODE_OK = 0,
    KVNODE_EINVAL    = 1,  /* invalid argument or request */
    KVNODE_ENOMEM    = 2,  /* out of memory (process) */
    KVNODE_ENOSPC    = 3,  /* tier full: nothing evictable */
    KVNODE_ENOLEASE  = 4,  /* unknown, expired or foreign lease */
    KVNODE_ELAYOUT   = 5,  /* layout invalid or conflicts with a registered one */
    KVNODE_EVERSION  = 6,  /* no common protocol version */
    KVNODE_EPROTO    = 7,  /* malformed frame or message */
    KVNODE_ETOOBIG   = 8,  /* frame, key count or block over a limit */
    KVNODE_ETIMEDOUT = 9,  /* the call's timeout passed */
    KVNODE_ECONNECT  = 10, /* cannot connect to the daemon */
    KVNODE_ECLOSED   = 11, /* the daemon closed the connection */
    KVNODE_EIO       = 12, /* system call failed */
    KVNODE_ESTATE    = 13, /* operation not valid now (e.g. before HELLO) */
    KVNODE_ELIMIT    = 14, /* a per-client limit was reached */
    KVNODE_EDENIED   = 15, /* refused by access control */
    KVNODE_EINTERNAL = 16, /* daemon bug: please report */
    KVNODE_ESHUTDOWN = 17, /* daemon is shutting down */
};

/* Connect to the daemon at socket_path (NULL: $KVNODE_SOCKET or
 * /run/kvnode/kvnode.sock) and bind this client to the namespace of `layout`.
 * layout == NULL gives an observer client that may only call
 * kvnode_stats_json / kvnode_ping / kvnode_reload. On failure *out is NULL.
 * kvnode_connect declares the CUDA device named by $KVNODE_CUDA_DEVICE (a
 * device ordinal, or -1 for none; unset or empty: none; any other value
 * fails with -KVNODE_EINVAL), as kvnode_connect_device does. */
int  kvnode_connect(const char *socket_path, const kvnode_layout *layout, kvnode_client **out);
/* kvnode_connect declaring the engine's CUDA device (-1: none; ignored for
 * observers). With a device, the daemon lends this client GPU memory
 * (KVNODE_TIER_HBM) and puts to KVNODE_TIER_HBM land on that device. Real GPU
 * memory needs a CUDA runtime in this process (libcudart, found at run time:
 * the engine's own when loaded); without one only simulated GPU memory (host
 * memory) is lent. It comes as a CUDA VMM allocation's file descriptor when
 * the driver (libcuda.so.1) has the VMM calls (CUDA >= 10.2), which works
 * from any PID namespace (engines in containers), else as a legacy CUDA IPC
 * handle, which needs the daemon's PID namespace.
 *
 * GPU memory that cannot be mapped here (IPC across PID namespaces, a MIG
 * instance, a driver that refuses...) does not fail the connect: the client
 * connects again without GPU memory, telling the daemon why, and succeeds
 * host-only; kvnode_last_error(c) then says "HBM unusable (<reason>);
 * connected host-only" (else it is "").
 *
 * A client lent GPU memory runs a thread of its own from the connect on,
 * which sees the end of the connection (the daemon stopping, dying, a
 * protocol error, kvnode_cancel) while the engine is idle and then releases
 * that memory at once (IPC close / VMM unmap; the daemon can free it): from
 * then on every KVNODE_TIER_HBM pointer of the client is invalid, and the
 * engine's GPU work must not use one. A daemon that stops tells its clients
 * first (calls in flight fail with -KVNODE_ESHUTDOWN, "daemon stopping"). */
int  kvnode_connect_device(const char *socket_path, const kvnode_layout *layout, int cuda_device,
                           kvnode_client **out);
/* Flags of kvnode_connect_flags. */
enum {
    /* The client only reads (match, get). The daemon lends it host memory
     * (and simulated GPU memory) through read-only descriptors, mapped
     * PROT_READ here: a write to a lent block faults (SIGSEGV) and the
     * mapping cannot be made writable (mprotect fails with EACCES). Its
     * put_begin, put_inline, put and delete fail with -KVNODE_EDENIED. Real
     * GPU memory (a VMM fd or a CUDA IPC handle) has no read-only form: a
     * reader with a CUDA device gets it read-write, as every client of its
     * tenant does. kvnode_pin_host pins a reader's read-only mapping with
     * cudaHostRegisterReadOnly.
     * Ignored for observers. */
    KVNODE_CONNECT_READER = 1u << 0,
    /* Start kvnode_prefault(c, 0) when the connect succeeds (see there). */
    KVNODE_CONNECT_PREFAULT = 1u << 1,
    /* A synchronous call spins for its reply (polling the socket without
     * sleeping) for up to 50 us, or $KVNODE_BUSY_POLL_US, before it sleeps
     * in poll(). It pays where a wakeup costs more than the round trip
     * (virtual machines: tens of us per wakeup) and the engine thread
     * would only wait anyway; it costs the CPU it spins on. Off by
     * default. $KVNODE_BUSY_POLL_US (1..10000) sets the bound for every
     * client of the process, with or without the flag; 0 turns it off. */
    KVNODE_CONNECT_BUSY_POLL = 1u << 2,
};
/* kvnode_connect_device with flags (KVNODE_CONNECT_*; 0: as
 * kvnode_connect_device). Unknown flags fail with -KVNODE_EINVAL. A daemon
 * older than a flag ignores it: kvnode_is_reader() says whether
 * KVNODE_CONNECT_READER was granted. A reader is refused with -KVNODE_EIO
 * when the daemon could not make a read-only descriptor of its memory at
 * start (its log says why). */
int  kvnode_connect_flags(const char *socket_path, const kvnode_layout *layout, int cuda_device,
                          unsigned flags, kvnode_client **out);
/* 1 when the daemon holds this client to reading (KVNODE_CONNECT_READER was
 * asked for and granted), else 0. */
int  kvnode_is_reader(const kvnode_client *c);
/* The spin bound of this client's synchronous calls in us (0: none; see
 * KVNODE_CONNECT_BUSY_POLL). */
unsigned kvnode_busy_poll_us(const kvnode_client *c);
/* Message of the last failed kvnode_connect on this thread ("" when none). */
const char *kvnode_connect_error(void);
void kvnode_close(kvnode_client *c);
/* Bytes of one block of this client's namespace (0 for an observer). */
uint64_t kvnode_block_bytes(const kvnode_client *c);
/* The CUDA device this client declared (-1: none). */
int  kvnode_cuda_device(const kvnode_client *c);
/* Page-lock this process's mapping of the host arena for the GPU
 * (cudaHostRegister, portable, on the client's CUDA device when it declared
 * one; read-only for a reader, whose mapping is), so the engine's copies
 * between GPU and host blocks are direct DMA.
 * Idempotent; kvnode_close unregisters. May take seconds for a large arena.
 * -KVNODE_ESTATE without a CUDA runtime ("no CUDA runtime (libcudart not
 * found ...)") or without a host arena; -KVNODE_EIO when CUDA refuses. */
int  kvnode_pin_host(kvnode_client *c);

/* Flags of kvnode_prefault. */
enum {
    /* Return only when the population has ended (else it runs on a
     * background thread and kvnode_prefault returns at once). */
    KVNODE_PREFAULT_WAIT = 1u << 0,
};
/* Populate this process's page tables for its mapping of the host arena, so
 * that the engine's first gets and puts over it take no page faults: a
 * thread owned by the client walks the arena in chunks with
 * MADV_POPULATE_WRITE (MADV_POPULATE_READ for a reader), or reads one byte
 * per page where the kernel lacks them (before Linux 5.14). Costs the RSS of
 * the whole mapping and a core for the walk (about a second per few GiB).
 * GPU memory (KVNODE_TIER_HBM) is not populated. kvnode_close stops the walk
 * between chunks. Starting it again while it runs, or after it ended, is a
 * no-op returning 0. May be called from any thread with the client's other
 * calls serialised as usual; the walk itself touches no client state but
 * the mappings. -KVNODE_ESTATE without a host arena (observer, or inline-only
 * client); -KVNODE_EINVAL for unknown flags; -KVNODE_EIO when the thread
 * cannot be started or (with KVNODE_PREFAULT_WAIT) the walk failed. */
int  kvnode_prefault(kvnode_client *c, unsigned flags);
/* Progress of kvnode_prefault: *done and *total bytes (either may be NULL).
 * Returns 1 when the walk has ended (done == total), 0 while it runs or when
 * it was never started (total is then 0), -KVNODE_EIO when it stopped on an
 * error (kvnode_last_error is not touched: the message is given by
 * kvnode_prefault with KVNODE_PREFAULT_WAIT). Talks to no daemon: may run on
 * another thread beside the client's calls, except kvnode_prefault and
 * kvnode_close. */
int  kvnode_prefault_progress(const kvnode_client *c, uint64_t *done, uint64_t *total);

/* *matched = length of the longest cached prefix of keys[0..n), counting
 * blocks in every tier (GPU memory, host memory, the persistent store). */
int  kvnode_match(kvnode_client *c, const kvnode_key *keys, size_t n, size_t *matched);

/* How a matched prefix is spread over the tiers. */
typedef struct kvnode_tiers {
    size_t matched;   /* hbm + host + store */
    size_t hbm;       /* in GPU memory */
    size_t host;      /* in host memory */
    size_t store;     /* only in the persistent store: a get brings them back first (slower) */
} kvnode_tiers;
/* kvnode_match that also tells where the matched blocks are. */
int  kvnode_match_tiers(kvnode_client *c, const kvnode_key *keys, size_t n, kvnode_tiers *out);

/* Who else holds the prefix: the local answer (as kvnode_match) plus up to
 * max_hosts peer nodes with their matched counts, asked of the KV Cache
 * Manager within the daemon's query deadline. KVCM trouble never fails the
 * call: remote_ok is then 0, why says what happened and only the local
 * answer is there. max_hosts 0: the daemon's default. */
#define KVNODE_MAX_PEERS 64
typedef struct kvnode_peer {
    char   host_ip_port[128];
    size_t matched;
} kvnode_peer;
typedef struct kvnode_remote_match {
    size_t matched;                      /* local, every tier */
    int    remote_ok;                    /* 1: the peers were asked and answered */
    char   why[192];                     /* when remote_ok is 0 */
    size_t npeers;
    kvnode_peer peers[KVNODE_MAX_PEERS]; /* best first; this node is not among them */
} kvnode_remote_match;
int  kvnode_match_remote(kvnode_client *c, const kvnode_key *keys, size_t n, size_t max_hosts,
                         kvnode_remote_match *out);

/* Pin the longest cached prefix under one read lease: locs[0..*got) point at
 * the blocks (read-only by contract) until kvnode_get_end(lease). *lease is 0
 * when *got is 0 (nothing to end).
 *
 * Since KVNODE_0.8 kvnode_get_end of a lease this client got from
 * kvnode_get_begin, less than 3/4 of the daemon's read-lease TTL ago, sends
 * the end and returns without waiting for the reply (one round trip per
 * batch): the daemon cannot have reaped the lease, so the caller's reads were
 * covered, and it handles a connection's requests in order, so the end is
 * applied before any later request of this client. Any other lease (unknown,
 * ended already, older) waits for the reply and returns its error as before.
 * The reply of an end not waited for is read by whoever next reads the
 * socket; an error is kept and returned, once, by the first call on the
 * client that talks to the daemon after it was read, in place of that call's
 * own work (not sent; the message starts "earlier get_end of lease N"). The
 * reply is read at the latest while the next call waits for its own, so with
 * one thread the call after that one returns it. If the connection ends
 * first, every call returns -KVNODE_ECLOSED (the daemon ends the
 * connection's leases itself). kvnode_get_end_wait always waits.
 * kvnode_put_commit waits; kvnode_put_commit_nowait commits as kvnode_get_end
 * ends (a young write lease of this client's; a kvnode_put_begin may follow at
 * once and is handled after the commit). kvnode_flush waits (the client's
 * timeout) until every request not waited for has its reply and returns the
 * kept error, if any; kvnode_close does the same before it closes, so a clean
 * close leaves no lease behind.
 *
 * Completion contract: the daemon may reuse a block once its read lease ends
 * and stores, demotes and serves a block as soon as its write lease is
 * committed. kvnode_get_end / kvnode_put_commit therefore need the caller's
 * reads of / writes to the lease's blocks to be complete already: CPU
 * accesses done, GPU work (cudaMemcpyAsync, kernels) synchronised. For GPU
 * work still queued, end or commit with the _stream calls below. */
int  kvnode_get_begin(kvnode_client *c, const kvnode_key *keys, size_t n,
                      kvnode_lease *lease, kvnode_loc *locs, size_t *got);
int  kvnode_get_end(kvnode_client *c, kvnode_lease lease);       /* not waited for (0.8) */
int  kvnode_get_end_wait(kvnode_client *c, kvnode_lease lease);  /* waits for the reply */
int  kvnode_flush(kvnode_client *c);

/* Reserve a slot per key in `tier` (falls back to host; locs[i].tier says
 * where). locs[i].ptr == NULL: already stored, nothing to write. Write the
 * block bytes to each non-NULL slot, then commit (visible) or abort (freed).
 * *lease is 0 when every key was already stored. */
int  kvnode_put_begin(kvnode_client *c, const kvnode_key *keys, size_t n, int tier,
                      kvnode_lease *lease, kvnode_loc *locs); /* locs[i].ptr == NULL: already stored */
int  kvnode_put_commit(kvnode_client *c, kvnode_lease lease);
int  kvnode_put_commit_nowait(kvnode_client *c, kvnode_lease lease);  /* not waited for */
int  kvnode_put_abort(kvnode_client *c, kvnode_lease lease);

/* --- completion with the caller's GPU work (KVNODE_0.5) ---------------------
 *
 * kvnode_put_commit / kvnode_get_end after the work queued on `stream` (a
 * cudaStream_t of the client's CUDA device; NULL: the legacy default stream)
 * has completed: the calling thread waits for it (cudaStreamSynchronize),
 * then commits / ends. Need a CUDA runtime (-KVNODE_ESTATE without one). When
 * the wait fails (-KVNODE_EIO, with CUDA's message) the lease is left as it
 * was: the caller ends or aborts it once its work is known to be over (a
 * write still running must not land in a slot given to someone else).
 * kvnode_get_end_stream then ends as kvnode_get_end: not waited for (GPU
 * reads are over by then; the end only unpins). */
int  kvnode_put_commit_stream(kvnode_client *c, kvnode_lease lease, void *stream);
int  kvnode_get_end_stream(kvnode_client *c, kvnode_lease lease, void *stream);

/* Copying conveniences over the zero-copy pairs; each dst[i]/src[i] holds
 * kvnode_block_bytes() bytes of host memory. They split n > max_keys into
 * chunks (a get stops at the first short chunk); kvnode_put reserves
 * host-tier slots. Blocks in GPU memory are copied with cudaMemcpy. The
 * gets (and kvnode_get_scatter_checked) end each lease with
 * kvnode_get_end_wait: a copy counts only once the daemon confirmed that the
 * pin held until it was over. */
int  kvnode_get(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst, size_t *got);
int  kvnode_put(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src);

/* Same contract as kvnode_get / kvnode_put, but the bytes travel inside the
 * messages (no shared memory). */
int  kvnode_get_inline(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst, size_t *got);
int  kvnode_put_inline(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src);

/* Remove keys (blocks pinned by readers are freed when their lease ends). */
int  kvnode_delete(kvnode_client *c, const kvnode_key *keys, size_t n, size_t *deleted);

/* The daemon's statistics as a JSON document; the caller free()s *json. */
int  kvnode_stats_json(kvnode_client *c, char **json);      /* caller free()s */
int  kvnode_ping(kvnode_client *c);

/* Ask the daemon to re-read its configuration file, as SIGHUP does (allowed
 * to root and to the daemon's own user; others get -KVNODE_EDENIED). 0: the
 * new configuration runs; *not_applied (when not NULL) is then a malloc()ed,
 * comma-separated list of changed options that need a restart, or NULL when
 * there are none. -KVNODE_EINVAL: the file is invalid, the running
 * configuration stays, kvnode_last_error() has every problem. Observer
 * clients may call it. */
int  kvnode_reload(kvnode_client *c, char **not_applied);

/* --- batched copies (KVNODE_0.3) ------------------------------------------ */

/* Flags of kvnode_get_batch / kvnode_put_batch / kvnode_submit_get / _put. */
enum {
    /* dst[i] / src[i] are GPU memory of the client's CUDA device (device
     * pointers): every block is moved with cudaMemcpyAsync on a stream owned
     * by the client (non-blocking: not ordered with the legacy default
     * stream), which is synchronised before each chunk's lease ends, so dst
     * is complete when the call returns. The caller's GPU work writing src
     * (put) or still using dst (get) must be complete before the call: to
     * order the copies after work queued on a stream instead, use the
     * _stream calls. Needs a client that declared a CUDA device and found a
     * CUDA runtime (else -KVNODE_ESTATE). */
    KVNODE_BATCH_DEVICE = 1u << 0,
};
/* kvnode_get / kvnode_put with flags: n blocks between the cache and the
 * caller's pages in one call (split into chunks of max_keys as those are;
 * one lease per chunk, held only while its blocks are copied). 0 flags:
 * exactly kvnode_get / kvnode_put. Unknown flags: -KVNODE_EINVAL. */
int  kvnode_get_batch(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                      unsigned flags, size_t *got);
int  kvnode_put_batch(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src,
                      unsigned flags);
/* kvnode_get_batch / kvnode_put_batch whose CUDA copies (all of them with
 * KVNODE_BATCH_DEVICE; else those of GPU-tier blocks) are queued on the
 * caller's `stream` (a cudaStream_t of the client's device; NULL: the legacy
 * default stream), after the work already queued there, and the stream is
 * synchronised before each chunk's lease ends: on return the copies, and
 * the caller's work queued before them, are complete (KVNODE_0.5). */
int  kvnode_get_batch_stream(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                             unsigned flags, void *stream, size_t *got);
int  kvnode_put_batch_stream(kvnode_client *c, const kvnode_key *keys, size_t n,
                             const void *const *src, unsigned flags, void *stream);

/* --- asynchronous calls (KVNODE_0.3) ----------------------------------------
 *
 * kvnode_submit_* check their arguments, send the request and return a
 * ticket (> 0) without waiting. Each ticket completes exactly once, with a
 * kvnode_completion collected by kvnode_drain; kvnode_event_fd is readable
 * while completions wait. Completions come in the order requests finish,
 * not the order they were submitted. The keys are copied at submit; the
 * page arrays' pointers are copied too, but the pages they point to must
 * stay valid (and untouched) until the ticket completes.
 *
 * MATCH and DELETE batches are one request each, pipelined with every other
 * request of the client. GET and PUT batches run one after another on a
 * thread of the client (kvnode_get_batch / kvnode_put_batch there), whose
 * requests are pipelined in turn. Each request has the client's timeout; one
 * that passes it ends the connection as in the synchronous calls.
 *
 * When the connection ends (daemon died, protocol error, timeout,
 * kvnode_cancel) every ticket still in flight completes with the error
 * (-KVNODE_ECLOSED, -KVNODE_ETIMEDOUT, ...) and a message; nothing hangs.
 * kvnode_close completes and frees whatever was not drained. */
typedef uint64_t kvnode_ticket;
enum { KVNODE_OP_MATCH = 1, KVNODE_OP_GET = 2, KVNODE_OP_PUT = 3, KVNODE_OP_DELETE = 4,
       KVNODE_OP_EXISTS = 5, KVNODE_OP_DELETE_EACH = 6 /* KVNODE_0.6 */ };
typedef struct kvnode_completion {
    kvnode_ticket ticket;
    int    op;          /* KVNODE_OP_* */
    int    rc;          /* 0 or a negative KVNODE_E* code */
    size_t count;       /* MATCH: prefix matched; GET: blocks copied (a prefix); PUT: blocks
                         * stored (n on success); DELETE, DELETE_EACH: keys deleted; EXISTS:
                         * keys held */
    void  *user;        /* as given to the submit call */
    char   error[256];  /* rc < 0: what went wrong (as kvnode_last_error would say) */
} kvnode_completion;

/* The completion eventfd (EFD_NONBLOCK | EFD_CLOEXEC, owned by the client:
 * do not read or close it): readable while kvnode_drain has something. */
int  kvnode_event_fd(const kvnode_client *c);
int  kvnode_submit_match(kvnode_client *c, const kvnode_key *keys, size_t n, void *user,
                         kvnode_ticket *ticket);
int  kvnode_submit_delete(kvnode_client *c, const kvnode_key *keys, size_t n, void *user,
                          kvnode_ticket *ticket);
int  kvnode_submit_get(kvnode_client *c, const kvnode_key *keys, size_t n, void *const *dst,
                       unsigned flags, void *user, kvnode_ticket *ticket);
int  kvnode_submit_put(kvnode_client *c, const kvnode_key *keys, size_t n, const void *const *src,
                       unsigned flags, void *user, kvnode_ticket *ticket);
/* Move up to max finished completions into out; never blocks. Returns how
 * many (0 when none is waiting, or c is NULL). */
size_t kvnode_drain(kvnode_client *c, kvnode_completion *out, size_t max);
/* Tickets submitted and not yet drained. */
size_t kvnode_pending(kvnode_client *c);
/* End the connection now: every ticket in flight completes with
 * -KVNODE_ECLOSED ("cancelled ..."), threads waiting in synchronous calls
 * return it, later calls fail with it. The completions can still be drained;
 * kvnode_close is still needed. */
void kvnode_cancel(kvnode_client *c);

/* --- check words for foreign keys (KVNODE_0.4) -------------------------------
 *
 * An engine whose keys are longer than 64 bits (SGLang's and LMCache's
 * SHA-256 digests) folds each to a kvnode_key, and may attach to each a
 * second 64-bit check word (more bits of the same digest). A block is stored
 * with its word; a call whose word differs from the stored one does not see
 * the block (a miss, counted by the daemon as a check mismatch), cannot
 * overwrite it and cannot delete it. Word 0 is "no word": the plain calls
 * send none, so rtp-llm / KVCM keys work as before. The words stay on this
 * node and in its store; KVCM sees the keys only.
 *
 * The _checked calls are the plain calls with `checks` (n words, or NULL for
 * none) beside `keys`. They fail with -KVNODE_EVERSION when checks is not
 * NULL and the daemon does not honour check words (it predates them). */

/* Fold n digests of digest_len (>= 16) bytes each, laid end to end, into
 * keys (the first 8 bytes, big-endian, as a signed key) and checks (the next
 * 8 bytes, big-endian; 0 becomes 1, so every word is a real one). Returns n,
 * or 0 when an argument is invalid (NULL array, digest_len < 16). */
size_t kvnode_fold_digests(const void *digests, size_t n, size_t digest_len, kvnode_key *keys,
                           uint64_t *checks);
/* Fold n foreign keys given as text (an engine's key strings, UTF-8), separated
 * by single NUL bytes in the len bytes at text (the last one ends at len), into
 * keys and check words, as the Python binding's fold_key / fold_digests do: a
 * key of at least 16 hex digits, an even number (SGLang's SHA-256 hex digests),
 * is its own digest: key = its first 16 hex digits, check word = the next 16
 * (with fewer than 32 digits: bytes 8-15 of the key's SHA-256); any other key
 * (LMCache's "model@rank@hash") is folded from its SHA-256: key = bytes 0-7,
 * check word = bytes 8-15 (big-endian, signed key, 0 becomes 1 as above). One
 * call for a whole batch, without a crypto library (the x86 SHA extensions
 * when the CPU has them). Returns n, or 0 when an argument is invalid (NULL,
 * n 0) or text does not hold exactly n - 1 separators. */
size_t kvnode_fold_text(const char *text, size_t len, size_t n, kvnode_key *keys,
                        uint64_t *checks);
/* 1 when the daemon honours check words, else 0. */
int  kvnode_has_check_words(const kvnode_client *c);
int  kvnode_match_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                          size_t n, kvnode_tiers *out);
int  kvnode_get_begin_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, kvnode_lease *lease, kvnode_loc *locs, size_t *got);
int  kvnode_put_begin_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, int tier, kvnode_lease *lease, kvnode_loc *locs);
int  kvnode_get_batch_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, void *const *dst, unsigned flags, size_t *got);
int  kvnode_put_batch_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, const void *const *src, unsigned flags);
int  kvnode_get_inline_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, void *const *dst, size_t *got);
int  kvnode_put_inline_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, const void *const *src);
int  kvnode_delete_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                           size_t n, size_t *deleted);
int  kvnode_submit_match_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                                 size_t n, void *user, kvnode_ticket *ticket);
int  kvnode_submit_delete_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                                  size_t n, void *user, kvnode_ticket *ticket);
int  kvnode_submit_get_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, void *const *dst, unsigned flags, void *user,
                               kvnode_ticket *ticket);
int  kvnode_submit_put_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, const void *const *src, unsigned flags, void *user,
                               kvnode_ticket *ticket);

/* --- per-key answers (KVNODE_0.6) ---------------------------------------------
 *
 * kvnode_match answers the longest cached prefix; kvnode_exists answers
 * every key, in one request (MATCH with per_key): present[i] is whether
 * keys[i] is held in some tier (memory or the store, asked as kvnode_match
 * asks it), *held how many are. kvnode_delete_each deletes as kvnode_delete
 * and says per key whether this call removed it (deleted[i]; false: not
 * held, being written, or held under another check word), *count how many.
 * checks: check words as for the _checked calls (NULL: none). The outputs
 * have room for n; on failure they are left all false.
 *
 * kvnode_submit_exists / kvnode_submit_delete_each are their asynchronous
 * forms (one request each, as kvnode_submit_match): the completion's op is
 * KVNODE_OP_EXISTS / KVNODE_OP_DELETE_EACH and its count is *held / *count;
 * present / deleted are filled before the ticket completes, so they must
 * stay valid until it is drained (untouched on failure).
 *
 * All fail with -KVNODE_EVERSION against a daemon that does not answer per
 * key (its HELLO does not offer it: it predates the field); kvnode_has_per_key
 * says so beforehand. */
int  kvnode_has_per_key(const kvnode_client *c);
int  kvnode_exists(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks, size_t n,
                   bool *present, size_t *held);
int  kvnode_delete_each(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                        size_t n, bool *deleted, size_t *count);
int  kvnode_submit_exists(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                          size_t n, bool *present, void *user, kvnode_ticket *ticket);
int  kvnode_submit_delete_each(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, bool *deleted, void *user, kvnode_ticket *ticket);

/* --- model revisions and purges (KVNODE_0.7, issue 31) -----------------------
 *
 * kvnode_connect_revision is kvnode_connect_flags with the model's weights
 * revision (a commit hash, a tag; NULL or "": none, at most 127 bytes, no
 * control characters): part of the namespace identity when set, so blocks
 * of two revisions of a model never meet, while a layout without one keeps
 * the deployment id (and the stored blocks) it had before revisions
 * existed. Ignored for observers. A daemon older than revisions ignores it.
 *
 * kvnode_purge drops every block of a deployment from the daemon's host
 * memory, GPU memory and persistent store: deployment_id (as
 * kvnode_deployment_id gives it) names one, every TP rank of it; model
 * names every deployment of that model (any layout, any revision); neither
 * (NULL or ""): the client's own deployment. tenant NULL or "": the
 * client's tenant; only an observer client of root or the daemon's user may
 * name another one (else -KVNODE_EDENIED). It returns once memory is
 * cleared and the store has carried out the deletes (-KVNODE_EIO when some
 * failed: purge again). *namespaces, *blocks (either may be NULL): TP-rank
 * namespaces purged and blocks removed. A block a reader holds under a
 * lease stays readable until that lease ends; a put begun before the purge
 * and committed after it stores nothing. Observers may call it. */
int  kvnode_connect_revision(const char *socket_path, const kvnode_layout *layout, const char *revision,
                             int cuda_device, unsigned flags, kvnode_client **out);
int  kvnode_purge(kvnode_client *c, const char *tenant, const char *deployment_id, const char *model,
                  uint32_t *namespaces, uint64_t *blocks);
/* The deployment id of the client's namespace ("<model>-<fingerprint hex>"),
 * "" for an observer. */
const char *kvnode_deployment_id(const kvnode_client *c);

/* --- gathered blocks (KVNODE_0.8) --------------------------------------------
 *
 * A block whose bytes lie in pieces over the caller's memory (a host pool laid
 * out layer by layer: one piece per layer of each page) moved in one call per
 * batch, e.g. into the blocks kvnode_put_begin lent or out of those
 * kvnode_get_begin lent. Block i of n (block_bytes bytes) is made of m
 * pieces: piece j is piece_bytes[j] bytes at blocks[i] + piece_offsets[j] in
 * the block and, in the caller's memory, at pieces[i * m + j] when piece_at
 * is NULL, else at (char *)pieces[i] + piece_at[j] (pieces then holds one
 * base address per block: pieces at fixed distances from it, as a pool's
 * pages are). kvnode_gather copies the pieces into the blocks, kvnode_scatter
 * the blocks into the pieces. A NULL blocks[i] is skipped (a key
 * kvnode_put_begin found stored) and so are zero-byte pieces. The pieces must
 * tile the block: each inside it, no two overlapping, block_bytes in all; a
 * piece must not be NULL (nor its base) nor overlap its block. Returns 0, or
 * -KVNODE_EINVAL (-KVNODE_ENOMEM) with nothing copied; n 0 copies nothing and
 * returns 0. Talks to no daemon: kvnode_last_error() does not change. */
int  kvnode_gather(void *const *blocks, size_t n, size_t block_bytes, const void *const *pieces,
                   const ptrdiff_t *piece_at, size_t m, const size_t *piece_bytes,
                   const size_t *piece_offsets);
int  kvnode_scatter(const void *const *blocks, size_t n, size_t block_bytes, void *const *pieces,
                    const ptrdiff_t *piece_at, size_t m, const size_t *piece_bytes,
                    const size_t *piece_offsets);
/* kvnode_put_batch_checked / kvnode_get_batch_checked for such blocks: the
 * same leases (split at max_keys; checks NULL: no check words), each block's
 * bytes copied from / to its pieces as kvnode_gather / kvnode_scatter copy
 * them (block_bytes: the client's), in one call per batch. A key already
 * stored is skipped; *got is the prefix read. Pieces that do not tile the
 * block fail with -KVNODE_EINVAL before any lease; a copy that fails ends its
 * lease (a put's is aborted: nothing of it stored). A block lent in GPU memory
 * (a client that declared a CUDA device) is not copied: -KVNODE_EINVAL; the
 * _stream forms below copy it. */
int  kvnode_put_gather_checked(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, const void *const *pieces, const ptrdiff_t *piece_at,
                               size_t m, const size_t *piece_bytes, const size_t *piece_offsets);
int  kvnode_get_scatter_checked(kvnode_client *c, const kvnode_key *keys,
                                const uint64_t *checks, size_t n, void *const *pieces,
                                const ptrdiff_t *piece_at, size_t m, const size_t *piece_bytes,
                                const size_t *piece_offsets, size_t *got);
/* The same with flags (0 or KVNODE_BATCH_DEVICE; others: -KVNODE_EINVAL) and
 * a stream (issue 34). 0 flags: exactly the calls above (stream unused).
 * KVNODE_BATCH_DEVICE: the pieces are GPU memory of the client's CUDA device
 * (a vLLM worker's per-layer paged KV caches): every copy is
 * cudaMemcpyAsync (cudaMemcpyDefault) queued on `stream` (a cudaStream_t of
 * that device; NULL: the legacy default stream, so after the work queued on
 * the device's blocking streams), and the stream is synchronised before each
 * chunk's lease ends, even after a failed copy: on return the copies, and
 * the caller's work queued before them, are complete. Needs a client that
 * declared a CUDA device and found a CUDA runtime (else -KVNODE_ESTATE,
 * before any lease). A copy that fails returns -KVNODE_EIO with CUDA's
 * message and ends its lease (a put's aborted; a get's ended: *got counts
 * the chunks before it). Host-tier blocks (the lent host memory, faster
 * when kvnode_pin_host pinned it) are copied device-to-host / host-to-device;
 * blocks a get finds in GPU memory device-to-device.
 *
 * Pieces that lie end to end both in the block and in the caller's memory
 * move as one copy (a K/V split or stacked NHD cache: one per layer's K and
 * V). When the caller's order differs (an HND cache, whose block bytes are
 * token-major like an NHD one's: a layer's K is one run on the device but
 * heads x tokens pieces of the block) and pieces are given as bases and
 * distances (piece_at), each run of the caller's memory is copied whole
 * through a pinned staging buffer of the client (32 MiB or one block, twice
 * that for blocks in GPU memory; one call's at a time, others stage in
 * pageable memory) and the pieces are put in order there by the CPU: as many
 * copies as the NHD cache, plus one pass over the bytes (a block a get finds
 * in GPU memory is copied whole to host memory first: one copy more). */
int  kvnode_put_gather_stream(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                              size_t n, const void *const *pieces, const ptrdiff_t *piece_at,
                              size_t m, const size_t *piece_bytes, const size_t *piece_offsets,
                              unsigned flags, void *stream);
int  kvnode_get_scatter_stream(kvnode_client *c, const kvnode_key *keys, const uint64_t *checks,
                               size_t n, void *const *pieces, const ptrdiff_t *piece_at,
                               size_t m, const size_t *piece_bytes, const size_t *piece_offsets,
                               unsigned flags, void *stream, size_t *got);

/* rtp-llm / KVCM chained block hash (see docs/PROTOCOLS.md §4.1): one key per full
 * block of block_tokens tokens, at most max_keys; returns the number written. */
size_t kvnode_hash_tokens(const int64_t *tokens, size_t ntokens, uint32_t block_tokens,
                          kvnode_key *keys, size_t max_keys); /* rtp-llm/KVCM chained hash */

const char *kvnode_strerror(int rc);
/* Message of the last failed call on c made by this thread ("" when none;
 * a thread without one gets the last of any thread). Valid until this
 * thread's next call on c. c == NULL gives kvnode_connect_error(). */
const char *kvnode_last_error(const kvnode_client *c);
/* Per-call timeout in milliseconds (> 0). */
void kvnode_set_timeout(kvnode_client *c, int timeout_ms);
/* Protocol and library version strings. */
const char *kvnode_version(void);

#ifdef __cplusplus
}
#endif
#endif

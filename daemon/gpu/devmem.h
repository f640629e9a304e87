/* devmem: everything kvnoded asks of a GPU runtime, behind one interface
 * with three backends, so the rest of the daemon never knows which runs:
 *
 *   cuda  the CUDA driver API, loaded at run time (devmem_cuda.c over
 *         cudadrv.c: no CUDA library linked, no toolkit needed to build).
 *         A region is a VMM allocation (cuMemCreate) exported as a POSIX
 *         file descriptor, or where the device or driver cannot, a
 *         cuMemAlloc'ed one lent through a legacy IPC handle. Only a device
 *         that is given work (a region, a stream, the pin device) gets a
 *         context: its primary context, made current on the calling thread
 *         by every call. Devices in PROHIBITED or EXCLUSIVE_PROCESS compute
 *         mode and MIG instances are refused before any context exists. A
 *         sticky error (the context is lost for the life of the process)
 *         marks its device down: every later call on it fails at once.
 *   sim   host memory standing in for device memory (devmem_sim.c): a
 *         region is a sealed memfd that clients map like the host arena;
 *         copies are memcpy on the calling thread. For tests and for
 *         evaluating kvnode without a GPU.
 *   none  no GPU: every call fails with a reason.
 *
 * Threads: open/close/region_alloc/region_free/set_pin_device run on the
 * main thread at start and stop. host_register/unregister run on the
 * pinning thread (and at start). Streams belong to the thread that created
 * them (the copy worker); copy_to_host may run on any worker thread;
 * device_down on any thread (it never calls the runtime). Nothing here is
 * for the loop thread except the accessors and device_down.
 * Calls return 0 or a negative KVNODE_E* code with why set. */
#ifndef KVNODE_DEVMEM_H
#define KVNODE_DEVMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum devmem_kind { DEVMEM_NONE = 0, DEVMEM_SIM = 1, DEVMEM_CUDA = 2 };

#define DEVMEM_MAX_DEVICES 16
#define DEVMEM_IPC_HANDLE_BYTES 64   /* sizeof(cudaIpcMemHandle_t) */
#define DEVMEM_SIM_DEVICES 2         /* devices the sim backend pretends to have */

struct devmem;

/* Start a backend. DEVMEM_CUDA fails (with why, -KVNODE_EIO) when the
 * driver cannot be loaded or is too old (cudadrv_load says what is
 * missing) or no GPU is visible; it creates no context. DEVMEM_NONE
 * always succeeds; DEVMEM_SIM succeeds unless one of its
 * KVNODE_DEVMEM_SIM_*_DELAY_MS variables is set to something other than
 * decimal milliseconds 0..60000 (-KVNODE_EINVAL; empty means unset). sim
 * reads them here, once. devmem_open_auto picks cuda when it works, else
 * none (why says why cuda was not chosen; "" when cuda was). */
int  devmem_open(int kind, struct devmem **out, char *why, size_t whylen);
int  devmem_open_auto(struct devmem **out, char *why, size_t whylen);
void devmem_close(struct devmem *dm);
int  devmem_kind(const struct devmem *dm);
const char *devmem_kind_name(int kind);   /* "cuda", "sim", "none" */
/* Devices this backend can use (0 for none). */
int  devmem_device_count(const struct devmem *dm);
/* True when the backend can page-lock host memory (cuda, sim). */
bool devmem_can_pin(const struct devmem *dm);

/* Device memory the daemon owns and lends. Every call taking a device
 * fails with -KVNODE_EINVAL (why says so) for one outside
 * 0..devmem_device_count()-1, and so for every device with none. A failed
 * alloc leaves *out empty (base NULL, fd -1); freeing an empty region is a
 * no-op, and free empties it. */
struct devmem_region {
    int      device;
    void    *base;         /* daemon's address: a device pointer (cuda: its own mapping) or a
                              host mapping (sim) */
    uint64_t size;         /* cuda VMM: the bytes asked for rounded up to the allocation granularity */
    int      fd;           /* owned by the region. sim: the memfd clients map; cuda VMM: the
                              POSIX-fd shareable handle clients import; cuda legacy: -1 */
    bool     vmm;          /* cuda: fd is a VMM handle (Arena.cuda_vmm), not memory to mmap */
    uint8_t  ipc_handle[DEVMEM_IPC_HANDLE_BYTES];
    size_t   ipc_len;      /* cuda legacy: DEVMEM_IPC_HANDLE_BYTES; VMM and sim: 0 */
    bool     host_access;  /* base can be dereferenced by the CPU (sim) */
    char     pci_bus_id[32];  /* cuDeviceGetPCIBusId ("0000:3B:00.0"); sim: "sim:N" */
    uint64_t handle;       /* backend-private (cuda VMM: the allocation handle) */
};
int  devmem_region_alloc(struct devmem *dm, int device, uint64_t bytes, struct devmem_region *out,
                         char *why, size_t whylen);
void devmem_region_free(struct devmem *dm, struct devmem_region *r);

/* The device whose context page-locks host memory (cuda: registering needs
 * a current context; portable registrations serve every device's). Until
 * one is set, cuda's host_register fails rather than create a context on
 * some GPU. sim and none accept any device in range and ignore it. */
int  devmem_set_pin_device(struct devmem *dm, int device, char *why, size_t whylen);
/* Page-lock [ptr, ptr+len) for the devices (cuMemHostRegister, portable).
 * sim: records nothing and succeeds, after KVNODE_DEVMEM_SIM_PIN_DELAY_MS
 * milliseconds when that is set in the environment (tests use it to see
 * the daemon ready before pinning finishes). */
int  devmem_host_register(struct devmem *dm, void *ptr, size_t len, char *why, size_t whylen);
void devmem_host_unregister(struct devmem *dm, void *ptr);

/* A non-blocking stream on one device, owned by one worker thread.
 * Copies of 0 bytes are no-ops; NULL pointers with len > 0 are -KVNODE_EINVAL. */
struct devmem_stream;
int  devmem_stream_create(struct devmem *dm, int device, struct devmem_stream **out,
                          char *why, size_t whylen);
void devmem_stream_destroy(struct devmem_stream *s);
/* Queue a copy of len bytes (either direction; pointers are unified
 * addresses: device pointers of this backend's regions or host memory). */
int  devmem_copy_async(struct devmem_stream *s, void *dst, const void *src, size_t len,
                       char *why, size_t whylen);
/* Record an event after everything queued and wait for it (blocks the
 * calling worker thread, never the loop). sim: sleeps
 * KVNODE_DEVMEM_SIM_COPY_DELAY_MS when set, so tests can watch a move in
 * flight. */
int  devmem_stream_wait(struct devmem_stream *s, char *why, size_t whylen);
/* Whether a sticky error (a lost context: illegal address, hardware
 * stack error, ... ) has put the device out of use for the life of the
 * process; why then says which call saw what. Every later call on it fails
 * at once. sim: once the file sticky-<device> exists in
 * KVNODE_DEVMEM_SIM_STICKY_DIR (seen by its next copy); none: never. Any
 * thread; never calls into the runtime. */
bool devmem_device_down(struct devmem *dm, int device, char *why, size_t whylen);
/* A synchronous copy out of device memory into host memory, from any
 * worker thread (e.g. a persist worker writing an HBM block to the store). */
int  devmem_copy_to_host(struct devmem *dm, int device, void *dst, const void *src, size_t len,
                         char *why, size_t whylen);

#endif

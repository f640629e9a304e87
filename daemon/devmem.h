/* devmem: what kvnoded needs from the GPU runtime. Today: pinning the host
 * arena (cudaHostRegister) so GPU copies from/to it run at full speed. The
 * HBM tier's device-memory backends will live behind this header too.
 * Built without CUDA (make CUDA=0) every call reports why it cannot work. */
#ifndef KVNODE_DEVMEM_H
#define KVNODE_DEVMEM_H

#include <stddef.h>

/* Number of visible GPUs, or 0 with why set (no toolkit, no driver, ...). */
int  devmem_gpu_count(char *why, size_t whylen);
/* Page-lock [ptr, ptr+len) for the GPUs. 0, or -1 with why set. */
int  devmem_pin_host(void *ptr, size_t len, char *why, size_t whylen);
void devmem_unpin_host(void *ptr);

#endif

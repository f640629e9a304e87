/* devmem: CUDA runtime calls behind devmem.h (see there). */
#include "devmem.h"

#include <stdio.h>

#ifdef KVNODE_HAVE_CUDA
#include <cuda_runtime_api.h>

int devmem_gpu_count(char *why, size_t whylen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, whylen, "no usable GPU (%s)", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0)
        snprintf(why, whylen, "no GPU visible");
    return n;
}

int devmem_pin_host(void *ptr, size_t len, char *why, size_t whylen)
{
    cudaError_t e;
    if (devmem_gpu_count(why, whylen) <= 0)
        return -1;
    e = cudaHostRegister(ptr, len, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        snprintf(why, whylen, "cudaHostRegister failed: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

void devmem_unpin_host(void *ptr)
{
    cudaHostUnregister(ptr);
}

#else

int devmem_gpu_count(char *why, size_t whylen)
{
    snprintf(why, whylen, "built without CUDA");
    return 0;
}

int devmem_pin_host(void *ptr, size_t len, char *why, size_t whylen)
{
    (void)ptr;
    (void)len;
    snprintf(why, whylen, "built without CUDA");
    return -1;
}

void devmem_unpin_host(void *ptr)
{
    (void)ptr;
}

#endif

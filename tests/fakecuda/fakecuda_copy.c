/* fakecuda_copy.c: the copy and memset entry points of both halves; the
 * rules (directions, pinning, which copies return before they land) are
 * fc_copy's in fakecuda_stream.c. */
#include <stdint.h>

#include "fakecuda_internal.h"

static CUresult drv_copy(const char *name, void *dst, const void *src, size_t n, int kind, CUstream stream,
                         bool async)
{
    struct fc_stream *s = NULL;

    DRV_CTX(name);
    if (async && (rc = fc_stream_resolve(stream, c, &s)))
        return rc;
    rc = fc_copy(dst, src, n, kind, s, async, c, name);
    return rc == FC_ERR_INVALID_MEMCPY_DIRECTION ? FC_ERR_INVALID_VALUE : rc;
}

#define DPTR(p) ((void *)(uintptr_t)(p))

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream)
{
    return drv_copy("cuMemcpyAsync", DPTR(dst), DPTR(src), n, FC_MEMCPY_DEFAULT, stream, true);
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return drv_copy("cuMemcpy", DPTR(dst), DPTR(src), n, FC_MEMCPY_DEFAULT, NULL, false);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return drv_copy("cuMemcpyDtoH_v2", dst, DPTR(src), n, FC_MEMCPY_D2H, NULL, false);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return drv_copy("cuMemcpyHtoD_v2", DPTR(dst), src, n, FC_MEMCPY_H2D, NULL, false);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return drv_copy("cuMemcpyDtoD_v2", DPTR(dst), DPTR(src), n, FC_MEMCPY_D2D, NULL, false);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream)
{
    return drv_copy("cuMemcpyHtoDAsync_v2", DPTR(dst), src, n, FC_MEMCPY_H2D, stream, true);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream)
{
    return drv_copy("cuMemcpyDtoHAsync_v2", dst, DPTR(src), n, FC_MEMCPY_D2H, stream, true);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream)
{
    return drv_copy("cuMemcpyDtoDAsync_v2", DPTR(dst), DPTR(src), n, FC_MEMCPY_D2D, stream, true);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    DRV_CTX("cuMemsetD8_v2");
    return fc_memset(DPTR(dst), value, n, c, NULL);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream)
{
    DRV_CTX("cuMemsetD8Async");
    return fc_memset(DPTR(dst), value, n, c, stream);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    RT_CTX("cudaMemcpy");
    return fc_rt_ret(fc_copy(dst, src, n, kind, NULL, false, c, "cudaMemcpy"));
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t stream)
{
    struct fc_stream *s;

    RT_CTX("cudaMemcpyAsync");
    if ((rc = fc_stream_resolve(stream, c, &s)))
        return fc_rt_ret(rc);
    return fc_rt_ret(fc_copy(dst, src, n, kind, s, true, c, "cudaMemcpyAsync"));
}

cudaError_t cudaMemset(void *ptr, int value, size_t n)
{
    RT_CTX("cudaMemset");
    return fc_rt_ret(fc_memset(ptr, value, n, c, NULL));
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t n, cudaStream_t stream)
{
    RT_CTX("cudaMemsetAsync");
    return fc_rt_ret(fc_memset(ptr, value, n, c, stream));
}

// The slice of the CUDA driver API's ABI that tandem uses (the providers, and the device kit's
// driver probe: device name and memory; cuPointerSetAttribute and cuGetErrorString are what
// fabtests asks of the emulated driver), declared here so that neither the
// providers nor the emulated driver of the tests need the CUDA toolkit to build: the driver is
// loaded at run time with dlopen("libcuda.so.1"). Values, types and calls are those of cuda.h:
// tests/unit/test_cuda_abi.cpp checks every declaration here at compile time against each real
// cuda.h found (CUDA 13's in /usr/local/cuda/include, 11.8's from scripts/cuda-headers.sh; ctest
// -R cuda_abi), the calls by ABI (kinds, sizes and alignments of results, parameters and what
// they point to), so a declaration added here must be checked there too.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st *;
using CUstream = struct CUstream_st *;
using CUevent = struct CUevent_st *;

inline constexpr std::size_t kCuIpcHandleSize = 64;
struct CUipcMemHandle {
    char reserved[kCuIpcHandleSize];
};

enum : CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

// CUpointer_attribute
enum : int {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,
    CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_POINTER_ATTRIBUTE_MAPPED = 13,
};

// CUmemorytype
enum : unsigned {
    CU_MEMORYTYPE_HOST = 0x01,
    CU_MEMORYTYPE_DEVICE = 0x02,
    CU_MEMORYTYPE_ARRAY = 0x03,
    CU_MEMORYTYPE_UNIFIED = 0x04,
};

// CUdevice_attribute (the ones tandem asks for)
enum : int {
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
};

inline constexpr unsigned CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
inline constexpr unsigned CU_STREAM_WAIT_VALUE_GEQ = 0x0;
inline constexpr unsigned CU_STREAM_WAIT_VALUE_EQ = 0x1;
inline constexpr unsigned CU_STREAM_WRITE_VALUE_DEFAULT = 0x0;
inline constexpr int CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1;

// The exported symbol names (cuda.h maps e.g. cuMemAlloc to cuMemAlloc_v2 with macros, and
// dlsym sees only the exported name). One X-macro list keeps the loader and the emulated
// driver in step: X(field, exported symbol, return, parameters).
#define TANDEM_CUDA_DRIVER_CALLS(X)                                                                \
    X(init, cuInit, CUresult, (unsigned flags))                                                    \
    X(driver_get_version, cuDriverGetVersion, CUresult, (int *version))                            \
    X(device_get_count, cuDeviceGetCount, CUresult, (int *count))                                  \
    X(device_get, cuDeviceGet, CUresult, (CUdevice * dev, int ordinal))                            \
    X(device_get_name, cuDeviceGetName, CUresult, (char *name, int len, CUdevice dev))             \
    X(device_total_mem, cuDeviceTotalMem_v2, CUresult, (std::size_t * bytes, CUdevice dev))        \
    X(device_get_attribute, cuDeviceGetAttribute, CUresult,                                        \
      (int *value, int attribute, CUdevice dev))                                                   \
    X(device_can_access_peer, cuDeviceCanAccessPeer, CUresult,                                     \
      (int *can_access, CUdevice dev, CUdevice peer_dev))                                          \
    X(primary_ctx_retain, cuDevicePrimaryCtxRetain, CUresult, (CUcontext * ctx, CUdevice dev))     \
    X(primary_ctx_release, cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice dev))                 \
    X(ctx_set_current, cuCtxSetCurrent, CUresult, (CUcontext ctx))                                 \
    X(ctx_get_current, cuCtxGetCurrent, CUresult, (CUcontext * ctx))                               \
    X(ctx_get_device, cuCtxGetDevice, CUresult, (CUdevice * dev))                                  \
    X(ctx_enable_peer_access, cuCtxEnablePeerAccess, CUresult, (CUcontext peer, unsigned flags))   \
    X(pointer_get_attribute, cuPointerGetAttribute, CUresult,                                      \
      (void *data, int attribute, CUdeviceptr ptr))                                                \
    X(pointer_set_attribute, cuPointerSetAttribute, CUresult,                                      \
      (const void *value, int attribute, CUdeviceptr ptr))                                         \
    X(mem_get_address_range, cuMemGetAddressRange_v2, CUresult,                                    \
      (CUdeviceptr * base, std::size_t * size, CUdeviceptr ptr))                                   \
    X(mem_alloc, cuMemAlloc_v2, CUresult, (CUdeviceptr * ptr, std::size_t size))                   \
    X(mem_free, cuMemFree_v2, CUresult, (CUdeviceptr ptr))                                         \
    X(mem_host_alloc, cuMemHostAlloc, CUresult, (void **ptr, std::size_t size, unsigned flags))    \
    X(mem_free_host, cuMemFreeHost, CUresult, (void *ptr))                                         \
    X(memcpy_htod, cuMemcpyHtoD_v2, CUresult,                                                      \
      (CUdeviceptr dst, const void *src, std::size_t size))                                        \
    X(memcpy_dtoh, cuMemcpyDtoH_v2, CUresult, (void *dst, CUdeviceptr src, std::size_t size))      \
    X(memcpy_dtod, cuMemcpyDtoD_v2, CUresult,                                                      \
      (CUdeviceptr dst, CUdeviceptr src, std::size_t size))                                        \
    X(memcpy_async, cuMemcpyAsync, CUresult,                                                       \
      (CUdeviceptr dst, CUdeviceptr src, std::size_t size, CUstream stream))                       \
    X(stream_create, cuStreamCreate, CUresult, (CUstream * stream, unsigned flags))                \
    X(stream_query, cuStreamQuery, CUresult, (CUstream stream))                                    \
    X(stream_synchronize, cuStreamSynchronize, CUresult, (CUstream stream))                        \
    X(stream_destroy, cuStreamDestroy_v2, CUresult, (CUstream stream))                             \
    X(stream_write_value32, cuStreamWriteValue32_v2, CUresult,                                     \
      (CUstream stream, CUdeviceptr addr, std::uint32_t value, unsigned flags))                    \
    X(stream_wait_value32, cuStreamWaitValue32_v2, CUresult,                                       \
      (CUstream stream, CUdeviceptr addr, std::uint32_t value, unsigned flags))                    \
    X(stream_write_value64, cuStreamWriteValue64_v2, CUresult,                                     \
      (CUstream stream, CUdeviceptr addr, std::uint64_t value, unsigned flags))                    \
    X(stream_wait_value64, cuStreamWaitValue64_v2, CUresult,                                       \
      (CUstream stream, CUdeviceptr addr, std::uint64_t value, unsigned flags))                    \
    X(event_create, cuEventCreate, CUresult, (CUevent * event, unsigned flags))                    \
    X(event_record, cuEventRecord, CUresult, (CUevent event, CUstream stream))                     \
    X(event_query, cuEventQuery, CUresult, (CUevent event))                                        \
    X(event_synchronize, cuEventSynchronize, CUresult, (CUevent event))                            \
    X(event_destroy, cuEventDestroy_v2, CUresult, (CUevent event))                                 \
    X(ipc_get_mem_handle, cuIpcGetMemHandle, CUresult, (CUipcMemHandle * handle, CUdeviceptr ptr)) \
    X(ipc_open_mem_handle, cuIpcOpenMemHandle_v2, CUresult,                                        \
      (CUdeviceptr * ptr, CUipcMemHandle handle, unsigned flags))                                  \
    X(ipc_close_mem_handle, cuIpcCloseMemHandle, CUresult, (CUdeviceptr ptr))                      \
    X(mem_get_handle_for_address_range, cuMemGetHandleForAddressRange, CUresult,                   \
      (void *handle, CUdeviceptr ptr, std::size_t size, int handle_type,                           \
       unsigned long long flags))                                                                  \
    X(get_error_name, cuGetErrorName, CUresult, (CUresult error, const char **name))               \
    X(get_error_string, cuGetErrorString, CUresult, (CUresult error, const char **text))

}  // extern "C"

namespace tandem::hmem {

// The driver's calls as function pointers, resolved from a dlopen handle of libcuda.so.1:
// the one loader of the provider (cuda_iface.cpp), the tests and the benchmark.
struct CudaDriverCalls {
#define TANDEM_CUDA_FIELD(field, sym, ret, params) ret(*field) params = nullptr;
    TANDEM_CUDA_DRIVER_CALLS(TANDEM_CUDA_FIELD)
#undef TANDEM_CUDA_FIELD

    // Resolves every call; true when all are there, else the missing names in `missing`.
    bool resolve(void *lib, std::string *missing = nullptr) {
        std::string lacking;
#define TANDEM_CUDA_RESOLVE(field, sym, ret, params)             \
    field = reinterpret_cast<decltype(field)>(dlsym(lib, #sym)); \
    if (!field) lacking += " " #sym;
        TANDEM_CUDA_DRIVER_CALLS(TANDEM_CUDA_RESOLVE)
#undef TANDEM_CUDA_RESOLVE
        if (missing) *missing = lacking;
        return lacking.empty();
    }
};

}  // namespace tandem::hmem

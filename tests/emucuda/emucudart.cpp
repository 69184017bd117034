// The emulated CUDA runtime of the tests: libcudart.so beside the emulated driver (emucuda.cpp),
// with the few runtime calls that fabtests' CUDA support resolves (common/hmem_cuda.c of
// fabtests 1.17: allocation, copies, memset, error names), each made of driver calls as the real
// runtime's are, on device 0's primary context. A real libcudart cannot run on the emulated
// driver (it asks the driver for private export tables), and the device kit runs fabtests'
// device-memory tests against both: the real runtime and driver on a GPU machine, this and the
// emulator here (build/device-kit/run.sh --emulated). Test code, never shipped as a runtime.
#include "hmem/cuda_abi.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace {

using cudaError_t = int;  // the runtime's codes agree with the driver's for those returned here
constexpr cudaError_t kInitializationError = 3;
enum MemcpyKind {
    kHostToHost = 0,
    kHostToDevice = 1,
    kDeviceToHost = 2,
    kDeviceToDevice = 3,
    kDefault = 4
};

const tandem::hmem::CudaDriverCalls *driver() {
    static const tandem::hmem::CudaDriverCalls *calls =
        []() -> const tandem::hmem::CudaDriverCalls * {
        static tandem::hmem::CudaDriverCalls c;
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!lib || !c.resolve(lib) || c.init(0) != CUDA_SUCCESS) return nullptr;
        return &c;
    }();
    return calls;
}

// The runtime's implicit context: device 0's primary one, made current on the calling thread
// when it has none.
const tandem::hmem::CudaDriverCalls *ready() {
    const auto *d = driver();
    if (!d) return nullptr;
    CUcontext ctx = nullptr;
    if (d->ctx_get_current(&ctx) == CUDA_SUCCESS && ctx) return d;
    CUdevice dev = 0;
    if (d->device_get(&dev, 0) != CUDA_SUCCESS ||
        d->primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS || d->ctx_set_current(ctx) != CUDA_SUCCESS)
        return nullptr;
    return d;
}

bool on_device(const tandem::hmem::CudaDriverCalls *d, const void *p) {
    unsigned type = 0;
    return d->pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE;
}

CUdeviceptr dptr(const void *p) {
    return reinterpret_cast<CUdeviceptr>(p);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) cudaError_t cudaMalloc(void **ptr, std::size_t size) {
    const auto *d = ready();
    if (!d) return kInitializationError;
    CUdeviceptr p = 0;
    CUresult r = d->mem_alloc(&p, size);
    if (r == CUDA_SUCCESS) *ptr = reinterpret_cast<void *>(p);
    return r;
}

__attribute__((visibility("default"))) cudaError_t cudaFree(void *ptr) {
    const auto *d = ready();
    if (!d) return kInitializationError;
    return ptr ? d->mem_free(dptr(ptr)) : CUDA_SUCCESS;
}

__attribute__((visibility("default"))) cudaError_t cudaMallocHost(void **ptr, std::size_t size) {
    const auto *d = ready();
    if (!d) return kInitializationError;
    return d->mem_host_alloc(ptr, size, 0);
}

__attribute__((visibility("default"))) cudaError_t cudaFreeHost(void *ptr) {
    const auto *d = ready();
    if (!d) return kInitializationError;
    return d->mem_free_host(ptr);
}

__attribute__((visibility("default"))) cudaError_t cudaMemcpy(void *dst, const void *src,
                                                              std::size_t size, int kind) {
    const auto *d = ready();
    if (!d) return kInitializationError;
    if (kind == kDefault)
        kind = on_device(d, src) ? (on_device(d, dst) ? kDeviceToDevice : kDeviceToHost)
                                 : (on_device(d, dst) ? kHostToDevice : kHostToHost);
    switch (kind) {
        case kHostToHost:
            std::memmove(dst, src, size);
            return CUDA_SUCCESS;
        case kHostToDevice:
            return d->memcpy_htod(dptr(dst), src, size);
        case kDeviceToHost:
            return d->memcpy_dtoh(dst, dptr(src), size);
        case kDeviceToDevice:
            return d->memcpy_dtod(dptr(dst), dptr(src), size);
        default:
            return CUDA_ERROR_INVALID_VALUE;
    }
}

// Device memory is not the CPU's to write (the emulator maps it PROT_NONE): the bytes go by the
// copy engine, as a memset kernel's would on a GPU.
__attribute__((visibility("default"))) cudaError_t cudaMemset(void *ptr, int value,
                                                              std::size_t size) {
    const auto *d = ready();
    if (!d) return kInitializationError;
    if (!on_device(d, ptr)) return CUDA_ERROR_INVALID_VALUE;
    std::vector<unsigned char> bytes(size, static_cast<unsigned char>(value));
    return d->memcpy_htod(dptr(ptr), bytes.data(), size);
}

__attribute__((visibility("default"))) const char *cudaGetErrorName(cudaError_t error) {
    const char *name = nullptr;
    const auto *d = driver();
    if (d && d->get_error_name(error, &name) == CUDA_SUCCESS && name) return name;
    return "cudaErrorUnknown";
}

__attribute__((visibility("default"))) const char *cudaGetErrorString(cudaError_t error) {
    return cudaGetErrorName(error);
}

}  // extern "C"

// device_probe: what the CUDA driver of this machine says, before anything else of the device
// kit runs (build/device-kit/run.sh): that libcuda.so.1 loads and initialises, its version, and
// each device's name, memory, compute capability, and what tandem's GPU paths need of it
// (unified addressing, dma-buf export, peer access between devices).
//
//   device_probe            one "key value" line each; exit 0, or 1 where there is no usable
//                           driver or device (the reason on stderr)
//
// It loads the driver with dlopen as the providers do (hmem/cuda_abi.h), so it runs on a
// machine with nothing of CUDA but the driver.
#include "hmem/cuda_abi.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstdio>

namespace {

const char *error_name(const tandem::hmem::CudaDriverCalls &cu, CUresult r) {
    const char *name = nullptr;
    if (cu.get_error_name(r, &name) == CUDA_SUCCESS && name) return name;
    return "an unknown error";
}

int attribute(const tandem::hmem::CudaDriverCalls &cu, int attr, CUdevice dev) {
    int value = -1;
    return cu.device_get_attribute(&value, attr, dev) == CUDA_SUCCESS ? value : -1;
}

void print_device(const tandem::hmem::CudaDriverCalls &cu, int ordinal, int count) {
    CUdevice dev = 0;
    if (CUresult r = cu.device_get(&dev, ordinal)) {
        printf("device%d error %s\n", ordinal, error_name(cu, r));
        return;
    }
    char name[256] = "?";
    cu.device_get_name(name, sizeof name, dev);
    std::size_t bytes = 0;
    cu.device_total_mem(&bytes, dev);
    printf("device%d.name %s\n", ordinal, name);
    printf("device%d.memory_mib %zu\n", ordinal, bytes >> 20);
    printf("device%d.compute_capability %d.%d\n", ordinal,
           attribute(cu, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
           attribute(cu, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    printf("device%d.pci_bus %d\n", ordinal, attribute(cu, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev));
    printf("device%d.unified_addressing %d\n", ordinal,
           attribute(cu, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev));
    printf("device%d.dma_buf %d\n", ordinal,
           attribute(cu, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev));
    for (int other = 0; other < count; ++other) {
        CUdevice peer = 0;
        int can = 0;
        if (other == ordinal || cu.device_get(&peer, other) != CUDA_SUCCESS) continue;
        if (cu.device_can_access_peer(&can, dev, peer) == CUDA_SUCCESS)
            printf("device%d.peer_access_to_%d %d\n", ordinal, other, can);
    }
}

}  // namespace

int main() {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "device_probe: no CUDA driver: %s\n", dlerror());
        return 1;
    }
    tandem::hmem::CudaDriverCalls cu;
    std::string missing;
    if (!cu.resolve(lib, &missing)) {
        fprintf(stderr, "device_probe: the driver lacks calls tandem uses:%s\n", missing.c_str());
        return 1;
    }
    Dl_info where{};
    if (dladdr(reinterpret_cast<void *>(cu.init), &where) && where.dli_fname)
        printf("driver.library %s\n", where.dli_fname);
    printf("driver.emulated %d\n", dlsym(lib, "emucuda_get_stats") ? 1 : 0);
    if (CUresult r = cu.init(0)) {
        fprintf(stderr, "device_probe: cuInit: %s\n", error_name(cu, r));
        return 1;
    }
    int version = 0, count = 0;
    cu.driver_get_version(&version);
    printf("driver.cuda_version %d.%d\n", version / 1000, version % 1000 / 10);
    if (CUresult r = cu.device_get_count(&count)) {
        fprintf(stderr, "device_probe: cuDeviceGetCount: %s\n", error_name(cu, r));
        return 1;
    }
    printf("devices %d\n", count);
    for (int i = 0; i < count; ++i) print_device(cu, i, count);
    if (count == 0) {
        fprintf(stderr, "device_probe: the driver sees no device\n");
        return 1;
    }
    return 0;
}

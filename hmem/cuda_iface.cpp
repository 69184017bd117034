// FI_HMEM_CUDA through the CUDA driver API, loaded at run time: the providers have no
// link-time dependency on CUDA, and a machine without it loads them and offers no
// FI_HMEM_CUDA. Every call runs in the device's primary context, and every copy on the
// interface's own stream of that device (never the application's), waited for before the
// copy returns: copies of one device complete in the order they were issued.
#include "common/log.h"
#include "hmem/cuda_abi.h"
#include "hmem/iface_tables.h"

#include <dlfcn.h>
#include <rdma/fi_errno.h>

#include <cstring>
#include <mutex>

namespace tandem::hmem {
namespace {

using Driver = CudaDriverCalls;

constexpr int kMaxDevices = 64;

struct DeviceState {
    std::once_flag once;
    int status = 0;  // 0, or the negative errno of a failed set-up
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
};

Driver g_cu;
int g_devices = 0;
DeviceState g_dev[kMaxDevices];

const char *error_name(CUresult r) {
    const char *name = nullptr;
    if (g_cu.get_error_name && g_cu.get_error_name(r, &name) == CUDA_SUCCESS && name) return name;
    return "unknown CUDA error";
}

int to_errno(CUresult r) {
    switch (r) {
        case CUDA_SUCCESS:
            return 0;
        case CUDA_ERROR_OUT_OF_MEMORY:
            return -FI_ENOMEM;
        case CUDA_ERROR_INVALID_VALUE:
        case CUDA_ERROR_INVALID_HANDLE:
        case CUDA_ERROR_INVALID_DEVICE:
            return -FI_EINVAL;
        case CUDA_ERROR_NOT_SUPPORTED:
        case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
            return -FI_EOPNOTSUPP;
        case CUDA_ERROR_NOT_PERMITTED:
            return -FI_EPERM;
        case CUDA_ERROR_NOT_READY:
            return -FI_EAGAIN;
        default:
            return -FI_EIO;
    }
}

int check(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return 0;
    TANDEM_WARN(FI_LOG_CORE, "CUDA %s failed: %s (%d)\n", what, error_name(r), r);
    return to_errno(r);
}

// The device's primary context, current on this thread for one call and then the
// application's again: a provider must not leave a thread on a context it did not choose.
// The context and the copy stream are created on first use.
class Enter {
  public:
    explicit Enter(uint64_t device) {
        if (device >= static_cast<uint64_t>(g_devices)) {
            status_ = -FI_EINVAL;
            return;
        }
        DeviceState &d = g_dev[device];
        std::call_once(d.once, [&] {
            CUdevice dev;
            CUcontext before = nullptr;
            g_cu.ctx_get_current(&before);
            d.status = check(g_cu.device_get(&dev, static_cast<int>(device)), "cuDeviceGet");
            if (!d.status)
                d.status = check(g_cu.primary_ctx_retain(&d.ctx, dev), "cuDevicePrimaryCtxRetain");
            if (!d.status) d.status = check(g_cu.ctx_set_current(d.ctx), "cuCtxSetCurrent");
            if (!d.status)
                d.status =
                    check(g_cu.stream_create(&d.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
            g_cu.ctx_set_current(before);
        });
        if ((status_ = d.status)) return;
        if ((status_ = check(g_cu.ctx_get_current(&prev_), "cuCtxGetCurrent"))) return;
        if (prev_ != d.ctx) {
            status_ = check(g_cu.ctx_set_current(d.ctx), "cuCtxSetCurrent");
            switched_ = !status_;
        }
    }
    ~Enter() {
        if (switched_) g_cu.ctx_set_current(prev_);
    }
    Enter(const Enter &) = delete;
    Enter &operator=(const Enter &) = delete;
    int status() const { return status_; }

  private:
    int status_ = 0;
    CUcontext prev_ = nullptr;
    bool switched_ = false;
};

CUdeviceptr dptr(const void *p) {
    return reinterpret_cast<CUdeviceptr>(p);
}

int query(const void *addr, AddrInfo *info) {
    unsigned type = 0;
    // Host memory (and anything CUDA does not know) answers with an error: not ours.
    if (g_cu.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr(addr)) !=
            CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE)
        return 0;
    int ordinal = 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    unsigned long long id = 0;
    if (check(g_cu.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr(addr)),
              "cuPointerGetAttribute(DEVICE_ORDINAL)") ||
        check(g_cu.pointer_get_attribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr(addr)),
              "cuPointerGetAttribute(RANGE_START_ADDR)") ||
        check(g_cu.pointer_get_attribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr(addr)),
              "cuPointerGetAttribute(RANGE_SIZE)") ||
        check(g_cu.pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, dptr(addr)),
              "cuPointerGetAttribute(BUFFER_ID)"))
        return -FI_EIO;
    info->mem = {FI_HMEM_CUDA, static_cast<uint64_t>(ordinal)};
    info->base = static_cast<uintptr_t>(base);
    info->length = size;
    info->buffer_id = id;
    return 1;
}

int copy_on_stream(uint64_t device, CUdeviceptr dst, CUdeviceptr src, size_t len) {
    if (!len) return 0;
    Enter in(device);
    if (int ret = in.status()) return ret;
    int ret = check(g_cu.memcpy_async(dst, src, len, g_dev[device].stream), "cuMemcpyAsync");
    if (ret) return ret;
    ret = check(g_cu.stream_synchronize(g_dev[device].stream), "cuStreamSynchronize");
    if (!ret) counters().device_copies.fetch_add(1, std::memory_order_relaxed);
    return ret;
}

int copy_to_host(MemRef mem, void *dst, const void *src, size_t len) {
    return copy_on_stream(mem.device, dptr(dst), dptr(src), len);
}
int copy_from_host(MemRef mem, void *dst, const void *src, size_t len) {
    return copy_on_stream(mem.device, dptr(dst), dptr(src), len);
}
int copy_device(MemRef dst_mem, void *dst, MemRef src_mem, const void *src, size_t len) {
    // The copy runs on the destination's engine; a host side is fine for cuMemcpyAsync.
    uint64_t device = dst_mem.iface == FI_HMEM_CUDA ? dst_mem.device : src_mem.device;
    return copy_on_stream(device, dptr(dst), dptr(src), len);
}

int ipc_get(const void *addr, IpcHandle *out) {
    AddrInfo info;
    int ret = query(addr, &info);
    if (ret <= 0) return ret ? ret : -FI_EINVAL;
    Enter in(info.mem.device);
    if ((ret = in.status())) return ret;
    CUipcMemHandle h;
    ret = check(g_cu.ipc_get_mem_handle(&h, static_cast<CUdeviceptr>(info.base)),
                "cuIpcGetMemHandle");
    if (ret) return ret;
    static_assert(sizeof h == sizeof out->bytes);
    memcpy(out->bytes, &h, sizeof h);
    return 0;
}

int ipc_open(uint64_t device, const IpcHandle &handle, void **mapped) {
    Enter in(device);
    int ret = in.status();
    if (ret) return ret;
    CUipcMemHandle h;
    memcpy(&h, handle.bytes, sizeof h);
    CUdeviceptr p = 0;
    ret = check(g_cu.ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                "cuIpcOpenMemHandle");
    if (ret) return ret;
    *mapped = reinterpret_cast<void *>(p);
    return 0;
}

int ipc_close(uint64_t device, void *mapped) {
    Enter in(device);
    if (int ret = in.status()) return ret;
    return check(g_cu.ipc_close_mem_handle(dptr(mapped)), "cuIpcCloseMemHandle");
}

int dmabuf(const void *addr, size_t len, int *fd, uint64_t *offset) {
    AddrInfo info;
    int ret = query(addr, &info);
    if (ret <= 0) return ret ? ret : -FI_EINVAL;
    auto a = reinterpret_cast<uintptr_t>(addr);
    if (a + len > info.base + info.length) return -FI_EINVAL;
    Enter in(info.mem.device);
    if ((ret = in.status())) return ret;
    int supported = 0;
    CUdevice dev = static_cast<CUdevice>(info.mem.device);
    if (g_cu.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) !=
            CUDA_SUCCESS ||
        !supported)
        return -FI_EOPNOTSUPP;
    // dma-buf exports whole pages: the allocation from its base, its size rounded up to a
    // page, and addr's offset in it.
    const size_t page = 4096;
    size_t span = (info.length + page - 1) & ~(page - 1);
    int out = -1;
    ret = check(g_cu.mem_get_handle_for_address_range(&out, static_cast<CUdeviceptr>(info.base),
                                                      span, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                "cuMemGetHandleForAddressRange");
    if (ret) return ret;
    *fd = out;
    *offset = a - info.base;
    return 0;
}

bool can_access_peer(uint64_t device, uint64_t peer) {
    if (device == peer) return true;
    int can = 0;
    return g_cu.device_can_access_peer(&can, static_cast<CUdevice>(device),
                                       static_cast<CUdevice>(peer)) == CUDA_SUCCESS &&
           can;
}

int synchronize(uint64_t device) {
    Enter in(device);
    if (int ret = in.status()) return ret;
    return check(g_cu.stream_synchronize(g_dev[device].stream), "cuStreamSynchronize");
}

// A trigger variable: its word in device memory, and an asynchronous read of it into `seen`
// on a stream of its own, whose end an event marks. The device writes the word from the
// application's streams; the read is never ordered after them, so it sees what has landed.
// `seen` is page-locked host memory: a copy into pageable memory would return only once done,
// which is the stall the watch exists to avoid.
struct Signal {
    uint64_t device;
    CUdeviceptr word = 0;
    CUstream stream = nullptr;
    CUevent event = nullptr;
    uint64_t *seen = nullptr;
    bool reading = false;
};

void signal_close(void *state) {
    auto *sig = static_cast<Signal *>(state);
    if (!sig) return;
    Enter in(sig->device);
    if (!in.status()) {
        if (sig->stream) g_cu.stream_synchronize(sig->stream);  // (the read writes `seen`)
        if (sig->event) g_cu.event_destroy(sig->event);
        if (sig->stream) g_cu.stream_destroy(sig->stream);
        if (sig->word) g_cu.mem_free(sig->word);
        if (sig->seen) g_cu.mem_free_host(sig->seen);
    }
    delete sig;
}

int signal_open(uint64_t device, void **word, void **state) {
    Enter in(device);
    if (int ret = in.status()) return ret;
    auto *sig = new Signal{device};
    const uint64_t zero = 0;
    void *seen = nullptr;
    int ret = check(g_cu.mem_alloc(&sig->word, sizeof zero), "cuMemAlloc");
    if (!ret) ret = check(g_cu.mem_host_alloc(&seen, sizeof zero, 0), "cuMemHostAlloc");
    sig->seen = static_cast<uint64_t *>(seen);
    if (!ret) ret = check(g_cu.memcpy_htod(sig->word, &zero, sizeof zero), "cuMemcpyHtoD");
    if (!ret)
        ret = check(g_cu.stream_create(&sig->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    if (!ret) ret = check(g_cu.event_create(&sig->event, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (ret) {
        signal_close(sig);
        return ret;
    }
    *word = reinterpret_cast<void *>(sig->word);
    *state = sig;
    return 0;
}

int signal_poll(void *state, uint64_t *value) {
    auto *sig = static_cast<Signal *>(state);
    Enter in(sig->device);
    if (int ret = in.status()) return ret;
    int done = 0;
    if (sig->reading) {
        CUresult r = g_cu.event_query(sig->event);
        if (r == CUDA_ERROR_NOT_READY) return 0;
        if (int ret = check(r, "cuEventQuery")) return ret;
        sig->reading = false;
        *value = __atomic_load_n(sig->seen, __ATOMIC_ACQUIRE);
        done = 1;
    }
    int ret = check(g_cu.memcpy_async(dptr(sig->seen), sig->word, sizeof *sig->seen, sig->stream),
                    "cuMemcpyAsync");
    if (!ret) ret = check(g_cu.event_record(sig->event, sig->stream), "cuEventRecord");
    if (ret) return ret;
    sig->reading = true;
    return done;
}

}  // namespace

const IfaceOps kCudaOps = {
    FI_HMEM_CUDA,    "cuda",      query,       copy_to_host, copy_from_host,
    copy_device,     ipc_get,     ipc_open,    ipc_close,    dmabuf,
    can_access_peer, synchronize, signal_open, signal_poll,  signal_close,
};

bool cuda_load(int *devices, const char **why) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        *why = "the CUDA driver (libcuda.so.1) is not installed";
        return false;
    }
    Driver cu;
    std::string missing;
    if (!cu.resolve(lib, &missing)) {
        TANDEM_WARN(FI_LOG_CORE, "libcuda.so.1 lacks%s: CUDA memory disabled\n", missing.c_str());
        *why = "the CUDA driver lacks a call tandem needs";
        dlclose(lib);
        return false;
    }
    g_cu = cu;
    int count = 0;
    CUresult r = g_cu.init(0);
    if (r == CUDA_SUCCESS) r = g_cu.device_get_count(&count);
    if (r != CUDA_SUCCESS || count <= 0) {
        TANDEM_INFO(FI_LOG_CORE, "CUDA driver loaded but no device (%s)\n",
                    r == CUDA_SUCCESS ? "0 devices" : error_name(r));
        *why = "no CUDA device";
        return false;  // the library stays loaded: unloading a driver is never safe
    }
    g_devices = count < kMaxDevices ? count : kMaxDevices;
    *devices = g_devices;
    return true;
}

}  // namespace tandem::hmem

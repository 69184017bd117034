// libfabric and the CUDA driver as the FI_HMEM suites load them (tests/hmem/test_hmem_transfer.cpp,
// test_hmem_atomic.cpp, test_hmem_trigger.cpp): with dlopen, in the test's role processes only,
// never in the gtest process, so that the providers and the driver initialise in each role
// separately and a skipped test costs nothing (loading the system libfabric takes 0.2 s here: a
// library it depends on, libinfinipath, sleeps in its constructor). What the suites share:
//   - libfabric's exported calls (the other fi_* calls are inline wrappers of the ops tables),
//     and trampolines that load it at their first call;
//   - the driver (tandem::hmem::CudaDriverCalls, and the emulator's test controls where the
//     driver is tests/emucuda), and device 0's memory moved only with the driver's copies (the
//     emulator's device memory is PROT_NONE: the CPU touching it kills the process);
//   - the gtest process's question "is there a usable device", asked in a child, and the
//     macro that skips a test without one;
//   - pattern(i, seed), the bytes the suites write and check;
//   - which path the ctest variant runs (net_variant()), and the names of the P2P modes.
#pragma once

#include "hmem/cuda_abi.h"
#include "tests/emucuda/emucuda_control.h"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace tandem_test {

namespace hmem_detail {
template <typename... A>
std::string cat(const A &...a) {
    std::ostringstream o;
    (o << ... << a);
    return o.str();
}
}  // namespace hmem_detail

// ---- libfabric ----------------------------------------------------------------------------------

struct LibfabricCalls {
    decltype(&fi_getinfo) getinfo = nullptr;
    decltype(&fi_freeinfo) freeinfo = nullptr;
    decltype(&fi_dupinfo) dupinfo = nullptr;
    decltype(&fi_fabric) fabric = nullptr;
    decltype(&fi_strerror) strerror = nullptr;
};

// The calls of this process, loaded at the first use (all of them, or none).
inline const LibfabricCalls &libfabric() {
    static const LibfabricCalls lf = [] {
        LibfabricCalls l;
        // Global, as if linked: providers resolve their libfabric symbols against it.
        void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            fprintf(stderr, "dlopen(libfabric.so.1): %s\n", dlerror());
            return l;
        }
        l.getinfo = reinterpret_cast<decltype(l.getinfo)>(dlsym(h, "fi_getinfo"));
        l.freeinfo = reinterpret_cast<decltype(l.freeinfo)>(dlsym(h, "fi_freeinfo"));
        l.dupinfo = reinterpret_cast<decltype(l.dupinfo)>(dlsym(h, "fi_dupinfo"));
        l.fabric = reinterpret_cast<decltype(l.fabric)>(dlsym(h, "fi_fabric"));
        l.strerror = reinterpret_cast<decltype(l.strerror)>(dlsym(h, "fi_strerror"));
        if (!l.getinfo || !l.freeinfo || !l.dupinfo || !l.fabric || !l.strerror) l = {};
        return l;
    }();
    return lf;
}

// Trampolines: they load libfabric at their first call, so that a table of them can be made in
// the gtest process without loading anything.
inline int lf_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                      const fi_info *hints, fi_info **info) {
    auto f = libfabric().getinfo;
    return f ? f(version, node, service, flags, hints, info) : -FI_ENOSYS;
}
inline void lf_freeinfo(fi_info *info) {
    if (auto f = libfabric().freeinfo) f(info);
}
inline fi_info *lf_dupinfo(const fi_info *info) {
    auto f = libfabric().dupinfo;
    return f ? f(info) : nullptr;
}
inline int lf_fabric(fi_fabric_attr *attr, fid_fabric **fabric, void *context) {
    auto f = libfabric().fabric;
    return f ? f(attr, fabric, context) : -FI_ENOSYS;
}
inline const char *lf_strerror(int err) {
    auto f = libfabric().strerror;
    return f ? f(err) : "(libfabric.so.1 could not be loaded)";
}

// The calls as a table of another type with the same five members in the same order
// (atomic_procs::Lib of tests/common/atomic_processes.h; a template, so that this header needs
// not include it): the loaded ones, made at the first call ...
template <typename Table>
const Table &libfabric_table() {
    static const Table t{libfabric().getinfo, libfabric().freeinfo, libfabric().dupinfo,
                         libfabric().fabric, libfabric().strerror};
    return t;
}

// ... or the trampolines.
template <typename Table>
Table lazy_libfabric_table() {
    return Table{lf_getinfo, lf_freeinfo, lf_dupinfo, lf_fabric, lf_strerror};
}

// ---- the CUDA driver ----------------------------------------------------------------------------

struct CudaDriver : tandem::hmem::CudaDriverCalls {
    // The emulator's test controls; null with a real driver.
    decltype(&emucuda_get_stats) get_stats = nullptr;
    decltype(&emucuda_reset_stats) reset_stats = nullptr;
    decltype(&emucuda_set_ipc_enabled) set_ipc_enabled = nullptr;
    decltype(&emucuda_set_peer_access) set_peer_access = nullptr;

    bool usable = false;  // cuInit works and there is a device
    int devices = 0;
    std::string why;         // why not usable
    CUcontext ctx[16] = {};  // the primary contexts retained, by device
    bool emulated() const { return get_stats != nullptr; }
};

inline CudaDriver load_cuda_driver() {
    using hmem_detail::cat;
    CudaDriver d;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        d.why = cat("no CUDA driver (libcuda.so.1 not found: ", e ? e : "?", ")");
        return d;
    }
    std::string missing;
    if (!d.resolve(h, &missing)) {
        d.why = cat("the CUDA driver lacks calls tandem uses:", missing);
        return d;
    }
    d.get_stats = reinterpret_cast<decltype(d.get_stats)>(dlsym(h, "emucuda_get_stats"));
    d.reset_stats = reinterpret_cast<decltype(d.reset_stats)>(dlsym(h, "emucuda_reset_stats"));
    d.set_ipc_enabled =
        reinterpret_cast<decltype(d.set_ipc_enabled)>(dlsym(h, "emucuda_set_ipc_enabled"));
    d.set_peer_access =
        reinterpret_cast<decltype(d.set_peer_access)>(dlsym(h, "emucuda_set_peer_access"));
    if (!d.reset_stats || !d.set_ipc_enabled || !d.set_peer_access) d.get_stats = nullptr;
    if (CUresult rc = d.init(0); rc != CUDA_SUCCESS) {
        d.why = cat("no usable CUDA driver (cuInit gives ", rc, ")");
        return d;
    }
    if (CUresult rc = d.device_get_count(&d.devices); rc != CUDA_SUCCESS || d.devices <= 0) {
        d.why = cat("no CUDA device (cuDeviceGetCount gives ", rc, ", ", d.devices, " devices)");
        return d;
    }
    d.usable = true;
    return d;
}

// The driver of this process, loaded at the first use (in a role's process, never in the gtest
// process itself).
inline CudaDriver &cuda_driver() {
    static CudaDriver d = load_cuda_driver();
    return d;
}

// Retains the primary context of `device` into d.ctx (once): "" or what went wrong.
inline std::string retain_primary_context(CudaDriver &d, int device) {
    using hmem_detail::cat;
    if (d.ctx[device]) return std::string();
    CUdevice dev;
    if (CUresult rc = d.device_get(&dev, device); rc != CUDA_SUCCESS)
        return cat("cuDeviceGet(", device, ") gives ", rc);
    if (CUresult rc = d.primary_ctx_retain(&d.ctx[device], dev); rc != CUDA_SUCCESS)
        return cat("cuDevicePrimaryCtxRetain gives ", rc);
    return std::string();
}

// Device 0's primary context current on this thread: "" or why not (the driver unusable, the
// context not to be had).
inline std::string use_device0() {
    CudaDriver &d = cuda_driver();
    if (!d.usable) return d.why;
    if (std::string err = retain_primary_context(d, 0); !err.empty()) return err;
    if (CUresult rc = d.ctx_set_current(d.ctx[0]); rc != CUDA_SUCCESS)
        return hmem_detail::cat("cuCtxSetCurrent gives ", rc);
    return std::string();
}

// Device 0's memory as a role's Memory (atomic_procs::Memory of tests/common/atomic_processes.h,
// a template as libfabric_table), moved only with the driver's copies; allocations start zeroed.
// Its init makes device 0's context current.
template <typename Memory>
Memory device0_memory() {
    using hmem_detail::cat;
    Memory m;
    m.name = "device";
    m.iface = FI_HMEM_CUDA;
    m.device = 0;
    m.init = use_device0;
    m.alloc = [](size_t len, void **p) {
        CUdeviceptr d = 0;
        if (CUresult rc = cuda_driver().mem_alloc(&d, len); rc != CUDA_SUCCESS)
            return cat("cuMemAlloc(", len, ") gives ", rc);
        *p = reinterpret_cast<void *>(d);
        std::vector<uint8_t> zero(len, 0);
        if (CUresult rc = cuda_driver().memcpy_htod(d, zero.data(), len); rc != CUDA_SUCCESS)
            return cat("cuMemcpyHtoD gives ", rc);
        return std::string();
    };
    m.release = [](void *p) { cuda_driver().mem_free(reinterpret_cast<CUdeviceptr>(p)); };
    m.put = [](void *dst, const void *src, size_t n) {
        if (CUresult rc = cuda_driver().memcpy_htod(reinterpret_cast<CUdeviceptr>(dst), src, n);
            rc != CUDA_SUCCESS)
            return cat("cuMemcpyHtoD(", n, " B) gives ", rc);
        return std::string();
    };
    m.get = [](void *dst, const void *src, size_t n) {
        if (CUresult rc = cuda_driver().memcpy_dtoh(dst, reinterpret_cast<CUdeviceptr>(src), n);
            rc != CUDA_SUCCESS)
            return cat("cuMemcpyDtoH(", n, " B) gives ", rc);
        return std::string();
    };
    return m;
}

// ---- what the gtest process knows about the driver (asked in a child) ---------------------------

// What a suite calls a usable device.
enum class DeviceNeed {
    kAny,             // the driver loads, cuInit works, there is a device
    kDevice0Context,  // that, and device 0's primary context (the memory the suite uses)
};

struct DeviceProbe {
    bool usable = false;
    bool emulated = false;
    int devices = 0;
    std::string why;  // why not usable
};

// Forks a child that loads the driver and answers through a pipe: the gtest process loads
// nothing.
inline DeviceProbe probe_device(DeviceNeed need) {
    DeviceProbe out;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        out.why = "pipe failed";
        return out;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        ::close(fds[0]);
        CudaDriver &d = cuda_driver();
        bool usable = d.usable;
        std::string why = d.why;
        if (usable && need == DeviceNeed::kDevice0Context) {
            why = retain_primary_context(d, 0);
            usable = why.empty();
        }
        std::string msg =
            hmem_detail::cat(usable ? 1 : 0, ' ', d.emulated() ? 1 : 0, ' ', d.devices, ' ', why);
        if (::write(fds[1], msg.data(), msg.size()) < 0) _exit(2);
        _exit(0);
    }
    ::close(fds[1]);
    std::string msg;
    char buf[512];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, size_t(n));
    ::close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    std::istringstream in(msg);
    int usable = 0, emulated = 0;
    if (!(in >> usable >> emulated >> out.devices)) {
        out.why = "the driver probe process failed";
        return out;
    }
    out.usable = usable;
    out.emulated = emulated;
    std::getline(in >> std::ws, out.why);
    return out;
}

// The answer for this process, asked at the first call.
template <DeviceNeed kNeed>
const DeviceProbe &device_probe() {
    static const DeviceProbe p = probe_device(kNeed);
    return p;
}

// Skips the test, with the reason, when `probe` (a DeviceProbe) has no usable device.
#define HMEM_REQUIRE_DEVICE(probe)                          \
    do {                                                    \
        const ::tandem_test::DeviceProbe &probe_ = (probe); \
        if (!probe_.usable) GTEST_SKIP() << probe_.why;     \
    } while (0)

// ---- the bytes the suites write ----------------------------------------------------------------

inline uint8_t pattern(size_t i, uint32_t seed) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + seed * 0x632BE5ABull;
    x ^= x >> 29;
    return static_cast<uint8_t>(x ^ (x >> 11) ^ (i >> 8));
}

// ---- the path and the P2P modes -----------------------------------------------------------------

// FI_TANDEM_LOCAL=0 (ctest's hmem.emu_net.*): tandem's node-local path is off, the processes talk
// over the TCP link, which stages all device memory and can do no P2P.
inline bool net_variant() {
    const char *v = getenv("FI_TANDEM_LOCAL");
    return v && strcmp(v, "0") == 0;
}

// FI_TANDEM_LINK=verbs (ctest's hmem.emu_verbs.*): the processes talk over the verbs link on
// the emulated RDMA device, whose NIC reaches device memory through its dma-buf.
inline bool verbs_variant() {
    const char *v = getenv("FI_TANDEM_LINK");
    return net_variant() && v && strcmp(v, "verbs") == 0;
}

// A value of FI_OPT_FI_HMEM_P2P, by name.
inline const char *p2p_name(int mode) {
    switch (mode) {
        case FI_HMEM_P2P_ENABLED:
            return "ENABLED";
        case FI_HMEM_P2P_REQUIRED:
            return "REQUIRED";
        case FI_HMEM_P2P_PREFERRED:
            return "PREFERRED";
        case FI_HMEM_P2P_DISABLED:
            return "DISABLED";
        default:
            return "(not a mode)";
    }
}

}  // namespace tandem_test

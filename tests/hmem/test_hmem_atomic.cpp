// fi_atomic(3) on device memory (FI_HMEM, FI_MR_HMEM; buffers registered with fi_mr_regattr
// as FI_HMEM_CUDA) between processes:
//   - Placement.*: one initiator and a target; the operand, the compare values, the fetch
//     results, the target region, or all of them in device memory, each operation checked
//     against the host model of tests/common/atomic_reference.h;
//   - Processes.*: four initiators contend for a counter (fetch-add) and for a spin lock
//     (FI_CSWAP) in the target's device memory, fetching into their own device memory.
// Device memory is written and read back only with the driver's cuMemcpyHtoD / cuMemcpyDtoH
// (the emulator's device memory is PROT_NONE: the CPU touching it kills the process, which the
// test then reports with the address).
//
// Black-box as test_hmem_transfer.cpp: libfabric and the CUDA driver are loaded with dlopen in
// the role processes only (tests/common/atomic_processes.h forks them before any call), never
// in the gtest process. ctest variants: hmem.emu.atomic.* (the emulated driver, node-local
// path), hmem.emu_net.atomic.* (the same over the TCP link, FI_TANDEM_LOCAL=0),
// hmem.gpu.atomic.* (the real driver: without a GPU every test skips with the reason).
#include "hmem/cuda_abi.h"
#include "tests/common/atomic_processes.h"
#include "tests/common/atomic_reference.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

namespace {

using namespace tandem_test::atomic_procs;
namespace ref = tandem_test::atomic_ref;

// ---- libfabric and the driver, loaded in the role processes -------------------------------------

Lib load_libfabric() {
    Lib l;
    // Global, as if linked: the providers resolve their libfabric symbols against it.
    void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return l;
    l.getinfo = reinterpret_cast<decltype(l.getinfo)>(dlsym(h, "fi_getinfo"));
    l.freeinfo = reinterpret_cast<decltype(l.freeinfo)>(dlsym(h, "fi_freeinfo"));
    l.dupinfo = reinterpret_cast<decltype(l.dupinfo)>(dlsym(h, "fi_dupinfo"));
    l.fabric = reinterpret_cast<decltype(l.fabric)>(dlsym(h, "fi_fabric"));
    l.strerror = reinterpret_cast<decltype(l.strerror)>(dlsym(h, "fi_strerror"));
    return l;
}

// The libfabric calls of a role process: resolved at the first call (in the child).
Lib &lib() {
    static Lib l = load_libfabric();
    return l;
}
// Trampolines, so that a Lib can be made in the gtest process without loading anything.
int lf_getinfo(uint32_t v, const char *node, const char *service, uint64_t flags,
               const fi_info *hints, fi_info **info) {
    return lib().getinfo ? lib().getinfo(v, node, service, flags, hints, info) : -FI_ENOSYS;
}
void lf_freeinfo(fi_info *i) {
    if (lib().freeinfo) lib().freeinfo(i);
}
fi_info *lf_dupinfo(const fi_info *i) {
    return lib().dupinfo ? lib().dupinfo(i) : nullptr;
}
int lf_fabric(fi_fabric_attr *a, fid_fabric **f, void *c) {
    return lib().fabric ? lib().fabric(a, f, c) : -FI_ENOSYS;
}
const char *lf_strerror(int e) {
    return lib().strerror ? lib().strerror(e) : "(libfabric.so.1 could not be loaded)";
}
Lib lazy_libfabric() {
    Lib l;
    l.getinfo = lf_getinfo;
    l.freeinfo = lf_freeinfo;
    l.dupinfo = lf_dupinfo;
    l.fabric = lf_fabric;
    l.strerror = lf_strerror;
    return l;
}

struct Driver : tandem::hmem::CudaDriverCalls {
    bool usable = false;
    bool emulated = false;
    std::string why;  // why not usable
    CUcontext ctx = nullptr;
};

Driver load_driver() {
    Driver d;
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
    d.emulated = dlsym(h, "emucuda_get_stats") != nullptr;
    if (CUresult rc = d.init(0); rc != CUDA_SUCCESS) {
        d.why = cat("no usable CUDA driver (cuInit gives ", rc, ")");
        return d;
    }
    int devices = 0;
    if (CUresult rc = d.device_get_count(&devices); rc != CUDA_SUCCESS || devices <= 0) {
        d.why = cat("no CUDA device (cuDeviceGetCount gives ", rc, ", ", devices, " devices)");
        return d;
    }
    CUdevice dev;
    if (CUresult rc = d.device_get(&dev, 0); rc != CUDA_SUCCESS) {
        d.why = cat("cuDeviceGet(0) gives ", rc);
        return d;
    }
    if (CUresult rc = d.primary_ctx_retain(&d.ctx, dev); rc != CUDA_SUCCESS) {
        d.why = cat("cuDevicePrimaryCtxRetain gives ", rc);
        return d;
    }
    d.usable = true;
    return d;
}

Driver &driver() {
    static Driver d = load_driver();
    return d;
}

// Device memory of device 0, moved only by the driver's copies.
Memory device_memory() {
    Memory m;
    m.name = "device";
    m.iface = FI_HMEM_CUDA;
    m.device = 0;
    m.init = [] {
        Driver &d = driver();
        if (!d.usable) return d.why;
        if (CUresult rc = d.ctx_set_current(d.ctx); rc != CUDA_SUCCESS)
            return cat("cuCtxSetCurrent gives ", rc);
        return std::string();
    };
    m.alloc = [](size_t len, void **p) {
        CUdeviceptr d = 0;
        if (CUresult rc = driver().mem_alloc(&d, len); rc != CUDA_SUCCESS)
            return cat("cuMemAlloc(", len, ") gives ", rc);
        *p = reinterpret_cast<void *>(d);
        std::vector<uint8_t> zero(len, 0);
        if (CUresult rc = driver().memcpy_htod(d, zero.data(), len); rc != CUDA_SUCCESS)
            return cat("cuMemcpyHtoD gives ", rc);
        return std::string();
    };
    m.release = [](void *p) { driver().mem_free(reinterpret_cast<CUdeviceptr>(p)); };
    m.put = [](void *dst, const void *src, size_t n) {
        if (CUresult rc = driver().memcpy_htod(reinterpret_cast<CUdeviceptr>(dst), src, n);
            rc != CUDA_SUCCESS)
            return cat("cuMemcpyHtoD(", n, " B) gives ", rc);
        return std::string();
    };
    m.get = [](void *dst, const void *src, size_t n) {
        if (CUresult rc = driver().memcpy_dtoh(dst, reinterpret_cast<CUdeviceptr>(src), n);
            rc != CUDA_SUCCESS)
            return cat("cuMemcpyDtoH(", n, " B) gives ", rc);
        return std::string();
    };
    return m;
}

// Host memory for a process that also uses the device (the driver loaded all the same).
Memory host_memory() {
    return Memory{};
}

constexpr uint64_t kCaps =
    FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_HMEM;
constexpr int kMrMode = FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;

// ---- does this machine have a device (asked in a child) ----------------------------------------

struct Probe {
    bool usable = false;
    bool emulated = false;
    std::string why;
};

const Probe &probe() {
    static const Probe p = [] {
        Probe out;
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
            Driver &d = driver();
            std::string msg = cat(d.usable ? 1 : 0, ' ', d.emulated ? 1 : 0, ' ', d.why);
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
        if (!(in >> usable >> emulated)) {
            out.why = "the driver probe process failed";
            return out;
        }
        out.usable = usable;
        out.emulated = emulated;
        std::getline(in >> std::ws, out.why);
        return out;
    }();
    return p;
}

#define REQUIRE_DEVICE()                                  \
    do {                                                  \
        if (!probe().usable) GTEST_SKIP() << probe().why; \
    } while (0)

void report(const RunResult &r) {
    for (const auto &n : r.roles) printf("[atomic]   %s\n", n.c_str());
    for (const auto &n : r.notes) printf("%s\n", n.c_str());
    for (const auto &f : r.failures) ADD_FAILURE() << f;
}

// ---- one target, one initiator ----------------------------------------------------------------

// The initiator's part, in its process: the device's driver initialised, an endpoint open.
using InitiatorWork =
    std::function<void(Report &, Shared &, Node &, const Memory &dev, const Memory &host)>;

// Runs a target, its region in `target_mem`, and one initiator doing `work`; `what` says what the
// initiator does.
void run_one_initiator(const Memory &target_mem, const std::string &what, InitiatorWork work) {
    SharedBlock block;
    ASSERT_NE(block.get(), nullptr);
    Shared &sh = *block.get();
    TargetConfig t;
    t.lib = lazy_libfabric();
    t.mem = target_mem;
    t.caps = kCaps;
    t.mr_mode = kMrMode;
    t.sleep = false;
    auto initiator = [&sh, work](Report &r) {
        const Lib &lf = lib();
        AP_REQUIRE(r, lf.ok(), "libfabric could not be loaded");
        const Memory dev = device_memory(), host = host_memory();
        std::string err = dev.init();
        AP_REQUIRE(r, err.empty(), err);
        Node n(lf, r);
        AP_TRY(n.open(kCaps, kMrMode, false));
        work(r, sh, n, dev, host);
    };
    printf("[atomic] %s, path: %s\n", what.c_str(), path_name());
    fflush(stdout);
    RunResult r = run_roles({{cat("target (", t.mem.name, " memory, ", path_name(), ")"),
                              "at-target",
                              [t, &sh](Report &rep) { target_role(rep, sh, t); },
                              {}},
                             {cat("initiator (", what, ")"), "at-init-1", initiator, {}}},
                            sh, 30s);
    printf("[atomic] %.2f s\n", r.seconds);
    report(r);
}

// ---- Placement: one initiator, operations checked against the host model ---------------------

struct Placement {
    bool operand = false, compare = false, result = false, target = false;
    std::string str() const {
        return cat("operand in ", operand ? "device" : "host", ", compare in ",
                   compare ? "device" : "host", ", results in ", result ? "device" : "host",
                   ", target in ", target ? "device" : "host", " memory");
    }
};

// The datatypes a placement test runs every valid operation of (one of each width and kind).
constexpr int kPlacementTypes[] = {FI_INT8,          FI_UINT16,      FI_INT32,
                                   FI_UINT64,        FI_FLOAT,       FI_DOUBLE,
                                   FI_FLOAT_COMPLEX, FI_LONG_DOUBLE, FI_LONG_DOUBLE_COMPLEX,
                                   FI_INT128,        FI_UINT128};

constexpr uint64_t kTargetOff = 256;  // of the elements in the target's region

void placement_initiator(Report &r, Shared &sh, Node &n, const Memory &dev, const Memory &host,
                         const Placement &p) {
    RoleBuf operand(p.operand ? dev : host), compare(p.compare ? dev : host),
        result(p.result ? dev : host);
    AP_TRY(operand.make(r, n, 1024) && compare.make(r, n, 1024) && result.make(r, n, 1024));
    fi_addr_t peer;
    AP_TRY(connect_to_target(r, sh, n, &peer));
    ref::Call c;  // the buffers, the same for every operation
    c.operand = operand.p;
    c.odesc = operand.desc();
    c.compare = compare.p;
    c.cdesc = compare.desc();
    c.result = result.p;
    c.rdesc = result.desc();
    c.addr = sh.region_addr + kTargetOff;
    c.key = sh.region_key;
    int form = 0, ops = 0, failures = 0;
    fi_context2 ctx{};
    for (ref::Kind k : ref::kKinds) {
        // Only the kinds that use something this test put in device memory.
        if (!(p.operand || p.target || (p.compare && k == ref::Kind::Compare) ||
              (p.result && k != ref::Kind::Base)))
            continue;
        for (int dt : kPlacementTypes) {
            for (int op = 0; op < ref::kNumOps; ++op) {
                if (!ref::valid(k, op, dt)) continue;
                const size_t len = ref::element_size(dt) * ref::kCount;
                for (const ref::Case &cs : ref::cases(dt)) {
                    if (!ref::case_applies(dt, op, cs)) continue;
                    c.kind = k;
                    c.op = op;
                    c.dt = dt;
                    c.form = static_cast<ref::Form>(form++ % 3);
                    const std::string what =
                        cat(ref::kind_name(k), " (", ref::form_name(c.form), ") ", ref::op_name(op),
                            " ", ref::datatype_name(dt), " [", cs.name, "]: ");
                    std::vector<uint8_t> t = cs.target;
                    AP_TRY(target_request(r, sh, kCmdSet, kTargetOff, t.data(), len));
                    AP_REQUIRE(r, operand.m.put(operand.p, cs.operand.data(), len).empty());
                    AP_REQUIRE(r, compare.m.put(compare.p, cs.compare.data(), len).empty());
                    std::vector<uint8_t> stale(1024, 0xCD);
                    AP_REQUIRE(r, result.m.put(result.p, stale.data(), stale.size()).empty());
                    AP_TRY(n.run(what.c_str(), &ctx,
                                 [&] { return ref::issue_call(n.ep, peer, c, &ctx); }));
                    ++ops;
                    std::vector<uint8_t> want_t = cs.target;
                    std::vector<uint8_t> want_r =
                        ref::reference(dt, op, want_t, cs.operand, cs.compare);
                    std::vector<uint8_t> got_t(len), got_r(1024);
                    AP_TRY(target_request(r, sh, kCmdGet, kTargetOff, got_t.data(), len));
                    std::string d = ref::diff(dt, got_t.data(), want_t.data(), ref::kCount);
                    if (!d.empty() && ++failures <= 30) AP_FAIL(r, what, "target: ", d);
                    std::string err = result.m.get(got_r.data(), result.p, got_r.size());
                    AP_REQUIRE(r, err.empty(), "reading the results back: ", err);
                    if (k != ref::Kind::Base) {
                        d = ref::diff(dt, got_r.data(), want_r.data(), ref::kCount);
                        if (!d.empty() && ++failures <= 30) AP_FAIL(r, what, "fetched: ", d);
                    }
                    for (size_t i = (k == ref::Kind::Base ? 0 : len); i < got_r.size(); ++i) {
                        if (got_r[i] != 0xCD) {
                            if (++failures <= 30)
                                AP_FAIL(r, what, "result buffer byte ", i, " written");
                            break;
                        }
                    }
                }
            }
        }
    }
    AP_CHECK(r, failures == 0, failures, " of ", ops, " operations wrong (the first 30 above)");
    AP_CHECK(r, ops > 50, "only ", ops, " operations ran");
    r.note(cat(ops, " operations checked"));
}

void run_placement(const Placement &p) {
    REQUIRE_DEVICE();
    run_one_initiator(p.target ? device_memory() : host_memory(), p.str(),
                      [p](Report &r, Shared &sh, Node &n, const Memory &dev, const Memory &host) {
                          placement_initiator(r, sh, n, dev, host, p);
                      });
}

TEST(Placement, OperandInDeviceMemory) {
    run_placement({.operand = true});
}
TEST(Placement, CompareValuesInDeviceMemory) {
    run_placement({.compare = true});
}
TEST(Placement, FetchResultsInDeviceMemory) {
    run_placement({.result = true});
}
TEST(Placement, TargetInDeviceMemory) {
    run_placement({.target = true});
}
TEST(Placement, EverythingInDeviceMemory) {
    run_placement({true, true, true, true});
}

// fi_inject_atomic carries no descriptor: the provider finds out itself that the operand is
// device memory (and copies it with the device, never the CPU, which would fault on the
// emulated driver's memory). Ten injects of {1, 2, 3, 4}, then an FI_ATOMIC_READ posted behind
// them (FI_ORDER_ATOMIC_RAW) must read ten times that.
void inject_initiator(Report &r, Shared &sh, Node &n, const Memory &dev, const Memory &host) {
    RoleBuf operand(dev), result(host);
    AP_TRY(operand.make(r, n, 1024) && result.make(r, n, 1024));
    fi_addr_t peer;
    AP_TRY(connect_to_target(r, sh, n, &peer));
    const uint64_t adds[4] = {1, 2, 3, 4};
    uint64_t zero[4] = {};
    AP_TRY(target_request(r, sh, kCmdSet, kTargetOff, zero, sizeof zero));
    AP_REQUIRE(r, operand.m.put(operand.p, adds, sizeof adds).empty());
    const uint64_t addr = sh.region_addr + kTargetOff;
    for (int i = 0; i < 10; ++i) {
        ssize_t ret;
        while ((ret = fi_inject_atomic(n.ep, operand.p, 4, peer, addr, sh.region_key, FI_UINT64,
                                       FI_SUM)) == -FI_EAGAIN)
            n.progress();
        AP_REQUIRE(r, ret == 0, "fi_inject_atomic from device memory returned ", ret);
    }
    fi_context2 ctx{};
    AP_TRY(n.run("an FI_ATOMIC_READ behind the injects", &ctx, [&] {
        return fi_fetch_atomic(n.ep, nullptr, 4, nullptr, result.p, result.desc(), peer, addr,
                               sh.region_key, FI_UINT64, FI_ATOMIC_READ, &ctx);
    }));
    uint64_t got[4] = {};
    AP_REQUIRE(r, result.m.get(got, result.p, sizeof got).empty());
    for (int i = 0; i < 4; ++i)
        AP_CHECK(r, got[i] == 10 * adds[i], "element ", i, ": ", got[i], ", expected ",
                 10 * adds[i]);
}

TEST(Inject, OperandInDeviceMemoryWithoutADescriptor) {
    REQUIRE_DEVICE();
    run_one_initiator(host_memory(), "inject from device memory", inject_initiator);
}

// ---- Processes: contention for device memory -------------------------------------------------

void run_contention_on_device(Workload w, size_t ops, const char *what) {
    Contention cfg;
    cfg.lib = lazy_libfabric();
    cfg.target_mem = device_memory();
    cfg.result_mem = device_memory();
    cfg.caps |= FI_HMEM;
    cfg.mr_mode |= FI_MR_HMEM;
    cfg.ops = ops;
    SharedBlock block;
    ASSERT_NE(block.get(), nullptr);
    for (const auto &f : run_and_check_contention(cfg, w, what, block)) ADD_FAILURE() << f;
}

TEST(Processes, FourProcessesFetchAddADeviceCounter10000TimesEach) {
    REQUIRE_DEVICE();
    run_contention_on_device(Workload::FetchAdd, 10000, "fetch-add");
}

TEST(Processes, CswapSpinLockInDeviceMemoryGuardsAPlainCounter) {
    REQUIRE_DEVICE();
    run_contention_on_device(Workload::SpinLock, 2000, "spin lock");
}

}  // namespace

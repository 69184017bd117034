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
// Black-box as test_hmem_transfer.cpp: libfabric and the CUDA driver are loaded with dlopen
// (tests/common/hmem_driver.h) in the role processes only (tests/common/atomic_processes.h forks
// them before any call), never in the gtest process. ctest variants: hmem.emu.atomic.* (the
// emulated driver, node-local path), hmem.emu_net.atomic.* (the same over the TCP link,
// FI_TANDEM_LOCAL=0), hmem.gpu.atomic.* (the real driver: without a GPU every test skips with the
// reason).
#include "tests/common/atomic_processes.h"
#include "tests/common/atomic_reference.h"
#include "tests/common/hmem_driver.h"

#include <gtest/gtest.h>

namespace {

using namespace tandem_test;
using namespace tandem_test::atomic_procs;
namespace ref = tandem_test::atomic_ref;

// Host memory for a process that also uses the device (the driver loaded all the same).
Memory host_memory() {
    return Memory{};
}

constexpr uint64_t kCaps =
    FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_HMEM;
constexpr int kMrMode = FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;

// Device 0's memory is the device memory of every test here.
#define REQUIRE_DEVICE() HMEM_REQUIRE_DEVICE(device_probe<DeviceNeed::kDevice0Context>())

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
    t.lib = lazy_libfabric_table<Lib>();
    t.mem = target_mem;
    t.caps = kCaps;
    t.mr_mode = kMrMode;
    t.sleep = false;
    auto initiator = [&sh, work](Report &r) {
        const Lib &lf = libfabric_table<Lib>();
        AP_REQUIRE(r, lf.ok(), "libfabric could not be loaded");
        const Memory dev = device0_memory<Memory>(), host = host_memory();
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
    run_one_initiator(p.target ? device0_memory<Memory>() : host_memory(), p.str(),
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
    cfg.lib = lazy_libfabric_table<Lib>();
    cfg.target_mem = device0_memory<Memory>();
    cfg.result_mem = device0_memory<Memory>();
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

// fi_atomic(3) between processes, in host memory: four initiator processes fetch-add one
// counter of a fifth, the target, and four processes serialise increments of a plain counter
// with a spin lock taken by FI_CSWAP. The roles and the checks are in
// tests/common/atomic_processes.h (tests/hmem/test_hmem_atomic.cpp runs the same on device
// memory).
//
// ctest runs the suite twice: peer.atomic_processes.local.* over tandem's node-local path
// (off_tandem's shared memory), peer.atomic_processes.net.* over its TCP link
// (FI_TANDEM_LOCAL=0). The test's output names the path and the time taken.
#include "tests/common/atomic_processes.h"

#include <gtest/gtest.h>

namespace {

using namespace tandem_test::atomic_procs;

Lib linked_libfabric() {
    Lib l;
    l.getinfo = &fi_getinfo;
    l.freeinfo = &fi_freeinfo;
    l.dupinfo = &fi_dupinfo;
    l.fabric = &fi_fabric;
    l.strerror = &fi_strerror;
    return l;
}

void run_and_check(Contention &cfg, Workload w, const char *what) {
    SharedBlock block;
    ASSERT_NE(block.get(), nullptr) << "mmap of the shared block failed";
    printf("[atomic] %s: %d initiator processes x %zu, host memory, path: %s\n", what,
           cfg.initiators, cfg.ops, cfg.initiator_env.empty() ? path_name() : "mixed");
    fflush(stdout);
    RunResult r = run_contention(cfg, w, block);
    printf("[atomic] %s: %.2f s\n", what, r.seconds);
    if (w == Workload::SpinLock) {
        uint64_t busy = 0;
        for (int i = 0; i < cfg.initiators; ++i) busy += block->busy[i];
        printf("[atomic] the lock was found taken %llu times\n",
               static_cast<unsigned long long>(busy));
    }
    for (const auto &n : r.notes) printf("%s\n", n.c_str());
    for (const auto &n : r.roles) printf("[atomic]   %s\n", n.c_str());
    for (const auto &f : r.failures) ADD_FAILURE() << f;
    if (!r.failures.empty()) return;
    for (const auto &b : check_contention(cfg, w, *block.get())) ADD_FAILURE() << b;
}

TEST(AtomicProcesses, FourProcessesFetchAddOneCounter10000TimesEach) {
    Contention cfg;
    cfg.lib = linked_libfabric();
    cfg.ops = 10000;
    run_and_check(cfg, Workload::FetchAdd, "fetch-add");
}

TEST(AtomicProcesses, CswapSpinLockGuardsAPlainCounter) {
    Contention cfg;
    cfg.lib = linked_libfabric();
    cfg.ops = 2000;
    run_and_check(cfg, Workload::SpinLock, "spin lock");
}

// Two initiators on the node-local path and two over the TCP link at once, whatever the
// variant: the target applies both kinds of requests to one counter, atomically.
TEST(AtomicProcesses, FetchAddFromBothPathsAtOnce) {
    Contention cfg;
    cfg.lib = linked_libfabric();
    cfg.ops = 10000;
    cfg.target_env = {{"FI_TANDEM_LOCAL", "1"}};
    cfg.initiator_env = {{{"FI_TANDEM_LOCAL", "1"}},
                         {{"FI_TANDEM_LOCAL", "0"}},
                         {{"FI_TANDEM_LOCAL", "1"}},
                         {{"FI_TANDEM_LOCAL", "0"}}};
    run_and_check(cfg, Workload::FetchAdd, "fetch-add over both paths");
}

TEST(AtomicProcesses, CswapSpinLockFromBothPathsAtOnce) {
    Contention cfg;
    cfg.lib = linked_libfabric();
    cfg.ops = 2000;
    cfg.target_env = {{"FI_TANDEM_LOCAL", "1"}};
    cfg.initiator_env = {{{"FI_TANDEM_LOCAL", "0"}},
                         {{"FI_TANDEM_LOCAL", "1"}},
                         {{"FI_TANDEM_LOCAL", "0"}},
                         {{"FI_TANDEM_LOCAL", "1"}}};
    run_and_check(cfg, Workload::SpinLock, "spin lock over both paths");
}

}  // namespace

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

// A workload in host memory. `local`: each initiator's FI_TANDEM_LOCAL in turn, the target's
// "1"; empty: every process on the variant's path.
void run_and_check(Workload w, size_t ops, const char *what,
                   const std::vector<const char *> &local = {}) {
    Contention cfg;
    cfg.lib = linked_libfabric();
    cfg.ops = ops;
    if (!local.empty()) cfg.target_env = {{"FI_TANDEM_LOCAL", "1"}};
    for (const char *v : local) cfg.initiator_env.push_back({{"FI_TANDEM_LOCAL", v}});
    SharedBlock block;
    ASSERT_NE(block.get(), nullptr) << "mmap of the shared block failed";
    for (const auto &f : run_and_check_contention(cfg, w, what, block)) ADD_FAILURE() << f;
}

TEST(AtomicProcesses, FourProcessesFetchAddOneCounter10000TimesEach) {
    run_and_check(Workload::FetchAdd, 10000, "fetch-add");
}

TEST(AtomicProcesses, CswapSpinLockGuardsAPlainCounter) {
    run_and_check(Workload::SpinLock, 2000, "spin lock");
}

// Two initiators on the node-local path and two over the TCP link at once, whatever the
// variant: the target applies both kinds of requests to one counter, atomically.
TEST(AtomicProcesses, FetchAddFromBothPathsAtOnce) {
    run_and_check(Workload::FetchAdd, 10000, "fetch-add over both paths", {"1", "0", "1", "0"});
}

TEST(AtomicProcesses, CswapSpinLockFromBothPathsAtOnce) {
    run_and_check(Workload::SpinLock, 2000, "spin lock over both paths", {"0", "1", "0", "1"});
}

}  // namespace

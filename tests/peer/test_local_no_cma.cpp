// Node-local RMA where cross-memory attach is not allowed: the case of a container without
// CAP_SYS_PTRACE (Docker's default seccomp profile refuses process_vm_readv/writev), here
// forced with FI_OFF_TANDEM_CMA=0 (read when the provider loads). Reads and writes then travel
// in cells, and the target must serve them: a Read cell that names no memory of the initiator
// (no iov: the data comes back in ReadData cells) asks for no cross-memory attach, and was once
// refused as if it did (every node-local fi_read failed with FI_EACCES in such a container).
#include "tests/common/rdm_endpoint.h"

#include <gtest/gtest.h>

#include <rdma/fi_rma.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

const int g_env = setenv("FI_OFF_TANDEM_CMA", "0", 1) | setenv("FI_TANDEM_LOCAL", "1", 1);

using Rdm = tandem_test::RdmEndpoint;

uint8_t pattern(size_t i, uint8_t seed) {
    return static_cast<uint8_t>((i * 131 + seed) ^ (i >> 8));
}

class LocalRmaWithoutCma : public ::testing::TestWithParam<size_t> {
  protected:
    void SetUp() override {
        ASSERT_EQ(g_env, 0);
        ASSERT_NO_FATAL_FAILURE(initiator.open(FI_MSG | FI_RMA));
        ASSERT_NO_FATAL_FAILURE(target.open(FI_MSG | FI_RMA));
        dest = initiator.insert(target);
        const size_t len = GetParam();
        region.resize(len);
        local.resize(len);
        ASSERT_EQ(fi_mr_reg(target.domain, region.data(), len, FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                            7, 0, &region_mr, nullptr),
                  0);
        ASSERT_EQ(fi_mr_reg(initiator.domain, local.data(), len, FI_READ | FI_WRITE, 0, 8, 0,
                            &local_mr, nullptr),
                  0);
    }
    void TearDown() override {
        if (local_mr) fi_close(&local_mr->fid);
        if (region_mr) fi_close(&region_mr->fid);
        initiator.close();
        target.close();
    }
    uint64_t remote_addr() const {
        return (target.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
                   ? reinterpret_cast<uint64_t>(region.data())
                   : 0;
    }
    // Drives both sides until the initiator's completion of ctx; the number of error
    // completions it saw (0 expected).
    size_t wait_for(void *ctx) {
        std::vector<void *> done, ignored;
        size_t errors = 0, target_errors = 0;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < deadline && errors == 0) {
            initiator.poll(done, errors);
            target.poll(ignored, target_errors);
            for (void *c : done)
                if (c == ctx) return errors;
        }
        return errors ? errors : SIZE_MAX;
    }
    Rdm initiator, target;
    fi_addr_t dest = FI_ADDR_NOTAVAIL;
    std::vector<uint8_t> region, local;
    fid_mr *region_mr = nullptr, *local_mr = nullptr;
};

TEST_P(LocalRmaWithoutCma, ReadBringsTheRegionBack) {
    for (size_t i = 0; i < region.size(); ++i) region[i] = pattern(i, 11);
    int ctx = 0;
    ASSERT_EQ(fi_read(initiator.ep, local.data(), local.size(), fi_mr_desc(local_mr), dest,
                      remote_addr(), fi_mr_key(region_mr), &ctx),
              0);
    ASSERT_EQ(wait_for(&ctx), 0u) << "the read's completion (0: it completed without error)";
    size_t wrong = 0;
    for (size_t i = 0; i < local.size(); ++i) wrong += local[i] != pattern(i, 11);
    EXPECT_EQ(wrong, 0u);
}

TEST_P(LocalRmaWithoutCma, WriteReachesTheRegion) {
    for (size_t i = 0; i < local.size(); ++i) local[i] = pattern(i, 23);
    int ctx = 0;
    ASSERT_EQ(fi_write(initiator.ep, local.data(), local.size(), fi_mr_desc(local_mr), dest,
                       remote_addr(), fi_mr_key(region_mr), &ctx),
              0);
    ASSERT_EQ(wait_for(&ctx), 0u);
    // The write's completion means the target has the data (delivered into the region).
    std::vector<void *> ignored;
    size_t errors = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    size_t wrong = region.size();
    while (wrong && std::chrono::steady_clock::now() < deadline) {
        target.poll(ignored, errors);
        wrong = 0;
        for (size_t i = 0; i < region.size(); ++i) wrong += region[i] != pattern(i, 23);
    }
    EXPECT_EQ(wrong, 0u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, LocalRmaWithoutCma, ::testing::Values(64, 256 * 1024),
                         [](const ::testing::TestParamInfo<size_t> &p) {
                             return p.param == 64 ? std::string("64B") : std::string("256KiB");
                         });

}  // namespace

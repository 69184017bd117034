// fi_mr(3): registration calls, keys, and remote access rights, under both ends of the
// mr_mode negotiation (everything offered, nothing offered).
#include "fabric_fixture.h"

#include <algorithm>
#include <set>

namespace tandem_test {
namespace {

constexpr int kAllModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;

class MrTest : public FabricTest, public ::testing::WithParamInterface<int> {
  protected:
    void configure(FabricOptions &o) override {
        o.mr_mode = GetParam();
        // On a device domain (api_verbs) FI_RMA_EVENT would make the target serve every
        // access: without it, kAllModes checks the NIC's own keys and 0 the served path.
        if (on_verbs_link()) return;
        o.caps |= FI_RMA_EVENT;
    }

    // Posts an RMA write/read from a to b and waits for its completion or error.
    // Returns true when it completed successfully.
    bool rma(bool write, DataBuf &local, size_t len, uint64_t raddr, uint64_t key, void *c,
             std::optional<CqError> *err_out = nullptr) {
        ssize_t ret = post([&] {
            return write
                       ? fi_write(a().ep, local.data(), len, local.desc, a().peer[1], raddr, key, c)
                       : fi_read(a().ep, local.data(), len, local.desc, a().peer[1], raddr, key, c);
        });
        if (ret != 0) {
            // Refusing the operation up front is an acceptable way to fail it.
            if (err_out) {
                CqError e;
                e.e.err = static_cast<int>(-ret);
                *err_out = e;
            }
            return false;
        }
        bool done = poll_until([&] { return a().log.has(c) || a().log.has_err(c); });
        EXPECT_TRUE(done) << "no completion for RMA " << (write ? "write" : "read")
                          << " within the deadline; " << a().log.summary();
        if (err_out) *err_out = a().log.find_err(c);
        return a().log.has(c);
    }
    void expect_write_lands(AlignedBuf &mem, fid_mr *mr, uint32_t seed);
};

TEST_P(MrTest, RegisterGivesUsableKey) {
    AlignedBuf mem(8192);
    Fid<fid_mr> mr;
    ASSERT_FI_OK(
        fi_mr_reg(domain, mem.data(), mem.size(), kAllAccess, 0, 77, 0, mr.out(), nullptr));
    EXPECT_NE(fi_mr_key(mr), FI_KEY_NOTAVAIL);
    if (!prov_key()) {
        EXPECT_EQ(fi_mr_key(mr), 77u) << "requested key not honored";
    }
    if (mr_local()) {
        EXPECT_NE(fi_mr_desc(mr), nullptr);
    }
    EXPECT_FI_OK(fi_close(&mr.release()->fid));
}

TEST_P(MrTest, KeysOfLiveRegionsAreDistinct) {
    AlignedBuf mem(4 * 4096);
    std::vector<Fid<fid_mr>> mrs(4);
    std::set<uint64_t> keys;
    for (int i = 0; i < 4; ++i) {
        ASSERT_FI_OK(fi_mr_reg(domain, mem.data() + 4096 * i, 4096, kAllAccess, 0, 500 + i, 0,
                               mrs[i].out(), nullptr));
        keys.insert(fi_mr_key(mrs[i]));
    }
    EXPECT_EQ(keys.size(), 4u);
}

// Provider keys a peer cannot count its way to: no key is another's neighbour, and they
// spread over the key space (a counter gives 1, 2, 3, ...).
TEST_P(MrTest, ProviderKeysCannotBeCountedTo) {
    if (!prov_key()) GTEST_SKIP() << "keys of the application's choosing";
    if (on_verbs_link()) GTEST_SKIP() << "a device domain's keys are its NIC's rkeys";
    constexpr int kRegions = 64;
    AlignedBuf mem(kRegions * 64);
    std::vector<Fid<fid_mr>> mrs(kRegions);
    std::vector<uint64_t> keys;
    for (int i = 0; i < kRegions; ++i) {
        ASSERT_FI_OK(
            fi_mr_reg(domain, mem.data() + 64 * i, 64, kAllAccess, 0, 0, 0, mrs[i].out(), nullptr));
        keys.push_back(fi_mr_key(mrs[i]));
    }
    std::sort(keys.begin(), keys.end());
    for (int i = 1; i < kRegions; ++i)
        EXPECT_GT(keys[i] - keys[i - 1], 1u) << "keys " << keys[i - 1] << " and " << keys[i];
    EXPECT_GT(keys.back() - keys.front(), uint64_t{1} << 40)
        << "64 keys within " << (keys.back() - keys.front());
}

TEST_P(MrTest, DuplicateRequestedKeyIsRejected) {
    if (prov_key()) GTEST_SKIP() << "provider chose FI_MR_PROV_KEY: requested keys are ignored";
    AlignedBuf mem(8192);
    Fid<fid_mr> first, second;
    ASSERT_FI_OK(fi_mr_reg(domain, mem.data(), 4096, kAllAccess, 0, 4242, 0, first.out(), nullptr));
    int ret =
        fi_mr_reg(domain, mem.data() + 4096, 4096, kAllAccess, 0, 4242, 0, second.out(), nullptr);
    EXPECT_EQ(ret, -FI_ENOKEY) << fi_err_str(ret);
}

TEST_P(MrTest, SameMemoryRegisteredTwiceIsUsableThroughBothKeys) {
    auto target = buf(4096, 0, true);
    Fid<fid_mr> mr2;
    ASSERT_FI_OK(
        fi_mr_reg(domain, target->data(), 4096, kAllAccess, 0, 9999, 0, mr2.out(), nullptr));
    const uint64_t key2 = fi_mr_key(mr2);
    EXPECT_NE(key2, target->key);
    auto local = buf(4096);
    fill_pattern(local->data(), 4096, 60);
    ASSERT_TRUE(rma(true, *local, 2048, rma_addr(*target), target->key, ctx(0)))
        << a().log.summary();
    ASSERT_TRUE(rma(true, *local, 2048, rma_addr(*target, 2048), key2, ctx(1)))
        << a().log.summary();
    EXPECT_EQ(eventually_pattern(target->data(), 2048, 60), -1);
    EXPECT_EQ(eventually_pattern(target->data() + 2048, 2048, 60), -1);
}

TEST_P(MrTest, RegvOfTwoSegmentsIsOneRegion) {
    if (info->domain_attr->mr_iov_limit < 2)
        GTEST_SKIP() << "mr_iov_limit is " << info->domain_attr->mr_iov_limit;
    AlignedBuf mem(8192);
    iovec iov[2] = {{mem.data(), 4096}, {mem.data() + 4096, 4096}};
    Fid<fid_mr> mr;
    ASSERT_FI_OK(fi_mr_regv(domain, iov, 2, kAllAccess, 0, 31337, 0, mr.out(), nullptr));
    DataBuf view(0);  // describes the region for rma_addr()
    view.rma_base = virt_addr() ? reinterpret_cast<uintptr_t>(mem.data()) : 0;
    auto local = buf(512);
    fill_pattern(local->data(), 512, 61);
    // 512 bytes straddling the two segments.
    ASSERT_TRUE(rma(true, *local, 512, rma_addr(view, 4096 - 256), fi_mr_key(mr), ctx(0)))
        << a().log.summary();
    EXPECT_EQ(eventually_pattern(mem.data() + 4096 - 256, 512, 61), -1);
    EXPECT_EQ(check_fill(mem.data(), 4096 - 256, 0), -1);
}

// fi_mr_regattr's description of one range: the whole of `iov`.
static fi_mr_attr one_range(const iovec &iov, uint64_t access, uint64_t key, fi_hmem_iface iface) {
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.requested_key = key;
    attr.iface = iface;
    return attr;
}

// An RMA write of 100 bytes from a to offset 10 of the region `mr` registers over `mem` lands
// there.
void MrTest::expect_write_lands(AlignedBuf &mem, fid_mr *mr, uint32_t seed) {
    DataBuf view(0);
    view.rma_base = virt_addr() ? reinterpret_cast<uintptr_t>(mem.data()) : 0;
    auto local = buf(100);
    fill_pattern(local->data(), 100, seed);
    ASSERT_TRUE(rma(true, *local, 100, rma_addr(view, 10), fi_mr_key(mr), ctx(0)))
        << a().log.summary();
    EXPECT_EQ(eventually_pattern(mem.data() + 10, 100, seed), -1);
}

TEST_P(MrTest, RegattrRegistersRegion) {
    AlignedBuf mem(4096);
    iovec iov = {mem.data(), mem.size()};
    fi_mr_attr attr = one_range(iov, FI_REMOTE_WRITE | FI_REMOTE_READ, 2024, FI_HMEM_SYSTEM);
    Fid<fid_mr> mr;
    ASSERT_FI_OK(fi_mr_regattr(domain, &attr, 0, mr.out()));
    if (!prov_key()) {
        EXPECT_EQ(fi_mr_key(mr), 2024u);
    }
    expect_write_lands(mem, mr, 62);
}

// fi_mr(3)'s allocation flags: FI_HMEM_DEVICE_ONLY names device memory, so system memory with
// it is an error; FI_HMEM_HOST_ALLOC names host memory from a device API's host allocator,
// whatever the iface (here CUDA's, on a domain without FI_HMEM): a region like any of host
// memory, which an RMA write reaches.
TEST_P(MrTest, DeviceOnlySystemMemoryIsInvalid) {
    AlignedBuf mem(4096);
    iovec iov = {mem.data(), mem.size()};
    fi_mr_attr attr = one_range(iov, FI_REMOTE_WRITE, 0, FI_HMEM_SYSTEM);
    Fid<fid_mr> mr;
    EXPECT_EQ(fi_mr_regattr(domain, &attr, FI_HMEM_DEVICE_ONLY, mr.out()), -FI_EINVAL);
}

TEST_P(MrTest, HostAllocatedMemoryOfADeviceApiRegistersAsHostMemory) {
    AlignedBuf mem(4096);
    iovec iov = {mem.data(), mem.size()};
    fi_mr_attr attr = one_range(iov, FI_REMOTE_WRITE | FI_REMOTE_READ, 2025, FI_HMEM_CUDA);
    attr.device.cuda = 3;  // ignored under FI_HMEM_HOST_ALLOC
    Fid<fid_mr> mr;
    ASSERT_FI_OK(fi_mr_regattr(domain, &attr, FI_HMEM_HOST_ALLOC, mr.out()));
    expect_write_lands(mem, mr, 63);
}

TEST_P(MrTest, LargeRegionRegisters) {
    auto big = buf(64 << 20, 0, true);
    EXPECT_NE(big->mr.get(), nullptr);
    EXPECT_NE(big->key, FI_KEY_NOTAVAIL);
}

TEST_P(MrTest, RemoteWriteNeedsRemoteWriteAccess) {
    auto target = buf(4096, 0xAA, true, FI_REMOTE_READ);
    auto local = buf(4096);
    fill_pattern(local->data(), 4096, 63);
    std::optional<CqError> err;
    EXPECT_FALSE(rma(true, *local, 256, rma_addr(*target), target->key, ctx(0), &err))
        << "RMA write into a region registered with FI_REMOTE_READ only succeeded";
    EXPECT_TRUE(err.has_value());
    poll_for(kQuiet);
    EXPECT_EQ(check_fill(target->data(), 4096, 0xAA), -1) << "target memory was modified";
    // Reading that region is allowed.
    EXPECT_TRUE(rma(false, *local, 256, rma_addr(*target), target->key, ctx(1)))
        << a().log.summary();
    EXPECT_EQ(check_fill(local->data(), 256, 0xAA), -1);
}

TEST_P(MrTest, RemoteReadNeedsRemoteReadAccess) {
    auto target = buf(4096, 0xBB, true, FI_REMOTE_WRITE);
    auto local = buf(4096, 0x11);
    std::optional<CqError> err;
    EXPECT_FALSE(rma(false, *local, 256, rma_addr(*target), target->key, ctx(0), &err))
        << "RMA read from a region registered with FI_REMOTE_WRITE only succeeded";
    EXPECT_TRUE(err.has_value());
    EXPECT_EQ(check_fill(local->data(), 256, 0x11), -1) << "local buffer received data";
    // Writing is allowed.
    fill_pattern(local->data(), 4096, 64);
    ASSERT_TRUE(rma(true, *local, 256, rma_addr(*target), target->key, ctx(1)))
        << a().log.summary();
    EXPECT_EQ(eventually_pattern(target->data(), 256, 64), -1);
}

TEST_P(MrTest, ClosedRegionIsNoLongerAccessible) {
    auto target = buf(4096, 0xCC, true);
    const uint64_t old_key = target->key;
    const uint64_t old_addr = rma_addr(*target);
    auto local = buf(4096);
    fill_pattern(local->data(), 4096, 65);
    ASSERT_TRUE(rma(true, *local, 64, old_addr, old_key, ctx(0))) << a().log.summary();
    ASSERT_EQ(eventually_pattern(target->data(), 64, 65), -1);
    std::memset(target->data(), 0xCC, 4096);
    target->mr.reset();
    std::optional<CqError> err;
    EXPECT_FALSE(rma(true, *local, 64, old_addr, old_key, ctx(1), &err))
        << "RMA write through the key of a closed MR succeeded";
    EXPECT_TRUE(err.has_value());
    poll_for(kQuiet);
    EXPECT_EQ(check_fill(target->data(), 4096, 0xCC), -1) << "memory of a closed MR was written";
}

INSTANTIATE_TEST_SUITE_P(Modes, MrTest, ::testing::Values(kAllModes, 0),
                         [](const ::testing::TestParamInfo<int> &p) {
                             return std::string(p.param ? "all_modes" : "no_modes");
                         });

}  // namespace
}  // namespace tandem_test

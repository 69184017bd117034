// fi_rma(3) over FI_EP_RDM: read, write, writedata, inject, iovecs, and the failure cases
// (bad key, out of bounds), under both ends of the mr_mode negotiation.
#include "fabric_fixture.h"
#include "tests/common/scoped_env.h"

namespace tandem_test {
namespace {

constexpr int kAllModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;

struct RmaResult {
    ssize_t post_ret = 0;
    std::optional<Completion> comp;
    std::optional<CqError> err;
    bool ok() const { return post_ret == 0 && comp && !err; }
    bool failed() const { return post_ret != 0 || err; }
    std::string str() const {
        if (post_ret) return "post returned " + fi_err_str(post_ret);
        if (err) return "error completion: " + describe(*err);
        if (comp) return "completed successfully";
        return "no completion within the deadline";
    }
};

// Large node-local writes are copied by both sides at once (the target reads one half while
// the initiator writes the other). Whatever the initiator posts after such a write must still
// find it whole, as the FI_ORDER_SAW, RAW and WAW that tandem advertises promise. The sizes
// straddle the split threshold (256 KiB); over TCP they check the same promises.
const size_t kLargeWriteSizes[] = {size_t{256} << 10, (size_t{1} << 20) + 4097, size_t{4} << 20};

class RmaTest : public FabricTest, public ::testing::WithParamInterface<int> {
  protected:
    void configure(FabricOptions &o) override { o.mr_mode = GetParam(); }

    RmaResult op(bool write, void *p, size_t len, void *desc, uint64_t raddr, uint64_t key, void *c,
                 Endpoint *from = nullptr, fi_addr_t to = FI_ADDR_UNSPEC) {
        Endpoint &e = from ? *from : a();
        if (to == FI_ADDR_UNSPEC) to = e.peer[1];
        RmaResult r;
        r.post_ret = post([&] {
            return write ? fi_write(e.ep, p, len, desc, to, raddr, key, c)
                         : fi_read(e.ep, p, len, desc, to, raddr, key, c);
        });
        if (r.post_ret) return r;
        poll_until([&] { return e.log.has(c) || e.log.has_err(c); });
        r.comp = e.log.find(c);
        r.err = e.log.find_err(c);
        return r;
    }
    // Posts (without waiting) a write of len bytes of `src` to the start of `target`.
    ssize_t post_write(DataBuf &src, size_t len, DataBuf &target, void *c) {
        return post([&] {
            return fi_write(a().ep, src.data(), len, src.desc, a().peer[1], rma_addr(target),
                            target.key, c);
        });
    }
    RmaResult write(DataBuf &local, size_t len, uint64_t raddr, uint64_t key, void *c,
                    size_t local_off = 0) {
        return op(true, local.data() + local_off, len, local.desc, raddr, key, c);
    }
    RmaResult read(DataBuf &local, size_t len, uint64_t raddr, uint64_t key, void *c,
                   size_t local_off = 0) {
        return op(false, local.data() + local_off, len, local.desc, raddr, key, c);
    }

    // A read posted right after each large write (kLargeWriteSizes, seed upwards) must fetch
    // what the write wrote (FI_ORDER_RAW).
    void check_read_after_large_write(uint32_t seed) {
        ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_RAW);
        for (size_t len : kLargeWriteSizes) {
            auto target = buf(len, 0xEE, true);
            auto local = buf(len);
            auto back = buf(len, 0x11);
            fill_pattern(local->data(), len, seed);
            ASSERT_FI_OK(post_write(*local, len, *target, ctx(11)));
            ASSERT_FI_OK(post([&] {
                return fi_read(a().ep, back->data(), len, back->desc, a().peer[1],
                               rma_addr(*target), target->key, ctx(12));
            }));
            ASSERT_TRUE(wait_comp(a(), ctx(12))) << a().log.summary();
            EXPECT_EQ(check_pattern(back->data(), len, seed), -1)
                << len << " bytes: the read overtook the write";
            ASSERT_TRUE(wait_comp(a(), ctx(11))) << a().log.summary();
            a().log.clear();
            ++seed;
        }
    }
};

TEST_P(RmaTest, WriteOfEverySizeLandsAtItsOffset) {
    int i = 0;
    for (size_t len : {size_t{1}, size_t{100}, size_t{4096}, size_t{1} << 20, size_t{16} << 20,
                       size_t{64} << 20}) {
        auto target = buf(len + 64, 0xEE, true);
        auto local = buf(len);
        fill_pattern(local->data(), len, 300 + i);
        auto r = write(*local, len, rma_addr(*target, 32), target->key, ctx(i));
        ASSERT_TRUE(r.ok()) << len << " bytes: " << r.str();
        EXPECT_EQ(r.comp->flags & (FI_RMA | FI_WRITE), FI_RMA | FI_WRITE);
        EXPECT_EQ(r.comp->flags & (FI_READ | FI_SEND | FI_RECV), 0u);
        EXPECT_EQ(check_fill(target->data(), 32, 0xEE), -1) << len;
        EXPECT_EQ(eventually_pattern(target->data() + 32, len, 300 + i), -1) << len;
        EXPECT_EQ(check_fill(target->data() + 32 + len, 32, 0xEE), -1) << len;
        ++i;
    }
}

TEST_P(RmaTest, ReadOfEverySizeFetchesFromItsOffset) {
    int i = 0;
    for (size_t len : {size_t{1}, size_t{100}, size_t{4096}, size_t{1} << 20, size_t{16} << 20}) {
        auto target = buf(len + 64, 0, true);
        fill_pattern(target->data(), len + 64, 320 + i);
        auto local = buf(len + 16, 0xEE);
        auto r = read(*local, len, rma_addr(*target, 32), target->key, ctx(i));
        ASSERT_TRUE(r.ok()) << len << " bytes: " << r.str();
        EXPECT_EQ(r.comp->flags & (FI_RMA | FI_READ), FI_RMA | FI_READ);
        EXPECT_EQ(r.comp->flags & (FI_WRITE | FI_SEND | FI_RECV), 0u);
        EXPECT_EQ(check_pattern(local->data(), len, 320 + i, 32), -1) << len;
        EXPECT_EQ(check_fill(local->data() + len, 16, 0xEE), -1) << len;
        ++i;
    }
}

TEST_P(RmaTest, PlainWriteIsSilentAtTarget) {
    // No FI_RMA_EVENT and no CQ data: the target application sees no completion.
    auto target = buf(4096, 0, true);
    auto local = buf(4096);
    fill_pattern(local->data(), 4096, 330);
    auto r = write(*local, 4096, rma_addr(*target), target->key, ctx(0));
    ASSERT_TRUE(r.ok()) << r.str();
    poll_for(kQuiet);
    EXPECT_TRUE(b().log.comps.empty()) << b().log.summary();
    EXPECT_TRUE(b().log.errs.empty()) << b().log.summary();
}

TEST_P(RmaTest, WritedataRaisesRemoteCompletionWithData) {
    for (size_t len : {size_t{64}, size_t{1} << 20}) {
        b().log.clear();
        auto target = buf(len, 0, true);
        auto local = buf(len);
        fill_pattern(local->data(), len, 331);
        ASSERT_FI_OK(post([&] {
            return fi_writedata(a().ep, local->data(), len, local->desc, 0xBEEF0000 + len,
                                a().peer[1], rma_addr(*target), target->key, ctx(1));
        }));
        ASSERT_TRUE(poll_until([&] { return !b().log.comps.empty() || !b().log.errs.empty(); }))
            << "no completion at the target of fi_writedata";
        ASSERT_TRUE(b().log.errs.empty()) << b().log.summary();
        const Completion &rc = b().log.comps[0];
        EXPECT_EQ(rc.flags & (FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA),
                  FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA);
        EXPECT_TRUE(rc.flags & FI_RMA) << "remote write completion without FI_RMA";
        EXPECT_EQ(rc.data, 0xBEEF0000 + len);
        EXPECT_EQ(rc.op_context, nullptr);
        // Target completion means the data is visible.
        EXPECT_EQ(check_pattern(target->data(), len, 331), -1);
        auto ic = wait_comp(a(), ctx(1));
        ASSERT_TRUE(ic) << a().log.summary();
        EXPECT_EQ(ic->flags & (FI_RMA | FI_WRITE), FI_RMA | FI_WRITE);
    }
}

TEST_P(RmaTest, MessageSentAfterALargeWriteFindsItInPlace) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_SAW);
    uint32_t seed = 340;
    for (size_t len : kLargeWriteSizes) {
        auto target = buf(len, 0xEE, true);
        auto local = buf(len);
        fill_pattern(local->data(), len, seed);
        auto note = buf(8), got = buf(8);
        ASSERT_FI_OK(post(
            [&] { return fi_recv(b().ep, got->data(), 8, got->desc, FI_ADDR_UNSPEC, ctx(10)); }));
        ASSERT_FI_OK(post_write(*local, len, *target, ctx(11)));
        ASSERT_FI_OK(post(
            [&] { return fi_send(a().ep, note->data(), 8, note->desc, a().peer[1], ctx(12)); }));
        // The target buffer is looked at the moment the message is seen. (In one process both
        // endpoints progress together, so the read test below is the one that catches a
        // split write overtaken on the node-local path; this one holds for every path.)
        ASSERT_TRUE(poll_until([&] { return b().log.has(ctx(10)) || b().log.has_err(ctx(10)); }))
            << b().log.summary();
        EXPECT_EQ(check_pattern(target->data(), len, seed), -1)
            << len << " bytes: the message overtook the write";
        ASSERT_TRUE(wait_comp(a(), ctx(11))) << a().log.summary();
        ASSERT_TRUE(wait_comp(a(), ctx(12))) << a().log.summary();
        a().log.clear();
        b().log.clear();
        ++seed;
    }
}

TEST_P(RmaTest, ReadPostedRightAfterALargeWriteFetchesWhatItWrote) {
    check_read_after_large_write(350);
}

// The same where the target of a split write waits for the initiator's half rather than
// take it back (TANDEM_TEST_SPLIT_WAIT), as it does when the initiator claimed its half
// first: node-local, the read then reaches the target's inbox while the write is unfinished
// and must wait there, behind the hold of its sender (shm::SenderHold). (Taking the half
// back, as the other test's target does in one process, finishes the write at once.)
TEST_P(RmaTest, ReadPostedRightAfterALargeWriteWhoseInitiatorCopiesHalfFetchesWhatItWrote) {
    ScopedEnv wait("TANDEM_TEST_SPLIT_WAIT", "1");
    check_read_after_large_write(370);
}

TEST_P(RmaTest, LaterOfTwoLargeWritesToOneRegionWins) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_WAW);
    uint32_t seed = 360;
    for (size_t len : kLargeWriteSizes) {
        auto target = buf(len, 0xEE, true);
        auto first = buf(len), second = buf(len);
        fill_pattern(first->data(), len, seed);
        fill_pattern(second->data(), len, seed + 100);
        ASSERT_FI_OK(post_write(*first, len, *target, ctx(11)));
        ASSERT_FI_OK(post_write(*second, len, *target, ctx(12)));
        ASSERT_TRUE(wait_comp(a(), ctx(11))) << a().log.summary();
        ASSERT_TRUE(wait_comp(a(), ctx(12))) << a().log.summary();
        EXPECT_EQ(eventually_pattern(target->data(), len, seed + 100), -1)
            << len << " bytes: the first write landed over the second";
        a().log.clear();
        ++seed;
    }
}

TEST_P(RmaTest, InjectWriteAndInjectWritedata) {
    const size_t len = std::min<size_t>(64, info->tx_attr->inject_size);
    ASSERT_GT(len, 0u);
    auto target = buf(2 * len, 0, true);
    std::vector<uint8_t> src(len);
    fill_pattern(src.data(), len, 332);
    ASSERT_FI_OK(post([&] {
        return fi_inject_write(a().ep, src.data(), len, a().peer[1], rma_addr(*target),
                               target->key);
    }));
    std::fill(src.begin(), src.end(), 0);  // the buffer is ours again at once
    EXPECT_TRUE(poll_until([&] { return check_pattern(target->data(), len, 332) == -1; }))
        << "fi_inject_write data never arrived";
    EXPECT_TRUE(b().log.comps.empty()) << "plain inject write raised a target completion";
    // With CQ data the target gets a completion.
    fill_pattern(src.data(), len, 333);
    ASSERT_FI_OK(post([&] {
        return fi_inject_writedata(a().ep, src.data(), len, 0x1D, a().peer[1],
                                   rma_addr(*target, len), target->key);
    }));
    ASSERT_TRUE(poll_until([&] { return !b().log.comps.empty(); })) << b().log.summary();
    EXPECT_TRUE(b().log.comps[0].flags & FI_REMOTE_CQ_DATA);
    EXPECT_EQ(b().log.comps[0].data, 0x1Du);
    EXPECT_EQ(check_pattern(target->data() + len, len, 333), -1);
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.comps.empty())
        << "inject wrote an initiator completion: " << a().log.summary();
    EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
}

TEST_P(RmaTest, WritevAndReadvGatherAndScatter) {
    const size_t n = std::min<size_t>(3, info->tx_attr->iov_limit);
    auto target = buf(9000, 0, true);
    auto local = buf(9000, 0);
    fill_pattern(local->data(), 9000, 334);
    const size_t seg[3] = {1000, 5000, 3000};
    iovec iov[3];
    void *desc[3];
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) {
        iov[i] = {local->data() + total, seg[i]};
        desc[i] = local->desc;
        total += seg[i];
    }
    ASSERT_FI_OK(post([&] {
        return fi_writev(a().ep, iov, desc, n, a().peer[1], rma_addr(*target), target->key, ctx(0));
    }));
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    EXPECT_EQ(eventually_pattern(target->data(), total, 334), -1);
    // Read it back into a zeroed buffer through the same iovecs.
    std::memset(local->data(), 0, 9000);
    ASSERT_FI_OK(post([&] {
        return fi_readv(a().ep, iov, desc, n, a().peer[1], rma_addr(*target), target->key, ctx(1));
    }));
    ASSERT_TRUE(wait_comp(a(), ctx(1))) << a().log.summary();
    EXPECT_EQ(check_pattern(local->data(), total, 334), -1);
}

TEST_P(RmaTest, WritemsgAndReadmsgWithRemoteIovecs) {
    const size_t nr = std::min<size_t>(2, info->tx_attr->rma_iov_limit);
    auto target = buf(8192, 0xEE, true);
    auto local = buf(2000);
    fill_pattern(local->data(), 2000, 335);
    iovec iov = {local->data(), nr == 2 ? size_t{2000} : size_t{1000}};
    void *desc = local->desc;
    fi_rma_iov riov[2] = {{rma_addr(*target, 100), 1000, target->key},
                          {rma_addr(*target, 5000), 1000, target->key}};
    fi_msg_rma m{};
    m.msg_iov = &iov;
    m.desc = &desc;
    m.iov_count = 1;
    m.addr = a().peer[1];
    m.rma_iov = riov;
    m.rma_iov_count = nr;
    m.context = ctx(0);
    m.data = 0;
    ASSERT_FI_OK(post([&] { return fi_writemsg(a().ep, &m, FI_COMPLETION); }));
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    EXPECT_EQ(eventually_pattern(target->data() + 100, 1000, 335), -1);
    EXPECT_EQ(check_fill(target->data(), 100, 0xEE), -1);
    if (nr == 2) {
        EXPECT_EQ(eventually_pattern(target->data() + 5000, 1000, 335, 1000), -1);
        EXPECT_EQ(check_fill(target->data() + 1100, 3900, 0xEE), -1);
    }
    // fi_readmsg of a remote iovec back into a fresh buffer.
    auto back = buf(512, 0);
    iovec biov = {back->data(), 512};
    void *bdesc = back->desc;
    fi_rma_iov briov = {rma_addr(*target, 100), 512, target->key};
    fi_msg_rma rm{};
    rm.msg_iov = &biov;
    rm.desc = &bdesc;
    rm.iov_count = 1;
    rm.addr = a().peer[1];
    rm.rma_iov = &briov;
    rm.rma_iov_count = 1;
    rm.context = ctx(1);
    ASSERT_FI_OK(post([&] { return fi_readmsg(a().ep, &rm, FI_COMPLETION); }));
    ASSERT_TRUE(wait_comp(a(), ctx(1))) << a().log.summary();
    EXPECT_EQ(check_pattern(back->data(), 512, 335), -1);
}

TEST_P(RmaTest, WriteToOwnEndpoint) {
    auto target = buf(256, 0, true);
    auto local = buf(256);
    fill_pattern(local->data(), 256, 337);
    auto r = op(true, local->data(), 256, local->desc, rma_addr(*target), target->key, ctx(0), &a(),
                a().peer[0]);
    ASSERT_TRUE(r.ok()) << r.str();
    EXPECT_EQ(eventually_pattern(target->data(), 256, 337), -1);
}

// ---- failures --------------------------------------------------------------------------------

TEST_P(RmaTest, WriteWithBadKeyFailsAndWritesNothing) {
    for (size_t len : {size_t{64}, size_t{1} << 20}) {
        auto target = buf(len, 0xAA, true);
        auto local = buf(len);
        fill_pattern(local->data(), len, 340);
        auto r = write(*local, len, rma_addr(*target), target->key ^ 0x5A5A5A00ull, ctx(len > 64));
        EXPECT_TRUE(r.failed()) << len << " bytes with a bad key: " << r.str();
        EXPECT_FALSE(r.comp) << "bad-key write also completed successfully";
        if (r.err) {
            EXPECT_NE(r.err->e.err, 0);
            EXPECT_EQ(r.err->e.op_context, ctx(len > 64));
        }
        poll_for(kQuiet);
        EXPECT_EQ(check_fill(target->data(), len, 0xAA), -1) << "target written through a bad key";
    }
    // The endpoint still works afterwards.
    auto target = buf(64, 0, true);
    auto local = buf(64);
    fill_pattern(local->data(), 64, 341);
    auto ok = write(*local, 64, rma_addr(*target), target->key, ctx(9));
    ASSERT_TRUE(ok.ok()) << "the endpoint stopped working after a failed write: " << ok.str();
    EXPECT_EQ(eventually_pattern(target->data(), 64, 341), -1);
}

// A refused fi_writedata delivers no remote CQ data: the target's first completion is the
// data of the good writedata that follows it. (Over the TCP link the WriteNotify that carries
// the data used to arrive anyway, after the write's Nak.)
TEST_P(RmaTest, RefusedWritedataDeliversNoCqData) {
    auto target = buf(64, 0xAA, true);
    auto local = buf(64);
    fill_pattern(local->data(), 64, 342);
    b().log.clear();
    ASSERT_FI_OK(post([&] {
        return fi_writedata(a().ep, local->data(), 64, local->desc, 0xBAD, a().peer[1],
                            rma_addr(*target), target->key ^ 0x5A5A5A00ull, ctx(1));
    }));
    auto refused = wait_err(a(), ctx(1));
    ASSERT_TRUE(refused) << "the bad-key writedata did not fail: " << a().log.summary();
    ASSERT_FI_OK(post([&] {
        return fi_writedata(a().ep, local->data(), 64, local->desc, 0x600D, a().peer[1],
                            rma_addr(*target), target->key, ctx(2));
    }));
    ASSERT_TRUE(wait_comp(a(), ctx(2))) << a().log.summary();
    ASSERT_TRUE(poll_until([&] { return !b().log.comps.empty(); })) << b().log.summary();
    EXPECT_EQ(b().log.comps[0].data, 0x600Du) << "the refused write's CQ data was delivered";
    poll_for(kQuiet);
    EXPECT_EQ(b().log.comps.size(), 1u) << b().log.summary();
    EXPECT_EQ(check_pattern(target->data(), 64, 342), -1);
}

TEST_P(RmaTest, ReadWithBadKeyFailsAndFetchesNothing) {
    for (size_t len : {size_t{64}, size_t{1} << 20}) {
        auto target = buf(len, 0x77, true);
        auto local = buf(len, 0x11);
        auto r = read(*local, len, rma_addr(*target), target->key + 0x10001, ctx(len > 64));
        EXPECT_TRUE(r.failed()) << len << " bytes with a bad key: " << r.str();
        EXPECT_FALSE(r.comp);
        EXPECT_EQ(check_fill(local->data(), len, 0x11), -1) << "data read through a bad key";
    }
}

struct Oob {
    const char *name;
    long offset;  // relative to the start of the region
    size_t len;
};

class RmaBoundsTest : public RmaTest {};

TEST_P(RmaBoundsTest, OutOfBoundsWritesFailAndWriteNothing) {
    constexpr size_t kLen = 4096;
    const Oob cases[] = {{"tail overlaps the end", kLen - 32, 64},
                         {"starts past the end", kLen + 128, 16},
                         {"starts before the region", -64, 16},
                         {"straddles the start", -8, 64},
                         {"larger than the region", 0, 2 * kLen}};
    int i = 0;
    for (const Oob &c : cases) {
        // Guard pages around the region so a provider that ignores bounds corrupts only them.
        auto mem = std::make_unique<DataBuf>(3 * kLen, 0xAA);
        DataBuf &target = *mem;
        Fid<fid_mr> mr;
        ASSERT_FI_OK(fi_mr_reg(domain, target.data() + kLen, kLen, kAllAccess, 0, 7000 + i, 0,
                               mr.out(), nullptr));
        const uint64_t base = virt_addr() ? reinterpret_cast<uintptr_t>(target.data() + kLen) : 0;
        auto local = buf(c.len);
        fill_pattern(local->data(), c.len, 342);
        auto r = write(*local, c.len, base + c.offset, fi_mr_key(mr), ctx(i));
        EXPECT_TRUE(r.failed()) << c.name << ": " << r.str();
        EXPECT_FALSE(r.comp) << c.name << ": out-of-bounds write completed successfully";
        poll_for(50ms);
        EXPECT_EQ(check_fill(target.data(), 3 * kLen, 0xAA), -1)
            << c.name << ": memory changed (offset of first change relative to region start)";
        ++i;
    }
}

TEST_P(RmaBoundsTest, OutOfBoundsReadsFail) {
    constexpr size_t kLen = 4096;
    const Oob cases[] = {{"tail overlaps the end", kLen - 32, 64},
                         {"starts past the end", kLen + 128, 16},
                         {"starts before the region", -64, 16}};
    auto target = buf(kLen, 0x33, true);
    int i = 0;
    for (const Oob &c : cases) {
        auto local = buf(c.len, 0x11);
        auto r = read(*local, c.len, rma_addr(*target) + c.offset, target->key, ctx(i++));
        EXPECT_TRUE(r.failed()) << c.name << ": " << r.str();
        EXPECT_FALSE(r.comp) << c.name;
    }
}

TEST_P(RmaTest, WriteToUnknownAddressFails) {
    auto target = buf(64, 0, true);
    auto local = buf(64);
    fi_addr_t bogus = 4242;  // never inserted into a's AV
    auto r = op(true, local->data(), 64, local->desc, rma_addr(*target), target->key, ctx(0), &a(),
                bogus);
    EXPECT_TRUE(r.failed()) << r.str();
    EXPECT_FALSE(r.comp);
}

std::string mode_name(const ::testing::TestParamInfo<int> &p) {
    return p.param ? "all_modes" : "no_modes";
}
INSTANTIATE_TEST_SUITE_P(Modes, RmaTest, ::testing::Values(kAllModes, 0), mode_name);
INSTANTIATE_TEST_SUITE_P(Modes, RmaBoundsTest, ::testing::Values(kAllModes, 0), mode_name);

}  // namespace
}  // namespace tandem_test

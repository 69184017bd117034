// fi_cq(3): completion queues, formats, error entries, blocking reads.
#include "fabric_fixture.h"

namespace tandem_test {
namespace {

using CqTest = FabricTest;

TEST_F(CqTest, EmptyQueueReadsReturnEagain) {
    fi_cq_tagged_entry e[4];
    EXPECT_EQ(fi_cq_read(a().cq, e, 4), -FI_EAGAIN);
    fi_cq_err_entry err{};
    EXPECT_EQ(fi_cq_readerr(a().cq, &err, 0), -FI_EAGAIN);
}

TEST_F(CqTest, SendAndReceiveCompletionFields) {
    auto src = buf(100);
    auto dst = buf(256, 0xEE);
    fill_pattern(src->data(), 100, 1);
    ASSERT_FI_OK(post([&] {
        return fi_recv(b().ep, dst->data(), dst->size(), dst->desc, FI_ADDR_UNSPEC, ctx(1));
    }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, src->data(), 100, src->desc, a().peer[1], ctx(0)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    auto sc = wait_comp(a(), ctx(0));
    ASSERT_TRUE(sc) << a().log.summary();
    EXPECT_EQ(rc->flags & (FI_RECV | FI_MSG), FI_RECV | FI_MSG);
    EXPECT_EQ(rc->flags & (FI_SEND | FI_TAGGED | FI_RMA | FI_REMOTE_CQ_DATA), 0u);
    EXPECT_EQ(rc->len, 100u);
    EXPECT_EQ(sc->flags & (FI_SEND | FI_MSG), FI_SEND | FI_MSG);
    EXPECT_EQ(sc->flags & (FI_RECV | FI_TAGGED | FI_RMA), 0u);
    EXPECT_EQ(check_pattern(dst->data(), 100, 1), -1);
    EXPECT_EQ(check_fill(dst->data() + 100, 156, 0xEE), -1) << "bytes past the message written";
}

TEST_F(CqTest, ReadfromReportsSourceAddress) {
    auto s = buf(16);
    auto r = buf(16);
    // a -> b: b sees a's fi_addr in b's AV.
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 16, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 16, s->desc, a().peer[1], ctx(0)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->src, b().peer[0]);
    // b -> a
    ASSERT_FI_OK(
        post([&] { return fi_recv(a().ep, r->data(), 16, r->desc, FI_ADDR_UNSPEC, ctx(3)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(b().ep, s->data(), 16, s->desc, b().peer[0], ctx(2)); }));
    auto rc2 = wait_comp(a(), ctx(3));
    ASSERT_TRUE(rc2) << a().log.summary();
    EXPECT_EQ(rc2->src, a().peer[1]);
}

TEST_F(CqTest, ReadReturnsSeveralEntriesInOneCall) {
    constexpr int kN = 8;
    auto s = buf(32);
    auto r = buf(32 * kN);
    for (int i = 0; i < kN; ++i)
        ASSERT_FI_OK(post([&] {
            return fi_recv(b().ep, r->data() + 32 * i, 32, r->desc, FI_ADDR_UNSPEC, ctx(100 + i));
        }));
    for (int i = 0; i < kN; ++i)
        ASSERT_FI_OK(
            post([&] { return fi_send(a().ep, s->data(), 32, s->desc, a().peer[1], ctx(i)); }));
    // Drive progress on b without consuming (count 0), a normally.
    fi_cq_tagged_entry dummy[1];
    ASSERT_TRUE(::tandem_test::poll_until([&] {
        a().log.drain();
        fi_cq_read(b().cq, dummy, 0);
        return a().log.comps.size() + a().log.errs.size() >= static_cast<size_t>(kN);
    })) << a().log.summary();
    EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
    // Let the last receives land.
    auto until = Clock::now() + kQuiet;
    while (Clock::now() < until) fi_cq_read(b().cq, dummy, 0);
    fi_cq_tagged_entry e[16];
    ssize_t first = fi_cq_read(b().cq, e, 16);
    ASSERT_GT(first, 0) << fi_err_str(first);
    EXPECT_GT(first, 1) << "only one entry returned although " << kN << " were queued";
    size_t total = static_cast<size_t>(first);
    ASSERT_TRUE(::tandem_test::poll_until([&] {
        ssize_t n = fi_cq_read(b().cq, e, 16);
        if (n > 0) total += static_cast<size_t>(n);
        return total >= kN;
    }));
    EXPECT_EQ(total, static_cast<size_t>(kN));
}

TEST_F(CqTest, ErrorEntryIsReportedOutOfBand) {
    auto r = buf(64);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(7)); }));
    ASSERT_FI_OK(fi_cancel(&b().ep->fid, ctx(7)));
    ssize_t ret = -FI_EAGAIN;
    fi_cq_tagged_entry e[2];
    ASSERT_TRUE(::tandem_test::poll_until([&] {
        ret = fi_cq_read(b().cq, e, 2);
        return ret != -FI_EAGAIN;
    })) << "no completion for the cancelled receive";
    ASSERT_EQ(ret, -FI_EAVAIL) << fi_err_str(ret);
    fi_cq_err_entry err{};
    ASSERT_FI_RET(fi_cq_readerr(b().cq, &err, 0), 1);
    EXPECT_EQ(err.err, FI_ECANCELED);
    EXPECT_EQ(err.op_context, ctx(7));
    EXPECT_TRUE(err.flags & FI_RECV);
    char sbuf[128] = {};
    EXPECT_NE(fi_cq_strerror(b().cq, err.prov_errno, err.err_data, sbuf, sizeof(sbuf)), nullptr);
    EXPECT_EQ(fi_cq_read(b().cq, e, 2), -FI_EAGAIN);
    EXPECT_EQ(fi_cq_readerr(b().cq, &err, 0), -FI_EAGAIN);
}

TEST_F(CqTest, ErrorDataGoesToCallerBuffer) {
    auto r = buf(64);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(8)); }));
    ASSERT_FI_OK(fi_cancel(&b().ep->fid, ctx(8)));
    fi_cq_tagged_entry e[1];
    ASSERT_TRUE(::tandem_test::poll_until([&] { return fi_cq_read(b().cq, e, 1) == -FI_EAVAIL; }));
    uint8_t data[256];
    std::memset(data, 0x5A, sizeof(data));
    fi_cq_err_entry err{};
    err.err_data = data;
    err.err_data_size = sizeof(data);
    ASSERT_FI_RET(fi_cq_readerr(b().cq, &err, 0), 1);
    EXPECT_EQ(err.err, FI_ECANCELED);
    EXPECT_LE(err.err_data_size, sizeof(data));
    if (err.err_data_size > 0) {
        EXPECT_EQ(err.err_data, data) << "caller's buffer not used";
    }
}

TEST_F(CqTest, CloseWhileBoundIsBusy) {
    int ret = fi_close(&a().cq->fid);
    EXPECT_EQ(ret, -FI_EBUSY) << fi_err_str(ret);
    if (ret == 0) {
        a().cq.release();
        a().log.cq = nullptr;
    }
}

// ---- completion formats --------------------------------------------------------------------

class CqFormatTest : public FabricTest, public ::testing::WithParamInterface<fi_cq_format> {
  protected:
    void configure(FabricOptions &o) override { o.cq_format = GetParam(); }
};

TEST_P(CqFormatTest, ReceiveCompletionCarriesFormatFields) {
    const fi_cq_format fmt = GetParam();
    auto s = buf(48);
    auto r = buf(64);
    fill_pattern(s->data(), 48, 3);
    const uint64_t tag = 0xABCD0001, data = 0x1122334455667788ull;
    ASSERT_FI_OK(post(
        [&] { return fi_trecv(b().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, tag, 0, ctx(1)); }));
    ASSERT_FI_OK(post([&] {
        return fi_tsenddata(a().ep, s->data(), 48, s->desc, data, a().peer[1], tag, ctx(0));
    }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    auto sc = wait_comp(a(), ctx(0));
    ASSERT_TRUE(sc) << a().log.summary();
    EXPECT_EQ(check_pattern(r->data(), 48, 3), -1);
    EXPECT_EQ(rc->op_context, ctx(1));
    if (fmt == FI_CQ_FORMAT_CONTEXT) return;
    EXPECT_EQ(rc->flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
    EXPECT_EQ(sc->flags & (FI_SEND | FI_TAGGED), FI_SEND | FI_TAGGED);
    EXPECT_EQ(rc->len, 48u);
    if (fmt == FI_CQ_FORMAT_MSG) return;
    EXPECT_TRUE(rc->flags & FI_REMOTE_CQ_DATA);
    EXPECT_EQ(rc->data, data);
    if (fmt == FI_CQ_FORMAT_DATA) return;
    EXPECT_EQ(rc->tag, tag);
}

INSTANTIATE_TEST_SUITE_P(Formats, CqFormatTest,
                         ::testing::Values(FI_CQ_FORMAT_CONTEXT, FI_CQ_FORMAT_MSG,
                                           FI_CQ_FORMAT_DATA, FI_CQ_FORMAT_TAGGED),
                         [](const ::testing::TestParamInfo<fi_cq_format> &p) {
                             switch (p.param) {
                                 case FI_CQ_FORMAT_CONTEXT:
                                     return std::string("context");
                                 case FI_CQ_FORMAT_MSG:
                                     return std::string("msg");
                                 case FI_CQ_FORMAT_DATA:
                                     return std::string("data");
                                 default:
                                     return std::string("tagged");
                             }
                         });

// ---- blocking reads ------------------------------------------------------------------------

class CqWaitTest : public FabricTest, public ::testing::WithParamInterface<fi_wait_obj> {
  protected:
    void configure(FabricOptions &o) override { o.cq_wait = GetParam(); }
};

TEST_P(CqWaitTest, SreadTimesOutOnEmptyQueue) {
    fi_cq_tagged_entry e[1];
    auto t0 = Clock::now();
    ssize_t ret = fi_cq_sread(b().cq, e, 1, nullptr, 100);
    auto elapsed = std::chrono::duration_cast<Ms>(Clock::now() - t0);
    EXPECT_EQ(ret, -FI_EAGAIN) << fi_err_str(ret);
    EXPECT_GE(elapsed.count(), 80);
    EXPECT_LT(elapsed.count(), 5000);
}

class CqWaitNoLocalMrTest : public CqWaitTest {
  protected:
    void configure(FabricOptions &o) override {
        CqWaitTest::configure(o);
        o.mr_mode &= ~FI_MR_LOCAL;  // no descriptors needed below
    }

    // b blocks in fi_cq_sreadfrom while another thread sends from a (after one round trip
    // through the polling path when `warm_up` is set, so that any connection already exists).
    void sread_while_peer_sends(bool warm_up) {
        void *sctx = ctx(0), *rctx = ctx(1);
        AlignedBuf s(64), r(64);
        if (warm_up) {
            ASSERT_FI_OK(
                post([&] { return fi_recv(a().ep, r.data(), 64, nullptr, FI_ADDR_UNSPEC, rctx); }));
            ASSERT_FI_OK(
                post([&] { return fi_send(b().ep, s.data(), 64, nullptr, b().peer[0], sctx); }));
            ASSERT_TRUE(poll_until([&] { return a().log.has(rctx) && b().log.has(sctx); }))
                << a().log.summary() << " / " << b().log.summary();
            a().log.clear();
            b().log.clear();
        }
        fill_pattern(s.data(), 64, 9);
        ASSERT_FI_OK(
            post([&] { return fi_recv(b().ep, r.data(), 64, nullptr, FI_ADDR_UNSPEC, rctx); }));
        std::atomic<bool> go{false};
        ssize_t send_ret = 1;
        std::thread sender([&] {
            while (!go.load()) sched_yield();
            std::this_thread::sleep_for(100ms);
            // Only a's CQ is touched by this thread; the main thread only touches b's.
            ::tandem_test::poll_until([&] {
                send_ret = fi_send(a().ep, s.data(), 64, nullptr, a().peer[1], sctx);
                if (send_ret == -FI_EAGAIN) a().log.drain();
                return send_ret != -FI_EAGAIN;
            });
            ::tandem_test::poll_until([&] {
                a().log.drain();
                return a().log.has(sctx) || a().log.has_err(sctx);
            });
        });
        fi_cq_tagged_entry e[1];
        fi_addr_t src = FI_ADDR_NOTAVAIL;
        go = true;
        auto t0 = Clock::now();
        ssize_t ret = -FI_EAGAIN;
        // sread may return early (signal / spurious): retry until the deadline.
        while (ret == -FI_EAGAIN && Clock::now() - t0 < kTimeout)
            ret = fi_cq_sreadfrom(b().cq, e, 1, &src, nullptr, 1000);
        sender.join();
        ASSERT_EQ(send_ret, 0) << fi_err_str(send_ret);
        ASSERT_EQ(ret, 1) << "blocked fi_cq_sreadfrom never returned the message: "
                          << fi_err_str(ret);
        EXPECT_EQ(e[0].op_context, rctx);
        EXPECT_EQ(e[0].len, 64u);
        EXPECT_EQ(src, b().peer[0]);
        EXPECT_EQ(check_pattern(r.data(), 64, 9), -1);
    }
};

TEST_P(CqWaitNoLocalMrTest, SreadReturnsFirstMessageSentWhileBlocked) {
    sread_while_peer_sends(false);
}

TEST_P(CqWaitNoLocalMrTest, SreadReturnsMessageSentWhileBlockedAfterWarmUp) {
    sread_while_peer_sends(true);
}

TEST_P(CqWaitTest, SignalWakesBlockedSread) {
    std::atomic<ssize_t> ret{1};
    Clock::time_point woke;
    std::thread reader([&] {
        fi_cq_tagged_entry e[1];
        ret = fi_cq_sread(b().cq, e, 1, nullptr, 8000);
        woke = Clock::now();
    });
    std::this_thread::sleep_for(200ms);
    auto signalled = Clock::now();
    EXPECT_FI_OK(fi_cq_signal(b().cq));
    reader.join();
    EXPECT_EQ(ret.load(), -FI_EAGAIN) << fi_err_str(ret.load());
    EXPECT_LT(woke - signalled, 4s) << "fi_cq_signal did not wake fi_cq_sread";
}

std::string wait_name(const ::testing::TestParamInfo<fi_wait_obj> &p) {
    return p.param == FI_WAIT_FD ? "fd" : "unspec";
}
INSTANTIATE_TEST_SUITE_P(WaitObjects, CqWaitTest, ::testing::Values(FI_WAIT_UNSPEC, FI_WAIT_FD),
                         wait_name);
INSTANTIATE_TEST_SUITE_P(WaitObjects, CqWaitNoLocalMrTest,
                         ::testing::Values(FI_WAIT_UNSPEC, FI_WAIT_FD), wait_name);

}  // namespace
}  // namespace tandem_test

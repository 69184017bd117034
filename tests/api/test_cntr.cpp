// fi_cntr(3): counters, standalone and bound to endpoints.
#include "fabric_fixture.h"

namespace tandem_test {
namespace {

// A domain with two endpoints, without counters (for the standalone counter calls).
using CntrTest = FabricTest;

TEST_F(CntrTest, SetAddAndReadValues) {
    Fid<fid_cntr> c;
    ASSERT_NO_FATAL_FAILURE(open_cntr(c));
    EXPECT_EQ(fi_cntr_read(c), 0u);
    EXPECT_EQ(fi_cntr_readerr(c), 0u);
    ASSERT_FI_OK(fi_cntr_add(c, 5));
    EXPECT_EQ(fi_cntr_read(c), 5u);
    ASSERT_FI_OK(fi_cntr_add(c, 7));
    EXPECT_EQ(fi_cntr_read(c), 12u);
    ASSERT_FI_OK(fi_cntr_set(c, 2));
    EXPECT_EQ(fi_cntr_read(c), 2u);
    ASSERT_FI_OK(fi_cntr_adderr(c, 3));
    EXPECT_EQ(fi_cntr_readerr(c), 3u);
    EXPECT_EQ(fi_cntr_read(c), 2u) << "adderr changed the success value";
    ASSERT_FI_OK(fi_cntr_seterr(c, 0));
    EXPECT_EQ(fi_cntr_readerr(c), 0u);
}

TEST_F(CntrTest, WaitReturnsAtOnceWhenThresholdReached) {
    Fid<fid_cntr> c;
    ASSERT_NO_FATAL_FAILURE(open_cntr(c, FI_WAIT_UNSPEC));
    ASSERT_FI_OK(fi_cntr_add(c, 3));
    auto t0 = Clock::now();
    EXPECT_FI_OK(fi_cntr_wait(c, 3, 5000));
    EXPECT_LT(Clock::now() - t0, 1s);
}

TEST_F(CntrTest, WaitTimesOut) {
    Fid<fid_cntr> c;
    ASSERT_NO_FATAL_FAILURE(open_cntr(c, FI_WAIT_UNSPEC));
    auto t0 = Clock::now();
    int ret = fi_cntr_wait(c, 10, 100);
    auto elapsed = std::chrono::duration_cast<Ms>(Clock::now() - t0);
    EXPECT_EQ(ret, -FI_ETIMEDOUT) << fi_err_str(ret);
    EXPECT_GE(elapsed.count(), 80);
    EXPECT_LT(elapsed.count(), 5000);
    EXPECT_EQ(fi_cntr_readerr(c), 0u) << "a timeout must not change the error value";
}

TEST_F(CntrTest, WaitWakesOnAddFromAnotherThread) {
    for (fi_wait_obj w : {FI_WAIT_UNSPEC, FI_WAIT_FD}) {
        Fid<fid_cntr> c;
        ASSERT_NO_FATAL_FAILURE(open_cntr(c, w));
        fid_cntr *raw = c;
        std::thread adder([raw] {
            std::this_thread::sleep_for(150ms);
            fi_cntr_add(raw, 1);
        });
        auto t0 = Clock::now();
        int ret = fi_cntr_wait(c, 1, 8000);
        auto elapsed = Clock::now() - t0;
        adder.join();
        EXPECT_EQ(ret, 0) << fi_err_str(ret) << " (wait_obj " << w << ")";
        EXPECT_LT(elapsed, 5s);
        EXPECT_EQ(fi_cntr_read(c), 1u);
    }
}

TEST_F(CntrTest, ErrorIncrementUnblocksWait) {
    Fid<fid_cntr> c;
    ASSERT_NO_FATAL_FAILURE(open_cntr(c, FI_WAIT_UNSPEC));
    fid_cntr *raw = c;
    std::thread adder([raw] {
        std::this_thread::sleep_for(150ms);
        fi_cntr_adderr(raw, 1);
    });
    auto t0 = Clock::now();
    int ret = fi_cntr_wait(c, 1, 8000);
    auto elapsed = Clock::now() - t0;
    adder.join();
    EXPECT_NE(ret, 0) << "wait reported success although the value never reached 1";
    EXPECT_NE(ret, -FI_ETIMEDOUT) << "the error increment did not unblock fi_cntr_wait";
    EXPECT_LT(elapsed, 5s);
    EXPECT_EQ(fi_cntr_readerr(c), 1u);
}

// ---- counters bound to endpoints -----------------------------------------------------------

class BoundCntrTest : public FabricTest {
  protected:
    void configure(FabricOptions &o) override {
        o.caps |= FI_RMA_EVENT;
        o.cq_bind_flags = FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION;
    }
    void before_enable(Endpoint &e, size_t) override {
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.send_cntr, FI_WAIT_UNSPEC));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.recv_cntr, FI_WAIT_UNSPEC));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.read_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.write_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.rread_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.rwrite_cntr));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.send_cntr->fid, FI_SEND));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.recv_cntr->fid, FI_RECV));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.read_cntr->fid, FI_READ));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.write_cntr->fid, FI_WRITE));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.rread_cntr->fid, FI_REMOTE_READ));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.rwrite_cntr->fid, FI_REMOTE_WRITE));
    }
    bool cntr_reaches(fid_cntr *c, uint64_t v) {
        return poll_until([&] { return fi_cntr_read(c) >= v; });
    }
};

TEST_F(BoundCntrTest, SendAndRecvCountersCountMessagesWithoutCqEntries) {
    constexpr int kN = 5;
    auto s = buf(128);
    auto r = buf(128 * kN);
    for (int i = 0; i < kN; ++i)
        ASSERT_FI_OK(post([&] {
            return fi_recv(b().ep, r->data() + 128 * i, 128, r->desc, FI_ADDR_UNSPEC, ctx(10 + i));
        }));
    for (int i = 0; i < kN; ++i)
        ASSERT_FI_OK(
            post([&] { return fi_send(a().ep, s->data(), 128, s->desc, a().peer[1], ctx(i)); }));
    EXPECT_TRUE(cntr_reaches(b().recv_cntr, kN)) << "recv counter " << fi_cntr_read(b().recv_cntr);
    EXPECT_TRUE(cntr_reaches(a().send_cntr, kN)) << "send counter " << fi_cntr_read(a().send_cntr);
    poll_for(kQuiet);
    EXPECT_EQ(fi_cntr_read(a().send_cntr), static_cast<uint64_t>(kN));
    EXPECT_EQ(fi_cntr_read(b().recv_cntr), static_cast<uint64_t>(kN));
    EXPECT_EQ(fi_cntr_read(a().recv_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(b().send_cntr), 0u);
    EXPECT_EQ(fi_cntr_readerr(a().send_cntr), 0u);
    // FI_SELECTIVE_COMPLETION without FI_COMPLETION: no CQ entries.
    EXPECT_TRUE(a().log.comps.empty()) << a().log.summary();
    EXPECT_TRUE(b().log.comps.empty()) << b().log.summary();
}

TEST_F(BoundCntrTest, RmaCountersCountBothSides) {
    auto target = buf(4096, 0, true);
    auto local = buf(4096);
    fill_pattern(local->data(), 4096, 21);
    for (int i = 0; i < 3; ++i)
        ASSERT_FI_OK(post([&] {
            return fi_write(a().ep, local->data() + 1024 * i, 1024, local->desc, a().peer[1],
                            rma_addr(*target, 1024 * i), target->key, ctx(i));
        }));
    EXPECT_TRUE(cntr_reaches(a().write_cntr, 3)) << fi_cntr_read(a().write_cntr);
    EXPECT_TRUE(cntr_reaches(b().rwrite_cntr, 3)) << fi_cntr_read(b().rwrite_cntr);
    EXPECT_EQ(check_pattern(target->data(), 3072, 21), -1);
    for (int i = 0; i < 2; ++i)
        ASSERT_FI_OK(post([&] {
            return fi_read(a().ep, local->data() + 2048 * i, 2048, local->desc, a().peer[1],
                           rma_addr(*target, 0), target->key, ctx(10 + i));
        }));
    EXPECT_TRUE(cntr_reaches(a().read_cntr, 2)) << fi_cntr_read(a().read_cntr);
    EXPECT_TRUE(cntr_reaches(b().rread_cntr, 2)) << fi_cntr_read(b().rread_cntr);
    poll_for(kQuiet);
    EXPECT_EQ(fi_cntr_read(a().write_cntr), 3u);
    EXPECT_EQ(fi_cntr_read(a().read_cntr), 2u);
    EXPECT_EQ(fi_cntr_read(b().rwrite_cntr), 3u);
    EXPECT_EQ(fi_cntr_read(b().rread_cntr), 2u);
    EXPECT_EQ(fi_cntr_read(a().rwrite_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(b().write_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(a().send_cntr), 0u) << "RMA counted as a send";
}

// fi_cntr(3): FI_REMOTE_READ counts reads of our memory that have completed. Once it moves,
// the target may change that memory, and the reader must still get the bytes it read (a
// large read leaves in many pieces: counting it when its response was only queued let the
// new bytes travel).
TEST_F(BoundCntrTest, TargetMayReuseMemoryOnceRemoteReadIsCounted) {
    constexpr size_t kLen = 8 << 20;
    auto target = buf(kLen, 0, true);
    auto local = buf(kLen);
    fill_pattern(target->data(), kLen, 33);
    ASSERT_FI_OK(post([&] {
        return fi_read(a().ep, local->data(), kLen, local->desc, a().peer[1], rma_addr(*target, 0),
                       target->key, ctx(1));
    }));
    ASSERT_TRUE(poll_until([&] { return fi_cntr_read(b().rread_cntr) >= 1; }))
        << "remote read never counted";
    std::memset(target->data(), 0x5A, kLen);  // the read is over for the target
    EXPECT_TRUE(cntr_reaches(a().read_cntr, 1)) << fi_cntr_read(a().read_cntr);
    EXPECT_EQ(fi_cntr_readerr(a().read_cntr), 0u);
    EXPECT_EQ(check_pattern(local->data(), kLen, 33), -1)
        << "the reader got bytes written after its read was counted at the target";
}

TEST_F(BoundCntrTest, FailedRmaIncrementsErrorValue) {
    auto target = buf(4096, 0, true);
    auto local = buf(4096);
    const uint64_t bad_key = target->key + 0x5151;
    ASSERT_FI_OK(post([&] {
        return fi_write(a().ep, local->data(), 64, local->desc, a().peer[1], rma_addr(*target),
                        bad_key, ctx(0));
    }));
    EXPECT_TRUE(poll_until([&] { return fi_cntr_readerr(a().write_cntr) >= 1; }))
        << "write counter error value " << fi_cntr_readerr(a().write_cntr);
    EXPECT_EQ(fi_cntr_read(a().write_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(b().rwrite_cntr), 0u);
    // The failure is also reported on the CQ although no completion was requested.
    EXPECT_TRUE(poll_until([&] { return !a().log.errs.empty(); })) << a().log.summary();
}

TEST_F(BoundCntrTest, CntrWaitDrivesProgress) {
    auto s = buf(64);
    auto r = buf(64);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 64, s->desc, a().peer[1], ctx(0)); }));
    // Another thread keeps a's side moving; b only progresses inside fi_cntr_wait.
    std::atomic<bool> stop{false};
    std::thread helper([&] {
        while (!stop.load()) {
            a().log.drain();
            sched_yield();
        }
    });
    int ret = -FI_ETIMEDOUT;
    auto t0 = Clock::now();
    while (ret == -FI_ETIMEDOUT && Clock::now() - t0 < kTimeout)
        ret = fi_cntr_wait(b().recv_cntr, 1, 1000);
    stop = true;
    helper.join();
    EXPECT_EQ(ret, 0) << fi_err_str(ret);
    EXPECT_EQ(fi_cntr_read(b().recv_cntr), 1u);
}

TEST_F(BoundCntrTest, CloseWhileBoundIsBusy) {
    int ret = fi_close(&a().send_cntr->fid);
    EXPECT_EQ(ret, -FI_EBUSY) << fi_err_str(ret);
    if (ret == 0) a().send_cntr.release();
}

}  // namespace
}  // namespace tandem_test

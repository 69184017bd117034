// fi_msg(3) over FI_EP_RDM: send/recv of every size class (eager and rendezvous),
// unexpected messages, iovecs, CQ data, inject, truncation, ordering, directed receive,
// FI_MULTI_RECV, FI_SELECTIVE_COMPLETION and cancel.
#include "fabric_fixture.h"
#include "peer/ep_diag.h"

#include <cstdlib>
#include <cstring>

namespace tandem_test {
namespace {

class RdmMsgTest : public FabricTest {
  protected:
    // n sends from a to b of size_of(i) bytes (at most 300 KiB), each matched by the i-th of n
    // receives posted before the sends (receives_first) or after every send has arrived:
    // each receive gets the message sent i-th, whole.
    void sends_match_in_order(int n, size_t (*size_of)(int), int seed, bool receives_first) {
        if (!(info->tx_attr->msg_order & FI_ORDER_SAS))
            GTEST_SKIP() << "provider does not claim FI_ORDER_SAS";
        constexpr size_t kRoom = 300 << 10;
        std::vector<std::unique_ptr<DataBuf>> sends, recvs;
        for (int i = 0; i < n; ++i) {
            sends.push_back(buf(size_of(i)));
            fill_pattern(sends.back()->data(), size_of(i), seed + i);
            recvs.push_back(buf(kRoom));
        }
        auto post_receives = [&] {
            for (int i = 0; i < n; ++i)
                ASSERT_FI_OK(post([&] {
                    return fi_recv(b().ep, recvs[i]->data(), kRoom, recvs[i]->desc, FI_ADDR_UNSPEC,
                                   ctx(100 + i));
                }));
        };
        if (receives_first) {
            ASSERT_NO_FATAL_FAILURE(post_receives());
        }
        for (int i = 0; i < n; ++i)
            ASSERT_FI_OK(post([&] {
                return fi_send(a().ep, sends[i]->data(), size_of(i), sends[i]->desc, a().peer[1],
                               ctx(i));
            }));
        if (!receives_first) {
            poll_for(std::chrono::milliseconds(100));  // every message arrives, unexpected
            ASSERT_TRUE(b().log.comps.empty()) << b().log.summary();
            ASSERT_NO_FATAL_FAILURE(post_receives());
        }
        ASSERT_TRUE(poll_until([&] {
            return b().log.comps.size() + b().log.errs.size() >= size_t(n) &&
                   a().log.comps.size() + a().log.errs.size() >= size_t(n);
        })) << a().log.summary()
            << " / " << b().log.summary();
        EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
        for (int i = 0; i < n; ++i) {
            auto rc = b().log.find(ctx(100 + i));
            ASSERT_TRUE(rc) << i << ": " << b().log.summary();
            EXPECT_EQ(rc->len, size_of(i)) << "receive " << i << " matched another message";
            EXPECT_EQ(check_pattern(recvs[i]->data(), size_of(i), seed + i), -1) << i;
        }
    }
};

std::string size_name(const ::testing::TestParamInfo<size_t> &p) {
    size_t s = p.param;
    if (s >= (1 << 20) && s % (1 << 20) == 0) return std::to_string(s >> 20) + "MiB";
    if (s >= 1024 && s % 1024 == 0) return std::to_string(s >> 10) + "KiB";
    return std::to_string(s) + "B";
}

// ---- queue depth ---------------------------------------------------------------------------

class RequestedQueueDepth : public FabricTest {
    void configure(FabricOptions &o) override { o.tx_size = o.rx_size = 8; }
};

// The depth asked for in the hints is the endpoint's: a receive beyond it waits (-FI_EAGAIN)
// rather than being queued.
TEST_F(RequestedQueueDepth, IsTheEndpointsLimit) {
    EXPECT_EQ(info->tx_attr->size, 8u);
    EXPECT_EQ(info->rx_attr->size, 8u);
    auto r = buf(64);
    for (int i = 0; i < 8; ++i)
        ASSERT_FI_OK(fi_recv(a().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(i)));
    EXPECT_EQ(fi_recv(a().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(8)), -FI_EAGAIN);
}

// fi_tx_size_left: deprecated in the API, still offered (tandem implements it), and the one
// view a test has of the transmit queue's free places.
ssize_t tx_places_left(fid_ep *ep) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return fi_tx_size_left(ep);
#pragma GCC diagnostic pop
}

// Over a link, a send holds its place in the transmit queue until the peer's link has it
// (acknowledged), even though it was reported complete when posted: with the peer making no
// progress, the queue's depth of sends go and the next waits (-FI_EAGAIN); the
// acknowledgements give the places back. (Node-local sends complete into the peer's ring and
// hold no place.) Over the verbs link the peer's NIC acknowledges, not its progress: the
// emulated device, like a real one, does so from its own thread at any moment, and a
// transmit that finds the queue full makes a progress pass that may reap them. So there the
// ninth send's outcome is the NIC's timing, and it is not asserted; the places held and given
// back are.
TEST_F(RequestedQueueDepth, LinkSendsHoldTheirPlaceUntilThePeerHasThem) {
    const char *local = std::getenv("FI_TANDEM_LOCAL");
    if (!local || std::string(local) != "0") GTEST_SKIP() << "sends over the link only";
    auto s = buf(64), r = buf(64 * 8);
    // The connection up, and its first message acknowledged.
    ASSERT_FI_OK(fi_recv(b().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(20)));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 64, s->desc, a().peer[1], ctx(30)); }));
    ASSERT_TRUE(wait_comp(b(), ctx(20)));
    ASSERT_TRUE(wait_comp(a(), ctx(30)));
    ASSERT_TRUE(poll_until([&] { return tx_places_left(a().ep) == 8; }));
    for (int i = 0; i < 8; ++i)
        ASSERT_FI_OK(fi_recv(b().ep, r->data() + 64 * i, 64, r->desc, FI_ADDR_UNSPEC, ctx(i)));
    // No progress from here until the ninth send: b's link reads nothing and acknowledges
    // nothing.
    for (int i = 0; i < 8; ++i) {
        fill_pattern(s->data(), 64, 900 + i);
        ASSERT_FI_OK(fi_send(a().ep, s->data(), 64, s->desc, a().peer[1], ctx(10 + i)));
    }
    EXPECT_EQ(tx_places_left(a().ep), 0);
    const char *link = std::getenv("FI_TANDEM_LINK");
    if (!link || std::string(link) != "verbs") {
        EXPECT_EQ(fi_send(a().ep, s->data(), 64, s->desc, a().peer[1], ctx(18)), -FI_EAGAIN);
    }
    for (int i = 0; i < 8; ++i) {
        ASSERT_TRUE(wait_comp(a(), ctx(10 + i))) << "send " << i;
        ASSERT_TRUE(wait_comp(b(), ctx(i))) << "receive " << i;
        EXPECT_EQ(check_pattern(r->data() + 64 * i, 64, 900 + i), -1) << "message " << i;
    }
    EXPECT_TRUE(poll_until([&] { return tx_places_left(a().ep) == 8; }))
        << "places not given back: " << tx_places_left(a().ep) << " left";
}

// ---- sizes ---------------------------------------------------------------------------------

class RdmSizeTest : public FabricTest, public ::testing::WithParamInterface<size_t> {};
class RdmUnexpectedSizeTest : public RdmSizeTest {};

TEST_P(RdmSizeTest, ExpectedMessageArrivesIntact) {
    const size_t len = GetParam();
    auto s = buf(len);
    auto r = buf(len + 64, 0xEE);
    fill_pattern(s->data(), len, 100);
    ASSERT_FI_OK(post(
        [&] { return fi_recv(b().ep, r->data(), len + 64, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), len, s->desc, a().peer[1], ctx(0)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << "receive of " << len << " bytes: " << b().log.summary();
    auto sc = wait_comp(a(), ctx(0));
    ASSERT_TRUE(sc) << "send of " << len << " bytes: " << a().log.summary();
    EXPECT_EQ(rc->len, len);
    EXPECT_EQ(check_pattern(r->data(), len, 100), -1);
    EXPECT_EQ(check_fill(r->data() + len, 64, 0xEE), -1) << "bytes written past the message";
    EXPECT_EQ(b().log.comps.size(), 1u);
    EXPECT_EQ(a().log.comps.size(), 1u);
}

TEST_P(RdmUnexpectedSizeTest, UnexpectedMessageIsDeliveredToLaterReceive) {
    const size_t len = GetParam();
    auto s = buf(len);
    auto r = buf(len);
    fill_pattern(s->data(), len, 101);
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), len, s->desc, a().peer[1], ctx(0)); }));
    poll_for(100ms);  // let it arrive with no receive posted
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), len, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    EXPECT_EQ(rc->len, len);
    EXPECT_EQ(check_pattern(r->data(), len, 101), -1);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RdmSizeTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{4096}, size_t{65536},
                                           size_t{1} << 20, size_t{16} << 20, size_t{64} << 20),
                         size_name);
INSTANTIATE_TEST_SUITE_P(Sizes, RdmUnexpectedSizeTest,
                         ::testing::Values(size_t{63}, size_t{65536}, size_t{16} << 20), size_name);

// ---- basic variants ------------------------------------------------------------------------

TEST_F(RdmMsgTest, BothDirectionsAtOnce) {
    const size_t len = 8 << 20;
    auto sa = buf(len), sb = buf(len), ra = buf(len), rb = buf(len);
    fill_pattern(sa->data(), len, 110);
    fill_pattern(sb->data(), len, 111);
    ASSERT_FI_OK(
        post([&] { return fi_recv(a().ep, ra->data(), len, ra->desc, FI_ADDR_UNSPEC, ctx(2)); }));
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, rb->data(), len, rb->desc, FI_ADDR_UNSPEC, ctx(3)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, sa->data(), len, sa->desc, a().peer[1], ctx(0)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(b().ep, sb->data(), len, sb->desc, b().peer[0], ctx(1)); }));
    ASSERT_TRUE(poll_until([&] {
        return a().log.has(ctx(0)) && b().log.has(ctx(1)) && a().log.has(ctx(2)) &&
               b().log.has(ctx(3));
    })) << a().log.summary()
        << " / " << b().log.summary();
    EXPECT_EQ(check_pattern(rb->data(), len, 110), -1);
    EXPECT_EQ(check_pattern(ra->data(), len, 111), -1);
}

TEST_F(RdmMsgTest, SendToSelf) {
    auto s = buf(1000), r = buf(1000);
    fill_pattern(s->data(), 1000, 112);
    ASSERT_FI_OK(
        post([&] { return fi_recv(a().ep, r->data(), 1000, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 1000, s->desc, a().peer[0], ctx(0)); }));
    auto rc = wait_comp(a(), ctx(1));
    ASSERT_TRUE(rc) << a().log.summary();
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    EXPECT_EQ(rc->src, a().peer[0]);
    EXPECT_EQ(check_pattern(r->data(), 1000, 112), -1);
}

TEST_F(RdmMsgTest, SendvAndRecvvScatterGather) {
    const size_t tx_iovs = std::min<size_t>(3, info->tx_attr->iov_limit);
    const size_t rx_iovs = std::min<size_t>(2, info->rx_attr->iov_limit);
    ASSERT_GE(tx_iovs, 1u);
    const size_t seg[3] = {1000, 70000, 3};
    size_t total = 0;
    for (size_t i = 0; i < tx_iovs; ++i) total += seg[i];
    auto s = buf(total);
    fill_pattern(s->data(), total, 113);
    iovec siov[3];
    void *sdesc[3];
    size_t off = 0;
    for (size_t i = 0; i < tx_iovs; ++i) {
        siov[i] = {s->data() + off, seg[i]};
        sdesc[i] = s->desc;
        off += seg[i];
    }
    auto r = buf(total + 100);
    iovec riov[2];
    void *rdesc[2] = {r->desc, r->desc};
    const size_t first = rx_iovs == 2 ? 777 : total + 100;
    // Leave a gap of 50 bytes between the two receive segments.
    riov[0] = {r->data(), first};
    if (rx_iovs == 2) riov[1] = {r->data() + first + 50, total + 50 - first};
    std::memset(r->data(), 0xEE, total + 100);
    ASSERT_FI_OK(
        post([&] { return fi_recvv(b().ep, riov, rdesc, rx_iovs, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_sendv(a().ep, siov, sdesc, tx_iovs, a().peer[1], ctx(0)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->len, total);
    if (rx_iovs == 2) {
        EXPECT_EQ(check_pattern(r->data(), first, 113), -1);
        EXPECT_EQ(check_fill(r->data() + first, 50, 0xEE), -1) << "gap between iovecs written";
        EXPECT_EQ(check_pattern(r->data() + first + 50, total - first, 113, first), -1);
    } else {
        EXPECT_EQ(check_pattern(r->data(), total, 113), -1);
    }
}

TEST_F(RdmMsgTest, SendmsgAndRecvmsgWithCqData) {
    auto s = buf(300), r = buf(300);
    fill_pattern(s->data(), 300, 114);
    iovec riov = {r->data(), 300};
    void *rdesc = r->desc;
    fi_msg rmsg{};
    rmsg.msg_iov = &riov;
    rmsg.desc = &rdesc;
    rmsg.iov_count = 1;
    rmsg.addr = FI_ADDR_UNSPEC;
    rmsg.context = ctx(1);
    ASSERT_FI_OK(post([&] { return fi_recvmsg(b().ep, &rmsg, FI_COMPLETION); }));
    iovec siov = {s->data(), 300};
    void *sdesc = s->desc;
    fi_msg smsg{};
    smsg.msg_iov = &siov;
    smsg.desc = &sdesc;
    smsg.iov_count = 1;
    smsg.addr = a().peer[1];
    smsg.context = ctx(0);
    smsg.data = 0xC0FFEE;
    ASSERT_FI_OK(
        post([&] { return fi_sendmsg(a().ep, &smsg, FI_REMOTE_CQ_DATA | FI_COMPLETION); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    EXPECT_TRUE(rc->flags & FI_REMOTE_CQ_DATA);
    EXPECT_EQ(rc->data, 0xC0FFEEu);
    EXPECT_EQ(check_pattern(r->data(), 300, 114), -1);
}

TEST_F(RdmMsgTest, SenddataDeliversCqData) {
    for (size_t len : {size_t{16}, size_t{2} << 20}) {
        a().log.clear();
        b().log.clear();
        auto s = buf(len), r = buf(len);
        fill_pattern(s->data(), len, 115);
        ASSERT_FI_OK(
            post([&] { return fi_recv(b().ep, r->data(), len, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
        ASSERT_FI_OK(post([&] {
            return fi_senddata(a().ep, s->data(), len, s->desc, 0xFEEDF00Dull + len, a().peer[1],
                               ctx(0));
        }));
        auto rc = wait_comp(b(), ctx(1));
        ASSERT_TRUE(rc) << len << ": " << b().log.summary();
        EXPECT_TRUE(rc->flags & FI_REMOTE_CQ_DATA);
        EXPECT_EQ(rc->data, 0xFEEDF00Dull + len);
        EXPECT_EQ(check_pattern(r->data(), len, 115), -1);
        ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    }
}

TEST_F(RdmMsgTest, PlainSendCarriesNoCqData) {
    auto s = buf(16), r = buf(16);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 16, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 16, s->desc, a().peer[1], ctx(0)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_FALSE(rc->flags & FI_REMOTE_CQ_DATA);
}

TEST_F(RdmMsgTest, InjectReusesBufferAndWritesNoCompletion) {
    const size_t len = std::min<size_t>(64, info->tx_attr->inject_size);
    ASSERT_GT(len, 0u);
    std::vector<uint8_t> s(len);
    auto r = buf(len);
    fill_pattern(s.data(), len, 116);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), len, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_inject(a().ep, s.data(), len, a().peer[1]); }));
    std::fill(s.begin(), s.end(), 0);  // the buffer is ours again at once
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->len, len);
    EXPECT_EQ(check_pattern(r->data(), len, 116), -1);
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.comps.empty()) << "fi_inject wrote a completion: " << a().log.summary();
    EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
}

TEST_F(RdmMsgTest, InjectdataDeliversCqData) {
    const size_t len = std::min<size_t>(32, info->tx_attr->inject_size);
    std::vector<uint8_t> s(len);
    fill_pattern(s.data(), len, 117);
    auto r = buf(len);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), len, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_injectdata(a().ep, s.data(), len, 4321, a().peer[1]); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_TRUE(rc->flags & FI_REMOTE_CQ_DATA);
    EXPECT_EQ(rc->data, 4321u);
    EXPECT_EQ(check_pattern(r->data(), len, 117), -1);
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.comps.empty()) << a().log.summary();
}

// ---- truncation ----------------------------------------------------------------------------

struct TruncCase {
    size_t msg, rbuf;
};

class RdmTruncTest : public FabricTest, public ::testing::WithParamInterface<TruncCase> {};

TEST_P(RdmTruncTest, OversizedMessageCompletesWithEtrunc) {
    const auto [msg, rlen] = GetParam();
    auto s = buf(msg);
    auto r = buf(rlen + 64, 0xEE);
    fill_pattern(s->data(), msg, 118);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), rlen, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), msg, s->desc, a().peer[1], ctx(0)); }));
    auto err = wait_err(b(), ctx(1));
    ASSERT_TRUE(err) << "no error completion for a truncated receive: " << b().log.summary();
    EXPECT_EQ(err->e.err, FI_ETRUNC) << describe(*err);
    EXPECT_TRUE(err->e.flags & FI_RECV);
    EXPECT_EQ(err->e.len, rlen);
    EXPECT_EQ(err->e.olen, msg - rlen);
    EXPECT_EQ(check_pattern(r->data(), rlen, 118), -1) << "the part that fit is not the prefix";
    EXPECT_EQ(check_fill(r->data() + rlen, 64, 0xEE), -1) << "written past the receive buffer";
    // The sender hears about its send exactly once (success or error), and nothing hangs.
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(0)) || a().log.has_err(ctx(0)); }))
        << a().log.summary();
    poll_for(kQuiet);
    EXPECT_EQ(a().log.count(ctx(0)) + (a().log.has_err(ctx(0)) ? 1 : 0), 1u);
    EXPECT_FALSE(b().log.has(ctx(1))) << "truncated receive also completed successfully";
    // The endpoint pair keeps working.
    auto r2 = buf(msg);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r2->data(), msg, r2->desc, FI_ADDR_UNSPEC, ctx(3)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), msg, s->desc, a().peer[1], ctx(2)); }));
    ASSERT_TRUE(wait_comp(b(), ctx(3))) << b().log.summary();
    EXPECT_EQ(check_pattern(r2->data(), msg, 118), -1);
}

INSTANTIATE_TEST_SUITE_P(Cases, RdmTruncTest,
                         ::testing::Values(TruncCase{200, 64}, TruncCase{1 << 20, 64 << 10},
                                           TruncCase{4 << 20, 100}),
                         [](const ::testing::TestParamInfo<TruncCase> &p) {
                             return std::to_string(p.param.msg) + "_into_" +
                                    std::to_string(p.param.rbuf);
                         });

// ---- ordering and volume -------------------------------------------------------------------

TEST_F(RdmMsgTest, MessagesMatchReceivesInSendOrder) {
    sends_match_in_order(
        40, [](int i) -> size_t { return (i % 3 == 2) ? (300 << 10) : 100 + i; }, 1000, true);
}

// The same with every message arriving before its receive: small ones (node-local: Short
// cells, which tandem keeps as unexpected itself) and large ones (a rendezvous or staged
// cells, which the path that carries them holds) wait in one queue, so the receives posted
// afterwards take them in the order they were sent.
TEST_F(RdmMsgTest, UnexpectedMessagesOfEverySizeMatchReceivesInSendOrder) {
    sends_match_in_order(
        24, [](int i) -> size_t { return (i % 4 == 3) ? (300 << 10) : 8 * i; }, 2000, false);
}

// A small send behind a large one to the same peer that still waits for its receiver (a
// rendezvous: complete when the receiver has read it) is not held behind it: it completes at
// once (completions carry no order, FI_ORDER_NONE), and the receives posted afterwards take the
// two in the order they were sent. Node-local, the small one is a Short cell in the peer's
// ring behind the large one's Rts.
TEST_F(RdmMsgTest, SmallSendBehindAWaitingLargeOneCompletesAtOnce) {
    if (!is_own(info.get())) GTEST_SKIP() << "completion timing is the provider's own";
    void *ops = nullptr;
    ASSERT_EQ(fi_open_ops(&a().ep->fid, tandem::peer::kEpDiagOpsName, 0, &ops, nullptr), 0);
    if (static_cast<tandem::peer::EpDiagOps *>(ops)->peer_path(a().ep, a().peer[1]) ==
        int(tandem::peer::PeerPath::LocalStaged))
        GTEST_SKIP() << "no cross-memory attach here: a large node-local send is staged, and "
                        "completes without its receiver";
    constexpr size_t kLarge = 4 << 20, kSmall = 64;
    auto large = buf(kLarge), small = buf(kSmall), r0 = buf(kLarge), r1 = buf(kSmall);
    fill_pattern(large->data(), kLarge, 71);
    fill_pattern(small->data(), kSmall, 72);
    ASSERT_FI_OK(post(
        [&] { return fi_send(a().ep, large->data(), kLarge, large->desc, a().peer[1], ctx(0)); }));
    ASSERT_FI_OK(post(
        [&] { return fi_send(a().ep, small->data(), kSmall, small->desc, a().peer[1], ctx(1)); }));
    ASSERT_TRUE(wait_comp(a(), ctx(1))) << a().log.summary();
    EXPECT_FALSE(a().log.has(ctx(0))) << "the large send completed with no receive posted";
    ASSERT_FI_OK(post(
        [&] { return fi_recv(b().ep, r0->data(), kLarge, r0->desc, FI_ADDR_UNSPEC, ctx(10)); }));
    ASSERT_FI_OK(post(
        [&] { return fi_recv(b().ep, r1->data(), kSmall, r1->desc, FI_ADDR_UNSPEC, ctx(11)); }));
    auto c0 = wait_comp(b(), ctx(10)), c1 = wait_comp(b(), ctx(11));
    ASSERT_TRUE(c0 && c1) << b().log.summary();
    EXPECT_EQ(c0->len, kLarge);
    EXPECT_EQ(c1->len, kSmall);
    EXPECT_EQ(check_pattern(r0->data(), kLarge, 71), -1);
    EXPECT_EQ(check_pattern(r1->data(), kSmall, 72), -1);
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
}

// FI_DELIVERY_COMPLETE sends (which the receiver answers) interleaved with plain ones, from
// 0 B to past the eager limit, tagged and untagged, with and without CQ data: every message
// lands intact, in order, with its data, and every send completes.
TEST_F(RdmMsgTest, DeliveryCompleteAndPlainSendsInterleave) {
    if (!(info->tx_attr->msg_order & FI_ORDER_SAS))
        GTEST_SKIP() << "provider does not claim FI_ORDER_SAS";
    constexpr int kN = 48;
    auto size_of = [](int i) -> size_t {
        static const size_t sizes[] = {0, 1, 8, 24, 25, 100, 4000, 20000};
        return sizes[i % 8];
    };
    std::vector<std::unique_ptr<DataBuf>> sends, recvs;
    for (int i = 0; i < kN; ++i) {
        sends.push_back(buf(size_of(i) + 1));
        fill_pattern(sends.back()->data(), size_of(i), 2000 + i);
        recvs.push_back(buf(20000));
    }
    for (int i = 0; i < kN; ++i)
        ASSERT_FI_OK(post([&] {
            return fi_recv(b().ep, recvs[i]->data(), 20000, recvs[i]->desc, FI_ADDR_UNSPEC,
                           ctx(100 + i));
        }));
    for (int i = 0; i < kN; ++i) {
        iovec iov = {sends[i]->data(), size_of(i)};
        void *desc = sends[i]->desc;
        fi_msg m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = a().peer[1];
        m.context = ctx(i);
        m.data = 0x5000 + i;
        uint64_t flags = FI_COMPLETION | ((i / 8) % 2 ? FI_DELIVERY_COMPLETE : 0) |
                         (i % 3 ? FI_REMOTE_CQ_DATA : 0);
        ASSERT_FI_OK(post([&] { return fi_sendmsg(a().ep, &m, flags); })) << i;
    }
    ASSERT_TRUE(poll_until([&] {
        return b().log.comps.size() + b().log.errs.size() >= kN &&
               a().log.comps.size() + a().log.errs.size() >= kN;
    })) << a().log.summary()
        << " / " << b().log.summary();
    EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
    EXPECT_TRUE(b().log.errs.empty()) << b().log.summary();
    for (int i = 0; i < kN; ++i) {
        EXPECT_TRUE(a().log.find(ctx(i))) << "send " << i << " did not complete";
        auto rc = b().log.find(ctx(100 + i));
        ASSERT_TRUE(rc) << i;
        EXPECT_EQ(rc->len, size_of(i)) << "receive " << i << " matched another message";
        EXPECT_EQ(check_pattern(recvs[i]->data(), size_of(i), 2000 + i), -1) << i;
        EXPECT_EQ(bool(rc->flags & FI_REMOTE_CQ_DATA), i % 3 != 0) << i;
        if (i % 3) {
            EXPECT_EQ(rc->data, uint64_t(0x5000 + i)) << i;
        }
    }
}

// An endpoint closes and the same process opens another at its address (src_addr: the
// first one's name), as fabtests' rdm_multi_client -R does, and as happens when the kernel
// hands the next endpoint the port the last one freed. Its peer reaches the new one through
// the address inserted again and through the one inserted before (delivery-complete sends,
// answered both ways, and plain ones), and every message arrives once, intact.
TEST_F(RdmMsgTest, AnEndpointReopenedAtItsAddressIsReachedThere) {
    auto s = buf(64), r = buf(64);
    // at_once: the send is taken by its first call (no -FI_EAGAIN to retry).
    const auto arrives = [&](Endpoint &from, Endpoint &at, fi_addr_t to, uint32_t seed, int i,
                             uint64_t flags = FI_DELIVERY_COMPLETE, bool at_once = false) {
        std::memset(r->data(), 0, 64);
        ASSERT_FI_OK(
            post([&] { return fi_recv(at.ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(i)); }));
        fill_pattern(s->data(), 64, seed);
        iovec iov = {s->data(), 64};
        void *desc = s->desc;
        fi_msg m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = to;
        m.context = ctx(i + 1);
        if (at_once)
            ASSERT_EQ(fi_sendmsg(from.ep, &m, FI_COMPLETION | flags), 0) << seed;
        else
            ASSERT_FI_OK(post([&] { return fi_sendmsg(from.ep, &m, FI_COMPLETION | flags); }));
        ASSERT_TRUE(wait_comp(at, ctx(i)))
            << "message " << seed << " did not arrive: " << at.log.summary();
        EXPECT_EQ(check_pattern(r->data(), 64, seed), -1) << seed;
        ASSERT_TRUE(wait_comp(from, ctx(i + 1)))
            << "the send of message " << seed << " did not end: " << from.log.summary();
    };
    // Both ways first: a keeps b as a destination, and as the last sender it answered.
    ASSERT_NO_FATAL_FAILURE(arrives(a(), b(), a().peer[1], 31, 0, 0));
    ASSERT_NO_FATAL_FAILURE(arrives(b(), a(), b().peer[0], 32, 2));

    const std::vector<uint8_t> name = b().name;
    const fi_addr_t before = a().peer[1];
    eps.pop_back();  // b's endpoint, AV and CQ close
    void *const saved = info->src_addr;
    const size_t saved_len = info->src_addrlen;
    info->src_addr = const_cast<uint8_t *>(name.data());
    info->src_addrlen = name.size();
    add_endpoint();
    info->src_addr = saved;
    info->src_addrlen = saved_len;
    ASSERT_EQ(eps.size(), 2u);
    ASSERT_EQ(b().name, name) << "the new endpoint is not at the first one's address";
    ASSERT_NO_FATAL_FAILURE(insert_all_names());

    // Node-local, a's Short cell through the lane it kept for the old address goes first, and
    // into the new endpoint's ring at its first call (the closed lane is replaced there). Over
    // a link, the new endpoint speaks first: what a writes on its connection to the
    // closed one before reading that connection's reset is lost, as over tcp;ofi_rxm.
    const char *local = std::getenv("FI_TANDEM_LOCAL");
    const bool over_link = local && std::string(local) == "0";
    if (!over_link) {
        ASSERT_NO_FATAL_FAILURE(arrives(a(), b(), before, 33, 4, 0, true));
    }
    ASSERT_NO_FATAL_FAILURE(arrives(b(), a(), b().peer[0], 34, 6));
    if (over_link) {
        ASSERT_NO_FATAL_FAILURE(arrives(a(), b(), before, 33, 4, 0));
    }
    ASSERT_NO_FATAL_FAILURE(arrives(a(), b(), a().peer[1], 35, 8));
    ASSERT_NO_FATAL_FAILURE(arrives(a(), b(), before, 36, 10));
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
    EXPECT_TRUE(b().log.errs.empty()) << b().log.summary();
    EXPECT_EQ(b().log.comps.size(), 4u) << "a message arrived twice: " << b().log.summary();
}

TEST_F(RdmMsgTest, ThousandsOfSmallMessages) {
    constexpr int kTotal = 4000, kWindow = 200;
    auto s = buf(8 * kWindow), r = buf(8 * kWindow);
    uint64_t received = 0, sum = 0;
    for (int base = 0; base < kTotal; base += kWindow) {
        a().log.clear();
        b().log.clear();
        for (int i = 0; i < kWindow; ++i)
            ASSERT_FI_OK(post([&] {
                return fi_recv(b().ep, r->data() + 8 * i, 8, r->desc, FI_ADDR_UNSPEC, ctx(i));
            }));
        for (int i = 0; i < kWindow; ++i) {
            uint64_t v = base + i;
            std::memcpy(s->data() + 8 * i, &v, 8);
            ASSERT_FI_OK(post([&] {
                return fi_send(a().ep, s->data() + 8 * i, 8, s->desc, a().peer[1],
                               ctx(kWindow + i));
            }));
        }
        ASSERT_TRUE(poll_until([&] {
            return b().log.comps.size() >= kWindow && a().log.comps.size() >= kWindow;
        })) << "window "
            << base << ": " << a().log.summary() << " / " << b().log.summary();
        ASSERT_TRUE(a().log.errs.empty() && b().log.errs.empty());
        for (int i = 0; i < kWindow; ++i) {
            uint64_t v;
            std::memcpy(&v, r->data() + 8 * i, 8);
            sum += v;
        }
        received += b().log.comps.size();
    }
    EXPECT_EQ(received, static_cast<uint64_t>(kTotal));
    EXPECT_EQ(sum, static_cast<uint64_t>(kTotal) * (kTotal - 1) / 2) << "lost or duplicated data";
}

// ---- cancel --------------------------------------------------------------------------------

// A peer that closed its endpoint, its process running on, receives nothing more: a send to
// it fails, once the sender has seen it go (half a second of progress here), rather than
// completing into an inbox nobody reads (it did, node-local). Node-local the peer is gone
// (FI_ECONNRESET, as for a peer whose process died); over a link the connection the send
// needs is refused (FI_ECONNREFUSED: nobody listens at the address).
TEST_F(RdmMsgTest, SendsToAPeerWhoseEndpointClosedFail) {
    const char *local = std::getenv("FI_TANDEM_LOCAL");
    const int expected = local && std::strcmp(local, "0") == 0 ? FI_ECONNREFUSED : FI_ECONNRESET;
    ASSERT_NO_FATAL_FAILURE(exchange_checked(142));
    eps.erase(eps.begin() + 1);  // b closed: its endpoint, then its AV and CQ
    poll_for(std::chrono::milliseconds(500));
    auto s = buf(128);
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 128, s->desc, a().peer[1], ctx(7)); }));
    auto err = wait_err(a(), ctx(7));
    ASSERT_TRUE(err) << a().log.summary();
    EXPECT_EQ(err->e.err, expected) << describe(*err);
}

TEST_F(RdmMsgTest, CancelledReceiveCompletesWithEcanceledAndIsNotMatched) {
    auto r1 = buf(64, 0xAB), r2 = buf(64), s = buf(64);
    fill_pattern(s->data(), 64, 119);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r1->data(), 64, r1->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(fi_cancel(&b().ep->fid, ctx(1)));
    auto err = wait_err(b(), ctx(1));
    ASSERT_TRUE(err) << b().log.summary();
    EXPECT_EQ(err->e.err, FI_ECANCELED);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r2->data(), 64, r2->desc, FI_ADDR_UNSPEC, ctx(2)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 64, s->desc, a().peer[1], ctx(0)); }));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    EXPECT_EQ(check_pattern(r2->data(), 64, 119), -1);
    EXPECT_EQ(check_fill(r1->data(), 64, 0xAB), -1) << "cancelled buffer was written";
    EXPECT_FALSE(b().log.has(ctx(1)));
}

// ---- source addresses ----------------------------------------------------------------------

class RdmThreeTest : public FabricTest {
  protected:
    void configure(FabricOptions &o) override { o.num_eps = 3; }
    Endpoint &c() { return *eps.at(2); }
};

TEST_F(RdmThreeTest, DirectedReceiveOnlyMatchesItsSource) {
    auto sa = buf(128), sc = buf(128), r1 = buf(128), r2 = buf(128);
    fill_pattern(sa->data(), 128, 120);
    fill_pattern(sc->data(), 128, 121);
    // Receive only from c.
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r1->data(), 128, r1->desc, b().peer[2], ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, sa->data(), 128, sa->desc, a().peer[1], ctx(10)); }));
    poll_for(100ms);
    EXPECT_FALSE(b().log.has(ctx(1))) << "receive directed at c matched a message from a";
    ASSERT_FI_OK(
        post([&] { return fi_send(c().ep, sc->data(), 128, sc->desc, c().peer[1], ctx(11)); }));
    auto rc1 = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc1) << b().log.summary();
    EXPECT_EQ(rc1->src, b().peer[2]);
    EXPECT_EQ(check_pattern(r1->data(), 128, 121), -1);
    // a's message is still waiting for a receive that accepts it.
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r2->data(), 128, r2->desc, FI_ADDR_UNSPEC, ctx(2)); }));
    auto rc2 = wait_comp(b(), ctx(2));
    ASSERT_TRUE(rc2) << b().log.summary();
    EXPECT_EQ(rc2->src, b().peer[0]);
    EXPECT_EQ(check_pattern(r2->data(), 128, 120), -1);
}

TEST_F(RdmThreeTest, SourceUnknownToReceiverIsReportedAsNotAvailable) {
    // b forgets c; c can still send to b (connectionless), b just cannot name the source.
    ASSERT_FI_OK(fi_av_remove(b().av, &b().peer[2], 1, 0));
    auto s = buf(32), r = buf(32);
    fill_pattern(s->data(), 32, 122);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 32, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(c().ep, s->data(), 32, s->desc, c().peer[1], ctx(0)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->src, FI_ADDR_NOTAVAIL);
    EXPECT_EQ(check_pattern(r->data(), 32, 122), -1);
}

// An fi_addr_t freed by fi_av_remove and handed out again for another endpoint names that
// endpoint from then on: nothing may still route it to the old one.
TEST_F(RdmThreeTest, ReusedAddressReachesTheNewPeer) {
    auto s1 = buf(16), s2 = buf(16), rb = buf(16), rc = buf(16);
    fill_pattern(s1->data(), 16, 130);
    fill_pattern(s2->data(), 16, 131);
    fi_addr_t dest = a().peer[1];
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, rb->data(), 16, rb->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_send(a().ep, s1->data(), 16, s1->desc, dest, ctx(10)); }));
    ASSERT_TRUE(wait_comp(b(), ctx(1))) << b().log.summary();
    ASSERT_TRUE(wait_comp(a(), ctx(10))) << a().log.summary();
    // b out, c in: FI_AV_TABLE reuses the lowest free index (fi_av(3)). (c leaves first: an
    // address inserted while present keeps its entry.)
    ASSERT_FI_OK(fi_av_remove(a().av, &a().peer[2], 1, 0));
    ASSERT_FI_OK(fi_av_remove(a().av, &dest, 1, 0));
    fi_addr_t reused = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(a().av, c().name.data(), 1, &reused, 0, nullptr), 1);
    ASSERT_EQ(reused, dest) << "the AV did not reuse the freed index";
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, rb->data(), 16, rb->desc, FI_ADDR_UNSPEC, ctx(2)); }));
    ASSERT_FI_OK(
        post([&] { return fi_recv(c().ep, rc->data(), 16, rc->desc, FI_ADDR_UNSPEC, ctx(3)); }));
    ASSERT_FI_OK(post([&] { return fi_send(a().ep, s2->data(), 16, s2->desc, dest, ctx(11)); }));
    auto got = wait_comp(c(), ctx(3));
    ASSERT_TRUE(got) << c().log.summary() << " / b: " << b().log.summary();
    EXPECT_EQ(check_pattern(rc->data(), 16, 131), -1);
    poll_for(50ms);
    EXPECT_FALSE(b().log.has(ctx(2))) << "the message went to the endpoint removed from the AV";
}

// ---- FI_MULTI_RECV -------------------------------------------------------------------------

class MultiRecvTest : public FabricTest, public ::testing::WithParamInterface<size_t> {
  protected:
    void before_enable(Endpoint &e, size_t) override {
        size_t min = GetParam();
        ASSERT_FI_OK(
            fi_setopt(&e.ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof(min)));
    }
};

TEST_P(MultiRecvTest, OneBufferReceivesManyMessages) {
    const size_t msg = GetParam();
    constexpr size_t kSlots = 16;
    auto big = buf(msg * kSlots, 0xEE);
    auto s = buf(msg);
    size_t got = 0;
    {
        size_t min = 0, len = sizeof(min);
        ASSERT_FI_OK(fi_getopt(&b().ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, &len));
        EXPECT_EQ(min, msg);
    }
    iovec iov = {big->data(), big->size()};
    void *desc = big->desc;
    fi_msg m{};
    m.msg_iov = &iov;
    m.desc = &desc;
    m.iov_count = 1;
    m.addr = FI_ADDR_UNSPEC;
    m.context = ctx(1);
    ASSERT_FI_OK(post([&] { return fi_recvmsg(b().ep, &m, FI_MULTI_RECV); }));
    bool released = false;
    std::vector<std::pair<uint8_t *, size_t>> placed;
    auto absorb = [&] {
        while (got < b().log.comps.size()) {
            const Completion &c = b().log.comps[got++];
            EXPECT_EQ(c.op_context, ctx(1));
            if (c.flags & FI_RECV) {
                auto *p = static_cast<uint8_t *>(c.buf);
                ASSERT_NE(p, nullptr) << "multi-recv completion without buf";
                ASSERT_GE(p, big->data());
                ASSERT_LE(p + c.len, big->data() + big->size()) << "message placed outside buffer";
                EXPECT_EQ(c.len, msg);
                EXPECT_EQ(check_pattern(p, c.len, 2000 + placed.size()), -1)
                    << "message " << placed.size();
                placed.emplace_back(p, c.len);
            }
            if (c.flags & FI_MULTI_RECV) released = true;
        }
    };
    for (size_t i = 0; i < kSlots && !released; ++i) {
        fill_pattern(s->data(), msg, 2000 + i);
        ASSERT_FI_OK(
            post([&] { return fi_send(a().ep, s->data(), msg, s->desc, a().peer[1], ctx(10)); }));
        ASSERT_TRUE(poll_until([&] {
            return b().log.count_flags(FI_RECV) > i || !b().log.errs.empty();
        })) << "message "
            << i << " not received; " << b().log.summary();
        ASSERT_TRUE(b().log.errs.empty()) << b().log.summary();
        ASSERT_TRUE(poll_until([&] { return a().log.count(ctx(10)) == i + 1; }))
            << a().log.summary();
        ASSERT_NO_FATAL_FAILURE(absorb());
    }
    if (!released) {
        // The release may come as a separate entry after the last message.
        poll_until([&] { return b().log.count_flags(FI_MULTI_RECV) > 0; });
        ASSERT_NO_FATAL_FAILURE(absorb());
    }
    EXPECT_TRUE(released) << "FI_MULTI_RECV release never reported";
    EXPECT_EQ(placed.size(), kSlots)
        << "messages of " << msg << " bytes fitting a buffer of " << kSlots << " such messages";
    for (size_t i = 1; i < placed.size(); ++i)
        EXPECT_GE(placed[i].first, placed[i - 1].first + placed[i - 1].second)
            << "messages overlap or are out of order in the multi-recv buffer";
    // Once released, the buffer takes no more data: the next message waits for a new receive.
    auto r = buf(msg);
    fill_pattern(s->data(), msg, 2999);
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), msg, s->desc, a().peer[1], ctx(11)); }));
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), msg, r->desc, FI_ADDR_UNSPEC, ctx(2)); }));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), msg, 2999), -1);
}

INSTANTIATE_TEST_SUITE_P(Sizes, MultiRecvTest, ::testing::Values(size_t{4096}, size_t{256} << 10),
                         size_name);

// ---- FI_SELECTIVE_COMPLETION ---------------------------------------------------------------

class SelectiveCompletionTest : public FabricTest {
  protected:
    void configure(FabricOptions &o) override {
        o.cq_bind_flags = FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION;
    }
};

// fi_ep_alias: the alias carries its own default flags; with selective completion, sends
// through an alias whose default includes FI_COMPLETION report, sends through the endpoint
// itself do not.
TEST_F(SelectiveCompletionTest, AliasCarriesItsOwnDefaultFlags) {
    fid_ep *alias = nullptr;
    ASSERT_EQ(fi_ep_alias(a().ep, &alias, FI_TRANSMIT | FI_RECV), -FI_EINVAL);
    ASSERT_FI_OK(fi_ep_alias(a().ep, &alias, FI_TRANSMIT | FI_COMPLETION));
    ASSERT_NE(alias, nullptr);
    auto s = buf(64), r = buf(128);
    fill_pattern(s->data(), 64, 7);
    for (int k = 0; k < 2; ++k) {
        iovec iov = {r->data() + 64 * k, 64};
        void *desc = r->desc;
        fi_msg m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = FI_ADDR_UNSPEC;
        m.context = ctx(1 + k);
        ASSERT_FI_OK(post([&] { return fi_recvmsg(b().ep, &m, FI_COMPLETION); }));
    }
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 64, s->desc, a().peer[1], ctx(10)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(alias, s->data(), 64, s->desc, a().peer[1], ctx(11)); }));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    ASSERT_TRUE(wait_comp(a(), ctx(11))) << a().log.summary();
    poll_for(kQuiet);
    EXPECT_FALSE(a().log.has(ctx(10))) << "the endpoint's own default has no FI_COMPLETION";
    EXPECT_EQ(fi_close(&a().ep->fid), -FI_EBUSY) << "an endpoint with an open alias closed";
    ASSERT_FI_OK(fi_close(&alias->fid));
}

TEST_F(SelectiveCompletionTest, OnlyOperationsWithFiCompletionReport) {
    auto s = buf(64), r = buf(128);
    fill_pattern(s->data(), 64, 123);
    auto recvmsg = [&](uint8_t *p, void *c, uint64_t flags) {
        iovec iov = {p, 64};
        void *desc = r->desc;
        fi_msg m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = FI_ADDR_UNSPEC;
        m.context = c;
        return post([&] { return fi_recvmsg(b().ep, &m, flags); });
    };
    ASSERT_FI_OK(recvmsg(r->data(), ctx(1), 0));
    ASSERT_FI_OK(recvmsg(r->data() + 64, ctx(2), FI_COMPLETION));
    // First send without a completion, second one with.
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 64, s->desc, a().peer[1], ctx(10)); }));
    iovec siov = {s->data(), 64};
    void *sdesc = s->desc;
    fi_msg sm{};
    sm.msg_iov = &siov;
    sm.desc = &sdesc;
    sm.iov_count = 1;
    sm.addr = a().peer[1];
    sm.context = ctx(11);
    ASSERT_FI_OK(post([&] { return fi_sendmsg(a().ep, &sm, FI_COMPLETION); }));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    ASSERT_TRUE(wait_comp(a(), ctx(11))) << a().log.summary();
    poll_for(kQuiet);
    EXPECT_FALSE(a().log.has(ctx(10))) << "send without FI_COMPLETION reported";
    EXPECT_FALSE(b().log.has(ctx(1))) << "receive without FI_COMPLETION reported";
    EXPECT_EQ(a().log.comps.size(), 1u);
    EXPECT_EQ(b().log.comps.size(), 1u);
    EXPECT_TRUE(a().log.errs.empty() && b().log.errs.empty());
    EXPECT_EQ(check_pattern(r->data(), 64, 123), -1);
    EXPECT_EQ(check_pattern(r->data() + 64, 64, 123), -1);
}

// fi_msg(3): the release of a multi-recv buffer is always reported, "even if other receive
// completions have been suppressed (FI_SELECTIVE_COMPLETION)".
TEST_F(SelectiveCompletionTest, MultiRecvReleaseIsReportedWithoutFiCompletion) {
    constexpr size_t kMsg = 4096, kSlots = 4;
    auto big = buf(kMsg * kSlots), s = buf(kMsg);
    iovec iov = {big->data(), big->size()};
    void *desc = big->desc;
    fi_msg m{};
    m.msg_iov = &iov;
    m.desc = &desc;
    m.iov_count = 1;
    m.addr = FI_ADDR_UNSPEC;
    m.context = ctx(1);
    ASSERT_FI_OK(post([&] { return fi_recvmsg(b().ep, &m, FI_MULTI_RECV); }));
    for (size_t i = 0; i < kSlots; ++i) {
        fill_pattern(s->data(), kMsg, 130 + i);
        iovec siov = {s->data(), kMsg};
        void *sdesc = s->desc;
        fi_msg sm{};
        sm.msg_iov = &siov;
        sm.desc = &sdesc;
        sm.iov_count = 1;
        sm.addr = a().peer[1];
        sm.context = ctx(10 + i);
        ASSERT_FI_OK(post([&] { return fi_sendmsg(a().ep, &sm, FI_COMPLETION); }));
        ASSERT_TRUE(wait_comp(a(), ctx(10 + i))) << a().log.summary();
    }
    ASSERT_TRUE(poll_until([&] { return b().log.count_flags(FI_MULTI_RECV) > 0; }))
        << "multi-recv buffer filled but its release was never reported; " << b().log.summary();
    EXPECT_EQ(b().log.count_flags(FI_MULTI_RECV), 1u);
    EXPECT_EQ(b().log.find(ctx(1))->op_context, ctx(1));
    for (size_t i = 0; i < kSlots; ++i)
        EXPECT_EQ(check_pattern(big->data() + i * kMsg, kMsg, 130 + i), -1) << "message " << i;
}

TEST_F(SelectiveCompletionTest, FailuresAreReportedEvenWithoutFiCompletion) {
    auto r = buf(64);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(fi_cancel(&b().ep->fid, ctx(1)));
    ASSERT_TRUE(poll_until([&] { return !b().log.errs.empty(); }))
        << "cancelled receive without FI_COMPLETION produced no error entry";
    EXPECT_EQ(b().log.errs[0].e.err, FI_ECANCELED);
}

}  // namespace
}  // namespace tandem_test

// fi_tagged(3) over FI_EP_RDM: tag matching with ignore masks, unexpected messages, directed
// receives, FI_PEEK / FI_CLAIM / FI_DISCARD, inject, CQ data and truncation.
#include "fabric_fixture.h"

#include <algorithm>

namespace tandem_test {
namespace {

class TaggedTest : public FabricTest {
  protected:
    ssize_t tsend(Endpoint &from, DataBuf &s, size_t len, fi_addr_t to, uint64_t tag, void *c) {
        return post([&] { return fi_tsend(from.ep, s.data(), len, s.desc, to, tag, c); });
    }
    // len bytes of s a -> b under tag, completing once delivered (FI_DELIVERY_COMPLETE).
    ssize_t tsend_delivery_complete(DataBuf &s, size_t len, uint64_t tag, void *c) {
        iovec iov = {s.data(), len};
        void *desc = s.desc;
        fi_msg_tagged m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = a().peer[1];
        m.tag = tag;
        m.context = c;
        return post([&] { return fi_tsendmsg(a().ep, &m, FI_COMPLETION | FI_DELIVERY_COMPLETE); });
    }
    ssize_t trecv(Endpoint &on, DataBuf &r, size_t len, uint64_t tag, uint64_t ignore, void *c,
                  fi_addr_t src = FI_ADDR_UNSPEC) {
        return post([&] { return fi_trecv(on.ep, r.data(), len, r.desc, src, tag, ignore, c); });
    }
    ssize_t trecvmsg(Endpoint &on, void *p, size_t len, void *desc, uint64_t tag, uint64_t ignore,
                     void *c, uint64_t flags) {
        iovec iov = {p, len};
        fi_msg_tagged m{};
        m.msg_iov = p ? &iov : nullptr;
        m.desc = p ? &desc : nullptr;
        m.iov_count = p ? 1 : 0;
        m.addr = FI_ADDR_UNSPEC;
        m.tag = tag;
        m.ignore = ignore;
        m.context = c;
        return post([&] { return fi_trecvmsg(on.ep, &m, flags); });
    }
    // A tagged receive of b at p (tag matched exactly), with the endpoint's default flags.
    ssize_t trecv_at(uint8_t *p, size_t len, void *desc, uint64_t tag, void *c) {
        return post([&] { return fi_trecv(b().ep, p, len, desc, FI_ADDR_UNSPEC, tag, 0, c); });
    }
    void forget_err(Endpoint &e, void *c) {
        auto &v = e.log.errs;
        v.erase(std::remove_if(v.begin(), v.end(),
                               [&](const CqError &x) { return x.e.op_context == c; }),
                v.end());
    }
    // Repeats an FI_PEEK (with `flags`) on b until a matching message is found.
    std::optional<Completion> peek_until_found(uint64_t tag, uint64_t ignore, uint64_t flags,
                                               void *c) {
        const auto deadline = Clock::now() + kTimeout;
        while (Clock::now() < deadline) {
            if (trecvmsg(b(), nullptr, 0, nullptr, tag, ignore, c, FI_PEEK | flags) != 0) {
                ADD_FAILURE() << "fi_trecvmsg(FI_PEEK) failed";
                return std::nullopt;
            }
            if (!poll_until([&] { return b().log.has(c) || b().log.has_err(c); })) {
                ADD_FAILURE() << "FI_PEEK produced neither a completion nor an error";
                return std::nullopt;
            }
            if (auto comp = b().log.find(c)) return comp;
            auto err = b().log.find_err(c);
            if (err->e.err != FI_ENOMSG) {
                ADD_FAILURE() << "FI_PEEK failed with " << describe(*err);
                return std::nullopt;
            }
            forget_err(b(), c);
        }
        ADD_FAILURE() << "FI_PEEK never found the message";
        return std::nullopt;
    }
};

TEST_F(TaggedTest, ExactTagMatches) {
    auto s = buf(100), r = buf(100);
    fill_pattern(s->data(), 100, 200);
    ASSERT_FI_OK(trecv(b(), *r, 100, 0x42, 0, ctx(1)));
    ASSERT_FI_OK(tsend(a(), *s, 100, a().peer[1], 0x42, ctx(0)));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    auto sc = wait_comp(a(), ctx(0));
    ASSERT_TRUE(sc) << a().log.summary();
    EXPECT_EQ(rc->tag, 0x42u);
    EXPECT_EQ(rc->len, 100u);
    EXPECT_EQ(rc->flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
    EXPECT_EQ(sc->flags & (FI_SEND | FI_TAGGED), FI_SEND | FI_TAGGED);
    EXPECT_EQ(check_pattern(r->data(), 100, 200), -1);
}

TEST_F(TaggedTest, IgnoreMaskSelectsBitsToCompare) {
    auto s = buf(64), r = buf(64);
    fill_pattern(s->data(), 64, 201);
    const uint64_t sent_tag = 0xDEAD00000000ABCDull;
    ASSERT_FI_OK(trecv(b(), *r, 64, 0xDEAD000000000000ull, 0xFFFFFFFFull, ctx(1)));
    ASSERT_FI_OK(tsend(a(), *s, 64, a().peer[1], sent_tag, ctx(0)));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->tag, sent_tag) << "completion must carry the sender's tag";
    EXPECT_EQ(check_pattern(r->data(), 64, 201), -1);
}

TEST_F(TaggedTest, NonMatchingTagWaitsForItsOwnReceive) {
    auto s1 = buf(64), s2 = buf(64), r1 = buf(64), r2 = buf(64);
    fill_pattern(s1->data(), 64, 202);
    fill_pattern(s2->data(), 64, 203);
    ASSERT_FI_OK(trecv(b(), *r1, 64, 1, 0, ctx(1)));
    ASSERT_FI_OK(tsend(a(), *s2, 64, a().peer[1], 2, ctx(10)));
    poll_for(100ms);
    EXPECT_FALSE(b().log.has(ctx(1))) << "tag 1 receive matched a tag 2 message";
    ASSERT_FI_OK(trecv(b(), *r2, 64, 2, 0, ctx(2)));
    auto rc2 = wait_comp(b(), ctx(2));
    ASSERT_TRUE(rc2) << b().log.summary();
    EXPECT_EQ(check_pattern(r2->data(), 64, 203), -1);
    ASSERT_FI_OK(tsend(a(), *s1, 64, a().peer[1], 1, ctx(11)));
    auto rc1 = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc1) << b().log.summary();
    EXPECT_EQ(rc1->tag, 1u);
    EXPECT_EQ(check_pattern(r1->data(), 64, 202), -1);
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(10)) && a().log.has(ctx(11)); }));
}

TEST_F(TaggedTest, ReceivesWithSameTagMatchInPostOrder) {
    if (!(info->tx_attr->msg_order & FI_ORDER_SAS))
        GTEST_SKIP() << "provider does not claim FI_ORDER_SAS";
    auto s1 = buf(64), s2 = buf(64), r1 = buf(64), r2 = buf(64);
    fill_pattern(s1->data(), 64, 204);
    fill_pattern(s2->data(), 64, 205);
    ASSERT_FI_OK(trecv(b(), *r1, 64, 7, 0, ctx(1)));
    ASSERT_FI_OK(trecv(b(), *r2, 64, 7, 0, ctx(2)));
    ASSERT_FI_OK(tsend(a(), *s1, 64, a().peer[1], 7, ctx(10)));
    ASSERT_FI_OK(tsend(a(), *s2, 64, a().peer[1], 7, ctx(11)));
    ASSERT_TRUE(poll_until([&] { return b().log.has(ctx(1)) && b().log.has(ctx(2)); }))
        << b().log.summary();
    EXPECT_EQ(check_pattern(r1->data(), 64, 204), -1);
    EXPECT_EQ(check_pattern(r2->data(), 64, 205), -1);
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(10)) && a().log.has(ctx(11)); }));
}

TEST_F(TaggedTest, MessageAndTaggedQueuesAreSeparate) {
    auto s = buf(32), rt = buf(32), rm = buf(32);
    fill_pattern(s->data(), 32, 206);
    ASSERT_FI_OK(trecv(b(), *rt, 32, 0, ~0ull, ctx(1)));  // matches any tag
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, rm->data(), 32, rm->desc, FI_ADDR_UNSPEC, ctx(2)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 32, s->desc, a().peer[1], ctx(10)); }));
    auto rc = wait_comp(b(), ctx(2));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_FALSE(b().log.has(ctx(1))) << "an untagged send matched a tagged receive";
    EXPECT_TRUE(rc->flags & FI_MSG);
    EXPECT_FALSE(rc->flags & FI_TAGGED);
    ASSERT_FI_OK(tsend(a(), *s, 32, a().peer[1], 99, ctx(11)));
    auto rct = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rct) << b().log.summary();
    EXPECT_EQ(rct->tag, 99u);
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(10)) && a().log.has(ctx(11)); }));
}

class TaggedSizeTest : public TaggedTest, public ::testing::WithParamInterface<size_t> {};

TEST_P(TaggedSizeTest, UnexpectedMessagesMatchByTag) {
    const size_t len = GetParam();
    auto sA = buf(len), sB = buf(len), rA = buf(len), rB = buf(len);
    fill_pattern(sA->data(), len, 207);
    fill_pattern(sB->data(), len, 208);
    ASSERT_FI_OK(tsend(a(), *sA, len, a().peer[1], 0xA, ctx(10)));
    ASSERT_FI_OK(tsend(a(), *sB, len, a().peer[1], 0xB, ctx(11)));
    poll_for(100ms);
    ASSERT_FI_OK(trecv(b(), *rB, len, 0xB, 0, ctx(2)));
    auto rcB = wait_comp(b(), ctx(2));
    ASSERT_TRUE(rcB) << b().log.summary();
    EXPECT_EQ(rcB->tag, 0xBu);
    EXPECT_EQ(rcB->len, len);
    EXPECT_EQ(check_pattern(rB->data(), len, 208), -1);
    ASSERT_FI_OK(trecv(b(), *rA, len, 0xA, 0, ctx(1)));
    auto rcA = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rcA) << b().log.summary();
    EXPECT_EQ(check_pattern(rA->data(), len, 207), -1);
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(10)) && a().log.has(ctx(11)); }))
        << a().log.summary();
}

TEST_P(TaggedSizeTest, ExpectedMessageWithWildcardBits) {
    const size_t len = GetParam();
    auto s = buf(len), r = buf(len);
    fill_pattern(s->data(), len, 209);
    ASSERT_FI_OK(trecv(b(), *r, len, 0x5500, 0x00FF, ctx(1)));
    ASSERT_FI_OK(tsend(a(), *s, len, a().peer[1], 0x5577, ctx(0)));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->tag, 0x5577u);
    EXPECT_EQ(rc->len, len);
    EXPECT_EQ(check_pattern(r->data(), len, 209), -1);
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
}

TEST_P(TaggedSizeTest, PeekReportsMessageWithoutConsumingIt) {
    const size_t len = GetParam();
    auto s = buf(len), r = buf(len);
    fill_pattern(s->data(), len, 210);
    ASSERT_FI_OK(post([&] {
        return fi_tsenddata(a().ep, s->data(), len, s->desc, 0xDA7A, a().peer[1], 0x78, ctx(0));
    }));
    auto pc = peek_until_found(0x78, 0, 0, ctx(1));
    ASSERT_TRUE(pc);
    EXPECT_EQ(pc->len, len);
    EXPECT_EQ(pc->tag, 0x78u);
    EXPECT_TRUE(pc->flags & FI_RECV);
    EXPECT_TRUE(pc->flags & FI_TAGGED);
    EXPECT_TRUE(pc->flags & FI_REMOTE_CQ_DATA);
    EXPECT_EQ(pc->data, 0xDA7Au);
    // A second peek still finds it.
    ASSERT_TRUE(peek_until_found(0x78, 0, 0, ctx(2)));
    ASSERT_FI_OK(trecv(b(), *r, len, 0x78, 0, ctx(3)));
    auto rc = wait_comp(b(), ctx(3));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), len, 210), -1);
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
}

TEST_P(TaggedSizeTest, PeekClaimReservesMessageForClaimingReceive) {
    const size_t len = GetParam();
    auto s1 = buf(len), s2 = buf(len), rc_buf = buf(len), r = buf(len);
    fill_pattern(s1->data(), len, 211);
    fill_pattern(s2->data(), len, 212);
    ASSERT_FI_OK(tsend(a(), *s1, len, a().peer[1], 0x79, ctx(10)));
    void *claim_ctx = ctx(1);
    auto pc = peek_until_found(0x79, 0, FI_CLAIM, claim_ctx);
    ASSERT_TRUE(pc);
    EXPECT_EQ(pc->len, len);
    b().log.clear();
    // A normal receive for the same tag must not get the claimed message.
    ASSERT_FI_OK(trecv(b(), *r, len, 0x79, 0, ctx(2)));
    poll_for(100ms);
    EXPECT_FALSE(b().log.has(ctx(2))) << "claimed message matched another receive";
    ASSERT_FI_OK(tsend(a(), *s2, len, a().peer[1], 0x79, ctx(11)));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), len, 212), -1);
    // The claiming receive (same context) gets the claimed data.
    ASSERT_FI_OK(trecvmsg(b(), rc_buf->data(), len, rc_buf->desc, 0x79, 0, claim_ctx, FI_CLAIM));
    auto cc = wait_comp(b(), claim_ctx);
    ASSERT_TRUE(cc) << b().log.summary();
    EXPECT_EQ(cc->len, len);
    EXPECT_EQ(check_pattern(rc_buf->data(), len, 211), -1);
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(10)) && a().log.has(ctx(11)); }))
        << a().log.summary();
}

TEST_P(TaggedSizeTest, PeekDiscardDropsMessage) {
    const size_t len = GetParam();
    auto s1 = buf(len), s2 = buf(len), r = buf(len);
    fill_pattern(s1->data(), len, 213);
    fill_pattern(s2->data(), len, 214);
    ASSERT_FI_OK(tsend(a(), *s1, len, a().peer[1], 0x80, ctx(10)));
    ASSERT_TRUE(peek_until_found(0x80, 0, FI_DISCARD, ctx(1)));
    ASSERT_FI_OK(tsend(a(), *s2, len, a().peer[1], 0x80, ctx(11)));
    ASSERT_FI_OK(trecv(b(), *r, len, 0x80, 0, ctx(2)));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), len, 214), -1) << "discarded message was delivered";
    // The sender of the discarded message completes, successfully: the receiver took it.
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(10)) && a().log.has(ctx(11)); }))
        << "send of a discarded message never completed: " << a().log.summary();
}

TEST_P(TaggedSizeTest, ClaimDiscardDropsClaimedMessage) {
    const size_t len = GetParam();
    auto s1 = buf(len), s2 = buf(len), r = buf(len);
    fill_pattern(s1->data(), len, 215);
    fill_pattern(s2->data(), len, 216);
    ASSERT_FI_OK(tsend(a(), *s1, len, a().peer[1], 0x81, ctx(10)));
    void *claim_ctx = ctx(1);
    ASSERT_TRUE(peek_until_found(0x81, 0, FI_CLAIM, claim_ctx));
    b().log.clear();
    ASSERT_FI_OK(trecvmsg(b(), nullptr, 0, nullptr, 0x81, 0, claim_ctx, FI_CLAIM | FI_DISCARD));
    poll_for(50ms);
    EXPECT_FALSE(b().log.has_err(claim_ctx)) << describe(*b().log.find_err(claim_ctx));
    ASSERT_FI_OK(tsend(a(), *s2, len, a().peer[1], 0x81, ctx(11)));
    ASSERT_FI_OK(trecv(b(), *r, len, 0x81, 0, ctx(2)));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), len, 216), -1) << "discarded message was delivered";
    // The sender of the discarded message completes, successfully: the receiver took it.
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(10)) && a().log.has(ctx(11)); }))
        << "send of a discarded message never completed: " << a().log.summary();
}

TEST_P(TaggedSizeTest, TruncatedTaggedReceiveReportsTag) {
    const size_t len = GetParam();
    if (len < 2) GTEST_SKIP() << "nothing to truncate";
    const size_t rlen = len / 2;
    auto s = buf(len), r = buf(rlen + 16, 0xEE);
    fill_pattern(s->data(), len, 217);
    ASSERT_FI_OK(trecv(b(), *r, rlen, 0x90, 0, ctx(1)));
    ASSERT_FI_OK(tsend(a(), *s, len, a().peer[1], 0x90, ctx(0)));
    auto err = wait_err(b(), ctx(1));
    ASSERT_TRUE(err) << b().log.summary();
    EXPECT_EQ(err->e.err, FI_ETRUNC) << describe(*err);
    EXPECT_EQ(err->e.tag, 0x90u);
    EXPECT_EQ(err->e.len, rlen);
    EXPECT_EQ(err->e.olen, len - rlen);
    EXPECT_TRUE(err->e.flags & FI_TAGGED);
    EXPECT_EQ(check_pattern(r->data(), rlen, 217), -1);
    EXPECT_EQ(check_fill(r->data() + rlen, 16, 0xEE), -1);
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(0)) || a().log.has_err(ctx(0)); }));
}

INSTANTIATE_TEST_SUITE_P(Sizes, TaggedSizeTest,
                         ::testing::Values(size_t{0}, size_t{64}, size_t{1} << 20),
                         [](const ::testing::TestParamInfo<size_t> &p) {
                             return std::to_string(p.param) + "B";
                         });

TEST_F(TaggedTest, PeekWithoutMessageFailsWithEnomsg) {
    ASSERT_FI_OK(trecvmsg(b(), nullptr, 0, nullptr, 0x77, 0, ctx(1), FI_PEEK));
    auto err = wait_err(b(), ctx(1));
    ASSERT_TRUE(err) << "no error entry for an unsuccessful peek: " << b().log.summary();
    EXPECT_EQ(err->e.err, FI_ENOMSG) << describe(*err);
    // The peek does not stay posted: a later message is not matched by it.
    auto s = buf(8), r = buf(8);
    ASSERT_FI_OK(tsend(a(), *s, 8, a().peer[1], 0x77, ctx(10)));
    ASSERT_FI_OK(trecv(b(), *r, 8, 0x77, 0, ctx(2)));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    EXPECT_FALSE(b().log.has(ctx(1)));
}

TEST_F(TaggedTest, TinjectAndTinjectdata) {
    const size_t len = std::min<size_t>(48, info->tx_attr->inject_size);
    std::vector<uint8_t> s(len);
    auto r1 = buf(len), r2 = buf(len);
    fill_pattern(s.data(), len, 218);
    ASSERT_FI_OK(trecv(b(), *r1, len, 0x100, 0, ctx(1)));
    ASSERT_FI_OK(trecv(b(), *r2, len, 0x101, 0, ctx(2)));
    ASSERT_FI_OK(post([&] { return fi_tinject(a().ep, s.data(), len, a().peer[1], 0x100); }));
    ASSERT_FI_OK(
        post([&] { return fi_tinjectdata(a().ep, s.data(), len, 555, a().peer[1], 0x101); }));
    std::fill(s.begin(), s.end(), 0);
    ASSERT_TRUE(poll_until([&] { return b().log.has(ctx(1)) && b().log.has(ctx(2)); }))
        << b().log.summary();
    EXPECT_EQ(check_pattern(r1->data(), len, 218), -1);
    EXPECT_EQ(check_pattern(r2->data(), len, 218), -1);
    auto rc2 = b().log.find(ctx(2));
    EXPECT_TRUE(rc2->flags & FI_REMOTE_CQ_DATA);
    EXPECT_EQ(rc2->data, 555u);
    EXPECT_EQ(rc2->tag, 0x101u);
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.comps.empty()) << a().log.summary();
}

TEST_F(TaggedTest, TsendvAndTrecvv) {
    const size_t n = std::min<size_t>(2, info->tx_attr->iov_limit);
    auto s = buf(3000), r = buf(3000);
    fill_pattern(s->data(), 3000, 219);
    iovec siov[2] = {{s->data(), n == 2 ? size_t{1000} : size_t{3000}}, {s->data() + 1000, 2000}};
    void *sdesc[2] = {s->desc, s->desc};
    const size_t m = std::min<size_t>(2, info->rx_attr->iov_limit);
    iovec riov[2] = {{r->data(), m == 2 ? size_t{2500} : size_t{3000}}, {r->data() + 2500, 500}};
    void *rdesc[2] = {r->desc, r->desc};
    ASSERT_FI_OK(
        post([&] { return fi_trecvv(b().ep, riov, rdesc, m, FI_ADDR_UNSPEC, 5, 0, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_tsendv(a().ep, siov, sdesc, n, a().peer[1], 5, ctx(0)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->len, 3000u);
    EXPECT_EQ(check_pattern(r->data(), 3000, 219), -1);
    ASSERT_TRUE(wait_comp(a(), ctx(0)));
}

class TaggedThreeTest : public TaggedTest {
  protected:
    void configure(FabricOptions &o) override { o.num_eps = 3; }
    Endpoint &c() { return *eps.at(2); }
};

TEST_F(TaggedThreeTest, DirectedTaggedReceive) {
    auto sa = buf(64), sc = buf(64), r1 = buf(64), r2 = buf(64);
    fill_pattern(sa->data(), 64, 220);
    fill_pattern(sc->data(), 64, 221);
    ASSERT_FI_OK(trecv(b(), *r1, 64, 0x33, 0, ctx(1), b().peer[2]));
    ASSERT_FI_OK(tsend(a(), *sa, 64, a().peer[1], 0x33, ctx(10)));
    poll_for(100ms);
    EXPECT_FALSE(b().log.has(ctx(1)));
    ASSERT_FI_OK(tsend(c(), *sc, 64, c().peer[1], 0x33, ctx(11)));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->src, b().peer[2]);
    EXPECT_EQ(check_pattern(r1->data(), 64, 221), -1);
    ASSERT_FI_OK(trecv(b(), *r2, 64, 0x33, 0, ctx(2), b().peer[0]));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    EXPECT_EQ(check_pattern(r2->data(), 64, 220), -1);
}

// Open MPI's MPI_Intercomm_create: the remote group's processes, already in the AV, are
// inserted again (ompi_comm_get_rprocs -> add_procs -> fi_av_insert), and the intercommunicator's
// receives are directed at the fi_addr_t that second insert returned. Such a receive matches the
// peer's messages, posted before they arrive and after, and reports that address as the source.
// (It used to wait for ever: a second insert made a second fi_addr_t, and arriving messages
// resolved to the first.)
// FI_DELIVERY_COMPLETE (fi_cq(3)): the send completes once the message is in a receive
// buffer. Node-local, a small one goes whole in a cell whose sender waits for the receiver's
// answer; sent before any receive is posted, it is kept as unexpected, and the answer must
// still come once a receive takes it.
TEST_F(TaggedTest, DeliveryCompleteSendOfAnUnexpectedMessageCompletesOnceReceived) {
    constexpr size_t kLen = 1000;
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 231);
    ASSERT_FI_OK(tsend_delivery_complete(*s, kLen, 0x91, ctx(10)));
    poll_for(50ms);  // arrived, and nobody receives it yet
    ASSERT_FI_OK(trecv(b(), *r, kLen, 0x91, 0, ctx(2)));
    ASSERT_TRUE(wait_comp(b(), ctx(2))) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), kLen, 231), -1);
    EXPECT_TRUE(wait_comp(a(), ctx(10))) << "the send never completed: " << a().log.summary();
}

// The same message discarded by the receiver (FI_PEEK | FI_DISCARD) completes its send
// successfully: the receiver processed it.
TEST_F(TaggedTest, DeliveryCompleteSendOfADiscardedMessageCompletes) {
    constexpr size_t kLen = 1000;
    auto s = buf(kLen);
    ASSERT_FI_OK(tsend_delivery_complete(*s, kLen, 0x92, ctx(10)));
    ASSERT_TRUE(peek_until_found(0x92, 0, FI_DISCARD, ctx(1)));
    EXPECT_TRUE(wait_comp(a(), ctx(10))) << "the send never completed: " << a().log.summary();
}

// A message read out of its sender's memory (a rendezvous: node-local, 4 MiB is more than the
// receiver's ring holds, so it is never staged) that the receiver discards unread: the sender
// is told its buffer is free, and its send completes, successfully (the receiver took it).
TEST_F(TaggedTest, SendOfADiscardedRendezvousMessageCompletes) {
    constexpr size_t kLen = 4 << 20;
    auto s = buf(kLen);
    ASSERT_FI_OK(tsend(a(), *s, kLen, a().peer[1], 0x93, ctx(10)));
    ASSERT_TRUE(peek_until_found(0x93, 0, FI_DISCARD, ctx(1)));
    EXPECT_TRUE(wait_comp(a(), ctx(10))) << "the send never completed: " << a().log.summary();
}

// The same discarded through the claim a peek made.
TEST_F(TaggedTest, SendOfAClaimedAndDiscardedRendezvousMessageCompletes) {
    constexpr size_t kLen = 4 << 20;
    auto s = buf(kLen);
    ASSERT_FI_OK(tsend(a(), *s, kLen, a().peer[1], 0x94, ctx(10)));
    ASSERT_TRUE(peek_until_found(0x94, 0, FI_CLAIM, ctx(1)));
    ASSERT_FI_OK(trecvmsg(b(), nullptr, 0, nullptr, 0x94, 0, ctx(1), FI_CLAIM | FI_DISCARD));
    EXPECT_TRUE(wait_comp(a(), ctx(10))) << "the send never completed: " << a().log.summary();
}

TEST_F(TaggedTest, ReceiveDirectedAtAReinsertedPeerMatchesIt) {
    fi_addr_t again = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(b().av, a().name.data(), 1, &again, 0, nullptr), 1);
    ASSERT_NE(again, FI_ADDR_NOTAVAIL);
    auto s1 = buf(64), s2 = buf(64), r1 = buf(64), r2 = buf(64);
    fill_pattern(s1->data(), 64, 230);
    fill_pattern(s2->data(), 64, 231);
    // Posted first, then the message.
    ASSERT_FI_OK(trecv(b(), *r1, 64, 0x77, 0, ctx(1), again));
    ASSERT_FI_OK(tsend(a(), *s1, 64, a().peer[1], 0x77, ctx(10)));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->src, again);
    EXPECT_EQ(check_pattern(r1->data(), 64, 230), -1);
    // The message first (unexpected), then the receive.
    ASSERT_FI_OK(tsend(a(), *s2, 64, a().peer[1], 0x78, ctx(11)));
    ASSERT_TRUE(wait_comp(a(), ctx(11))) << a().log.summary();
    ASSERT_FI_OK(trecv(b(), *r2, 64, 0x78, 0, ctx(2), again));
    rc = wait_comp(b(), ctx(2));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->src, again);
    EXPECT_EQ(check_pattern(r2->data(), 64, 231), -1);
}

// A message whose sender was not in the receiver's AV when it arrived (fabtests 2.x's
// fi_unexpected_msg, as an MPI process meets a peer it has not inserted yet): kept with no
// source; once the application inserts the sender, a receive directed at it matches the
// message and reports that address. Small messages and ones past a node-local cell.
TEST_F(TaggedTest, DirectedReceiveMatchesAMessageThatCameBeforeItsSenderWasInserted) {
    ASSERT_FI_OK(fi_av_remove(b().av, &b().peer[0], 1, 0));
    uint64_t tag = 0x90;
    for (size_t len : {size_t(64), size_t(64 * 1024)}) {
        SCOPED_TRACE(len);
        ++tag;
        auto s = buf(len), r = buf(len);
        fill_pattern(s->data(), len, 240);
        ASSERT_FI_OK(tsend(a(), *s, len, a().peer[1], tag, ctx(20)));
        // Arrived with no source: b's FI_PEEK of any source finds it.
        auto seen = peek_until_found(tag, 0, 0, ctx(21));
        ASSERT_TRUE(seen);
        EXPECT_EQ(seen->src, FI_ADDR_NOTAVAIL);
        fi_addr_t a_at_b = FI_ADDR_NOTAVAIL;
        ASSERT_FI_RET(fi_av_insert(b().av, a().name.data(), 1, &a_at_b, 0, nullptr), 1);
        ASSERT_FI_OK(trecv(b(), *r, len, tag, 0, ctx(22), a_at_b));
        auto rc = wait_comp(b(), ctx(22));
        ASSERT_TRUE(rc) << b().log.summary();
        EXPECT_EQ(rc->src, a_at_b);
        EXPECT_EQ(check_pattern(r->data(), len, 240), -1);
        ASSERT_TRUE(wait_comp(a(), ctx(20))) << a().log.summary();
        ASSERT_FI_OK(fi_av_remove(b().av, &a_at_b, 1, 0));
        b().log.comps.clear();
        a().log.comps.clear();
    }
}

// A burst of small sends posted without reading the sender's CQ, several times what a
// node-local peer's inbox holds: the first ones go straight into the peer's ring, the rest
// wait in the sender's backlog. Nothing may be lost or reordered, and every send is reported
// as asked:
// under FI_SELECTIVE_COMPLETION only those with FI_COMPLETION write a CQ entry, fi_tinject
// never does, and the send counter counts them all.
class TaggedBurstTest : public TaggedTest {
  protected:
    void configure(FabricOptions &o) override {
        o.cq_bind_flags = FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION;
    }
    void before_enable(Endpoint &e, size_t) override {
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.send_cntr));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.send_cntr->fid, FI_SEND));
    }
};

TEST_F(TaggedBurstTest, BurstBeyondTheInboxKeepsOrderAndCompletions) {
    constexpr size_t kN = 1200, kLen = 8, kTag = 0x77;
    std::vector<fi_context2> send_ctx(kN), recv_ctx(kN);
    auto s = buf(kN * kLen), r = buf(kN * kLen);
    for (size_t i = 0; i < kN; ++i) {
        uint64_t v = 1000000 + i;
        std::memcpy(s->data() + i * kLen, &v, kLen);
    }
    auto post_recv = [&](size_t i) {
        return trecv_at(r->data() + i * kLen, kLen, r->desc, kTag, &recv_ctx[i]);
    };
    // Half the receives wait for their messages, the other half come after them.
    for (size_t i = 0; i < kN / 2; ++i) ASSERT_FI_OK(post_recv(i)) << i;
    size_t reported = 0;
    for (size_t i = 0; i < kN; ++i) {
        uint8_t *p = s->data() + i * kLen;
        auto send = [&]() -> ssize_t {
            switch (i % 4) {
                case 0:
                    return fi_tinject(a().ep, p, kLen, a().peer[1], kTag);
                case 1:  // no FI_COMPLETION: counted, not reported
                    return fi_tsend(a().ep, p, kLen, s->desc, a().peer[1], kTag, &send_ctx[i]);
                case 2: {
                    iovec iov{p, kLen};
                    void *desc = s->desc;
                    fi_msg_tagged m{&iov, &desc, 1, a().peer[1], kTag, 0, &send_ctx[i], 0};
                    return fi_tsendmsg(a().ep, &m, FI_COMPLETION);
                }
                default:
                    return fi_tinjectdata(a().ep, p, kLen, i, a().peer[1], kTag);
            }
        };
        ssize_t ret = send();
        if (ret == -FI_EAGAIN) ret = post(send);
        ASSERT_FI_OK(ret) << "send " << i;
        if (i % 4 == 2) ++reported;
        // Now and then the receiver takes what its inbox holds, making room while the sender
        // still has messages waiting: later ones must not overtake them.
        if (i % 97 == 96) b().log.drain();
    }
    for (size_t i = kN / 2; i < kN; ++i) ASSERT_FI_OK(post_recv(i)) << i;
    ASSERT_TRUE(poll_until([&] {
        return fi_cntr_read(a().send_cntr) >= kN && a().log.comps.size() >= reported;
    })) << "send counter "
        << fi_cntr_read(a().send_cntr) << "; " << a().log.summary();
    // Every receive was posted without FI_COMPLETION: the data shows that they completed.
    ASSERT_TRUE(poll_until([&] {
        uint64_t last;
        std::memcpy(&last, r->data() + (kN - 1) * kLen, kLen);
        return last == 1000000 + kN - 1;
    }));
    poll_for(kQuiet);
    for (size_t i = 0; i < kN; ++i) {
        uint64_t v;
        std::memcpy(&v, r->data() + i * kLen, kLen);
        ASSERT_EQ(v, 1000000 + i) << "receive " << i << " got another message";
    }
    EXPECT_EQ(fi_cntr_read(a().send_cntr), kN);
    EXPECT_EQ(fi_cntr_readerr(a().send_cntr), 0u);
    EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
    EXPECT_TRUE(b().log.errs.empty()) << b().log.summary();
    ASSERT_EQ(a().log.comps.size(), reported) << a().log.summary();
    for (size_t i = 2; i < kN; i += 4) {
        auto c = a().log.find(&send_ctx[i]);
        ASSERT_TRUE(c) << "send " << i << " with FI_COMPLETION not reported";
        EXPECT_EQ(c->flags & (FI_SEND | FI_TAGGED), FI_SEND | FI_TAGGED);
    }
}

// The same burst with every send reporting (no selective completion): one CQ entry per
// fi_tsend, in the order they were posted, none for fi_tinject; CQ data arrives with its
// message.
TEST_F(TaggedTest, BurstBeyondTheInboxReportsEverySend) {
    constexpr size_t kN = 1000, kLen = 16, kTag = 0x78;
    std::vector<fi_context2> send_ctx(kN), recv_ctx(kN);
    auto s = buf(kN * kLen), r = buf(kN * kLen);
    for (size_t i = 0; i < kN; ++i) fill_pattern(s->data() + i * kLen, kLen, 300 + i);
    size_t sends = 0;
    for (size_t i = 0; i < kN; ++i) {
        uint8_t *p = s->data() + i * kLen;
        auto send = [&]() -> ssize_t {
            if (i % 3 == 0) return fi_tinjectdata(a().ep, p, kLen, i, a().peer[1], kTag);
            return fi_tsenddata(a().ep, p, kLen, s->desc, i, a().peer[1], kTag, &send_ctx[i]);
        };
        ssize_t ret = send();
        if (ret == -FI_EAGAIN) ret = post(send);
        ASSERT_FI_OK(ret) << "send " << i;
        if (i % 3) ++sends;
        if (i % 101 == 100) b().log.drain();
    }
    for (size_t i = 0; i < kN; ++i)
        ASSERT_FI_OK(trecv_at(r->data() + i * kLen, kLen, r->desc, kTag, &recv_ctx[i])) << i;
    ASSERT_TRUE(poll_until([&] {
        return b().log.comps.size() >= kN && a().log.comps.size() >= sends;
    })) << a().log.summary()
        << " / " << b().log.summary();
    poll_for(kQuiet);
    ASSERT_EQ(a().log.comps.size(), sends) << a().log.summary();
    ASSERT_EQ(b().log.comps.size(), kN) << b().log.summary();
    EXPECT_TRUE(a().log.errs.empty() && b().log.errs.empty());
    size_t next = 1;
    for (const auto &c : a().log.comps) {
        while (next % 3 == 0) ++next;
        EXPECT_EQ(c.op_context, &send_ctx[next]) << "send completions out of posting order";
        ++next;
    }
    for (size_t i = 0; i < kN; ++i) {
        auto c = b().log.find(&recv_ctx[i]);
        ASSERT_TRUE(c) << i;
        EXPECT_TRUE(c->flags & FI_REMOTE_CQ_DATA) << i;
        EXPECT_EQ(c->data, i) << "receive " << i << " got another message";
        EXPECT_EQ(check_pattern(r->data() + i * kLen, kLen, 300 + i), -1) << i;
    }
}

}  // namespace
}  // namespace tandem_test

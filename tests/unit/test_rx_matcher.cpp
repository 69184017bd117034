// RxMatcher: the matching rules of fi_tagged(3) / fi_msg(3), without any link.
#include "main_prov/rx_matcher.h"

#include <gtest/gtest.h>

using namespace tandem;

namespace {

RxOp *recv_op(bool tagged, uint64_t tag, uint64_t ignore, fi_addr_t src = FI_ADDR_UNSPEC) {
    auto *rx = new RxOp;
    rx->tagged = tagged;
    rx->tag = tag;
    rx->ignore = ignore;
    rx->src = src;
    return rx;
}

Unexpected message(bool tagged, uint64_t tag, uint64_t id) {
    Unexpected ux;
    ux.hdr.op = static_cast<uint8_t>(wire::ProtoOp::Eager);
    ux.hdr.flags = tagged ? wire::kProtoTagged : 0;
    ux.hdr.tag = tag;
    ux.hdr.msg_id = id;
    return ux;
}

auto no_source = [](const Unexpected &) { return fi_addr_t(7); };

}  // namespace

TEST(RxMatcher, TagsMatchUnderTheIgnoreMask) {
    RxMatcher m;
    RxOp *exact = recv_op(true, 0x1234, 0);
    RxOp *wild = recv_op(true, 0x1200, 0xff);
    m.post(exact);
    m.post(wild);
    EXPECT_EQ(m.match_posted(true, 0x12ff, 7), wild);
    EXPECT_EQ(m.match_posted(true, 0x1234, 7), exact);
    EXPECT_EQ(m.match_posted(true, 0x1234, 7), nullptr);
    delete exact;
    delete wild;
}

TEST(RxMatcher, TaggedAndUntaggedQueuesAreSeparate) {
    RxMatcher m;
    RxOp *untagged = recv_op(false, 0, 0);
    m.post(untagged);
    EXPECT_EQ(m.match_posted(true, 0, 1), nullptr);
    EXPECT_EQ(m.match_posted(false, 0, 1), untagged);
    delete untagged;
}

TEST(RxMatcher, DirectedReceiveMatchesOnlyItsSource) {
    RxMatcher m;
    RxOp *from3 = recv_op(true, 5, 0, 3);
    m.post(from3);
    EXPECT_EQ(m.match_posted(true, 5, 4), nullptr);
    EXPECT_EQ(m.match_posted(true, 5, 3), from3);
    delete from3;
}

TEST(RxMatcher, FirstPostedReceiveWinsInOrder) {
    RxMatcher m;
    RxOp *a = recv_op(true, 0, ~0ull);
    RxOp *b = recv_op(true, 0, ~0ull);
    m.post(a);
    m.post(b);
    EXPECT_EQ(m.match_posted(true, 42, 1), a);
    EXPECT_EQ(m.match_posted(true, 43, 1), b);
    delete a;
    delete b;
}

TEST(RxMatcher, MultiReceiveBufferStaysPostedUntilRetired) {
    RxMatcher m;
    RxOp *multi = recv_op(false, 0, 0);
    multi->multi = true;
    m.post(multi);
    EXPECT_EQ(m.match_posted(false, 0, 1), multi);
    EXPECT_EQ(m.match_posted(false, 0, 1), multi);
    m.remove_posted(multi);
    EXPECT_EQ(m.match_posted(false, 0, 1), nullptr);
    delete multi;
}

TEST(RxMatcher, UnexpectedMessagesAreTakenOldestFirst) {
    RxMatcher m;
    m.push_unexpected(message(true, 9, 1));
    m.push_unexpected(message(true, 9, 2));
    m.push_unexpected(message(true, 8, 3));
    RxOp *rx = recv_op(true, 9, 0);
    Unexpected got;
    ASSERT_TRUE(m.take_unexpected(*rx, no_source, got));
    EXPECT_EQ(got.hdr.msg_id, 1u);
    ASSERT_TRUE(m.take_unexpected(*rx, no_source, got));
    EXPECT_EQ(got.hdr.msg_id, 2u);
    EXPECT_FALSE(m.take_unexpected(*rx, no_source, got));
    delete rx;
}

TEST(RxMatcher, UnexpectedDirectedReceiveChecksTheSource) {
    RxMatcher m;
    m.push_unexpected(message(true, 1, 1));
    RxOp *rx = recv_op(true, 1, 0, 3);
    Unexpected got;
    EXPECT_FALSE(m.take_unexpected(*rx, no_source, got));  // the message came from 7
    rx->src = 7;
    EXPECT_TRUE(m.take_unexpected(*rx, no_source, got));
    delete rx;
}

TEST(RxMatcher, PeekLeavesTheMessageAndClaimReservesIt) {
    RxMatcher m;
    m.push_unexpected(message(true, 4, 11));
    Unexpected *seen = m.peek(true, 4, 0, FI_ADDR_UNSPEC, no_source);
    ASSERT_NE(seen, nullptr);
    EXPECT_EQ(seen->hdr.msg_id, 11u);
    EXPECT_EQ(m.peek(true, 4, 0, FI_ADDR_UNSPEC, no_source), seen);  // still there
    int ctx;
    seen->claimed = true;
    seen->claim_context = &ctx;
    EXPECT_EQ(m.peek(true, 4, 0, FI_ADDR_UNSPEC, no_source), nullptr);  // claimed: invisible
    RxOp *rx = recv_op(true, 4, 0);
    Unexpected got;
    EXPECT_FALSE(m.take_unexpected(*rx, no_source, got));
    EXPECT_FALSE(m.take_claimed(nullptr, got));
    ASSERT_TRUE(m.take_claimed(&ctx, got));
    EXPECT_EQ(got.hdr.msg_id, 11u);
    delete rx;
}

TEST(RxMatcher, CancelRemovesOnlyTheNamedReceive) {
    RxMatcher m;
    int a, b;
    RxOp *ra = recv_op(true, 0, 0);
    ra->context = &a;
    RxOp *rb = recv_op(false, 0, 0);
    rb->context = &b;
    m.post(ra);
    m.post(rb);
    EXPECT_EQ(m.cancel(&b), rb);
    EXPECT_EQ(m.cancel(&b), nullptr);
    EXPECT_EQ(m.match_posted(false, 0, 1), nullptr);
    EXPECT_EQ(m.match_posted(true, 0, 1), ra);
    delete ra;
    delete rb;
}

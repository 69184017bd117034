// fi_trigger(3) over FI_EP_RDM between two endpoints of one process: triggered operations
// (FI_TRIGGER with a threshold counter) and deferred work (FI_QUEUE_WORK, FI_CANCEL_WORK,
// FI_FLUSH_WORK): when they start, in which order, chains, every kind of data call, the
// completions they write, cancel, flush, closing their counters and endpoints, the checks at
// post time and the queue depth. api.trigger.* runs it node-local (off_tandem), api_net.trigger.*
// over the TCP link (FI_TANDEM_LOCAL=0).
#include "fabric_fixture.h"

#include <rdma/fi_atomic.h>
#include <rdma/fi_trigger.h>

namespace tandem_test {
namespace {

constexpr uint64_t kTriggerCaps =
    FI_TRIGGER | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
// How long both endpoints are progressed when checking that something has not started.
constexpr Ms kHold = 50ms;
constexpr size_t kLen = 256;

fi_triggered_context threshold_ctx(fid_cntr *c, size_t threshold) {
    fi_triggered_context t{};
    t.event_type = FI_TRIGGER_THRESHOLD;
    t.trigger.threshold.cntr = c;
    t.trigger.threshold.threshold = threshold;
    return t;
}

class TriggerFixture : public FabricTest {
  protected:
    void configure(FabricOptions &o) override { o.caps |= kTriggerCaps; }
    void before_enable(Endpoint &e, size_t) override {
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.send_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.recv_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.read_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.write_cntr));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.send_cntr->fid, FI_SEND));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.recv_cntr->fid, FI_RECV));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.read_cntr->fid, FI_READ));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.write_cntr->fid, FI_WRITE));
    }

    // ---- data calls taking flags (FI_TRIGGER), a -> b unless told ----

    static ssize_t sendmsg(fid_ep *ep, const void *p, size_t len, void *desc, fi_addr_t to,
                           void *context, uint64_t flags = FI_TRIGGER) {
        iovec iov{const_cast<void *>(p), len};
        fi_msg m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = to;
        m.context = context;
        return fi_sendmsg(ep, &m, flags);
    }
    static ssize_t tsendmsg(fid_ep *ep, const void *p, size_t len, void *desc, fi_addr_t to,
                            uint64_t tag, void *context, uint64_t flags = FI_TRIGGER) {
        iovec iov{const_cast<void *>(p), len};
        fi_msg_tagged m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = to;
        m.tag = tag;
        m.context = context;
        return fi_tsendmsg(ep, &m, flags);
    }
    static ssize_t recvmsg(fid_ep *ep, void *p, size_t len, void *desc, void *context,
                           uint64_t flags = FI_TRIGGER) {
        iovec iov{p, len};
        fi_msg m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = FI_ADDR_UNSPEC;
        m.context = context;
        return fi_recvmsg(ep, &m, flags);
    }
    static ssize_t rmamsg(bool write, fid_ep *ep, void *p, size_t len, void *desc, fi_addr_t to,
                          uint64_t raddr, uint64_t key, void *context,
                          uint64_t flags = FI_TRIGGER) {
        iovec iov{p, len};
        fi_rma_iov riov{raddr, len, key};
        fi_msg_rma m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = to;
        m.rma_iov = &riov;
        m.rma_iov_count = 1;
        m.context = context;
        return write ? fi_writemsg(ep, &m, flags) : fi_readmsg(ep, &m, flags);
    }

    // One FI_UINT64 element at `operand` against one at rioc, for the *atomicmsg calls.
    static fi_msg_atomic atomic_msg(fi_ioc *operand, void **desc, fi_addr_t to, fi_rma_ioc *rioc,
                                    enum fi_op op, void *context) {
        fi_msg_atomic m{};
        m.msg_iov = operand;
        m.desc = desc;
        m.iov_count = 1;
        m.addr = to;
        m.rma_iov = rioc;
        m.rma_iov_count = 1;
        m.datatype = FI_UINT64;
        m.op = op;
        m.context = context;
        return m;
    }

    // Posts an ordinary receive on b for `len` bytes at `p`.
    void post_recv(void *p, size_t len, void *desc, void *c) {
        ASSERT_FI_OK(post([&] { return fi_recv(b().ep, p, len, desc, FI_ADDR_UNSPEC, c); }));
    }
    void post_trecv(void *p, size_t len, void *desc, uint64_t tag, void *c) {
        ASSERT_FI_OK(
            post([&] { return fi_trecv(b().ep, p, len, desc, FI_ADDR_UNSPEC, tag, 0, c); }));
    }

    // A standalone counter of the fixture's domain.
    Fid<fid_cntr> cntr() {
        Fid<fid_cntr> c;
        open_cntr(c);
        return c;
    }
    int queue(fi_deferred_work &w) { return fi_control(&domain->fid, FI_QUEUE_WORK, &w); }
    int cancel_work(fi_deferred_work &w) { return fi_control(&domain->fid, FI_CANCEL_WORK, &w); }
    int flush_work(fi_deferred_work *w) { return fi_control(&domain->fid, FI_FLUSH_WORK, w); }

    bool cntr_reaches(fid_cntr *c, uint64_t v) {
        return poll_until([&] { return fi_cntr_read(c) >= v; });
    }
    bool cntr_err_reaches(fid_cntr *c, uint64_t v) {
        return poll_until([&] { return fi_cntr_readerr(c) >= v; });
    }
    bool comp_or_err(Endpoint &e, const void *c, Ms timeout = kTimeout) {
        return poll_until([&] { return e.log.has(c) || e.log.has_err(c); }, timeout);
    }
    // Progresses both endpoints for kHold; true if `c` completed (well or badly) on `e`.
    bool shows_up_within_hold(Endpoint &e, const void *c) {
        poll_for(kHold);
        return e.log.has(c) || e.log.has_err(c);
    }
};

// A deferred message operation (FI_OP_SEND or FI_OP_RECV) that owns what it points to, so
// tests can queue it whenever they like.
struct DeferredMsg {
    iovec iov{};
    void *desc = nullptr;
    fi_op_msg op{};
    fi_deferred_work work{};
    DeferredMsg(fi_op_type type, fid_ep *ep, void *p, size_t len, void *d, fi_addr_t addr,
                fid_cntr *trigger, uint64_t threshold, fid_cntr *completion, void *context,
                uint64_t flags = 0) {
        iov = {p, len};
        desc = d;
        op.ep = ep;
        op.msg.msg_iov = &iov;
        op.msg.desc = &desc;
        op.msg.iov_count = 1;
        op.msg.addr = addr;
        op.msg.context = context;
        op.flags = flags;
        work.threshold = threshold;
        work.triggering_cntr = trigger;
        work.completion_cntr = completion;
        work.op_type = type;
        work.op.msg = &op;
    }
};

struct DeferredCntr {
    fi_op_cntr op{};
    fi_deferred_work work{};
    DeferredCntr(fi_op_type type, fid_cntr *target, uint64_t value, fid_cntr *trigger,
                 uint64_t threshold) {
        op.cntr = target;
        op.value = value;
        work.threshold = threshold;
        work.triggering_cntr = trigger;
        work.completion_cntr = nullptr;
        work.op_type = type;
        work.op.cntr = &op;
    }
};

using TriggerTest = TriggerFixture;

// ---- 1. threshold, context, tagged, alias -----------------------------------------------

TEST_F(TriggerTest, TriggeredSendDoesNotStartBeforeThreshold) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 1);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    auto t = threshold_ctx(c, 2);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FI_OK(fi_cntr_add(c, 1));  // one short of the threshold
    poll_for(kHold);
    EXPECT_FALSE(b().log.has(ctx(1)) || a().log.has(&t) || a().log.has_err(&t))
        << "the send started at 1 of 2: a: " << a().log.summary() << "; b: " << b().log.summary();
}

TEST_F(TriggerTest, TriggeredSendStartsOnCntrAddWithItsBytes) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 2);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    auto t = threshold_ctx(c, 2);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    ASSERT_FALSE(shows_up_within_hold(b(), ctx(1))) << "arrived before the threshold";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    auto got = wait_comp(b(), ctx(1));
    ASSERT_TRUE(got) << "not received after the threshold: " << b().log.summary();
    EXPECT_EQ(got->len, kLen);
    EXPECT_EQ(check_pattern(r->data(), kLen, 2), -1);
}

TEST_F(TriggerTest, TriggeredSendCompletesWithTheTriggeredContext) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FALSE(shows_up_within_hold(a(), &t)) << "completed before the threshold";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    auto got = wait_comp(a(), &t);
    ASSERT_TRUE(got) << "no completion with op_context == &triggered_context: "
                     << a().log.summary();
    EXPECT_TRUE(got->flags & FI_SEND) << std::hex << got->flags;
}

// An application in FI_CONTEXT2 mode passes fi_triggered_context2: its trigger union starts
// where fi_triggered_context's does, and the completion names it.
TEST_F(TriggerTest, TriggeredContext2WorksAsTheContext) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 5);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    fi_triggered_context2 t{};
    t.event_type = FI_TRIGGER_THRESHOLD;
    t.trigger.threshold.cntr = c;
    t.trigger.threshold.threshold = 1;
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FALSE(shows_up_within_hold(b(), ctx(1))) << "arrived before the threshold";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    ASSERT_TRUE(wait_comp(b(), ctx(1))) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), kLen, 5), -1);
    ASSERT_TRUE(wait_comp(a(), &t)) << "no completion naming the fi_triggered_context2";
}

TEST_F(TriggerTest, TriggeredSendWhoseThresholdIsMetAtPostStarts) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 3);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    ASSERT_FI_OK(fi_cntr_set(c, 4));
    auto t = threshold_ctx(c, 3);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    auto got = wait_comp(b(), ctx(1));
    ASSERT_TRUE(got) << "a send whose threshold was met never started: " << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), kLen, 3), -1);
}

TEST_F(TriggerTest, TriggeredTaggedSendWaitsThenDeliversTagAndBytes) {
    constexpr uint64_t kTag = 0xabc123;
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 4);
    post_trecv(r->data(), kLen, r->desc, kTag, ctx(1));
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(tsendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], kTag, &t));
    ASSERT_FALSE(shows_up_within_hold(b(), ctx(1))) << "tagged send started before threshold";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    auto got = wait_comp(b(), ctx(1));
    ASSERT_TRUE(got) << b().log.summary();
    EXPECT_EQ(got->tag, kTag);
    EXPECT_EQ(check_pattern(r->data(), kLen, 4), -1);
    EXPECT_TRUE(wait_comp(a(), &t)) << "tagged send: no completion with the triggered context";
}

// A triggered operation compares the success count only: errors do not start it.
TEST_F(TriggerTest, ErrorCountDoesNotStartTriggeredSend) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FI_OK(fi_cntr_adderr(c, 5));
    EXPECT_FALSE(shows_up_within_hold(b(), ctx(1)))
        << "an FI_TRIGGER send started on the counter's error count";
}

TEST_F(TriggerTest, AliasWithTriggerFlagDefersPlainSend) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 5);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    Fid<fid_ep> alias;
    ASSERT_FI_OK(fi_ep_alias(a().ep, alias.out(), FI_TRANSMIT | FI_TRIGGER));
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(fi_send(alias, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FALSE(shows_up_within_hold(b(), ctx(1))) << "alias send did not wait for its trigger";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    ASSERT_TRUE(wait_comp(b(), ctx(1))) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), kLen, 5), -1);
}

// ---- 2. order ---------------------------------------------------------------------------

// Thresholds 3, 1, 2, 2 posted in that order start as 1, 2 (first posted), 2 (second), 3 when
// the counter jumps straight to 3.
TEST_F(TriggerTest, OpsStartInThresholdThenSubmissionOrder) {
    constexpr size_t kN = 4;
    const size_t thresholds[kN] = {3, 1, 2, 2};
    const size_t expected_order[kN] = {1, 2, 3, 0};  // index of the send landing in slot i
    auto c = cntr();
    auto s = buf(kLen * kN), r = buf(kLen * kN);
    for (size_t i = 0; i < kN; ++i) fill_pattern(s->data() + kLen * i, kLen, 100 + i);
    for (size_t i = 0; i < kN; ++i) post_recv(r->data() + kLen * i, kLen, r->desc, ctx(10 + i));
    fi_triggered_context t[kN];
    for (size_t i = 0; i < kN; ++i) {
        t[i] = threshold_ctx(c, thresholds[i]);
        ASSERT_FI_OK(sendmsg(a().ep, s->data() + kLen * i, kLen, s->desc, a().peer[1], &t[i]));
    }
    ASSERT_FI_OK(fi_cntr_set(c, 3));
    ASSERT_TRUE(poll_until([&] { return b().log.comps.size() >= kN; })) << b().log.summary();
    for (size_t i = 0; i < kN; ++i)
        EXPECT_EQ(check_pattern(r->data() + kLen * i, kLen, 100 + expected_order[i]), -1)
            << "receive " << i << " should hold the send with threshold "
            << thresholds[expected_order[i]] << " (posted " << expected_order[i] << ")";
}

TEST_F(TriggerTest, OnlyOpsWhoseThresholdIsReachedStart) {
    auto c = cntr();
    auto s = buf(kLen * 3), r = buf(kLen * 3);
    for (int i = 0; i < 3; ++i) post_recv(r->data() + kLen * i, kLen, r->desc, ctx(10 + i));
    fi_triggered_context t[3] = {threshold_ctx(c, 1), threshold_ctx(c, 2), threshold_ctx(c, 3)};
    for (int i = 0; i < 3; ++i)
        ASSERT_FI_OK(sendmsg(a().ep, s->data() + kLen * i, kLen, s->desc, a().peer[1], &t[i]));
    ASSERT_FI_OK(fi_cntr_set(c, 2));
    ASSERT_TRUE(poll_until([&] { return a().log.has(&t[0]) && a().log.has(&t[1]); }))
        << a().log.summary();
    EXPECT_FALSE(shows_up_within_hold(a(), &t[2])) << "threshold 3 started at 2";
}

// ---- 3. chains --------------------------------------------------------------------------

// op1 (send, trigger C0 >= 1) moves a's send counter; op2 (write, trigger a's send counter >=
// 1) moves a's write counter; op3 (tagged send, trigger a's write counter >= 1). One
// fi_cntr_add on C0 runs all three.
TEST_F(TriggerTest, ChainOfTriggeredOpsRunsFromOneCntrAdd) {
    auto c0 = cntr();
    auto s = buf(kLen * 3), r = buf(kLen * 2);
    auto target = buf(kLen, 0, true);
    for (int i = 0; i < 3; ++i) fill_pattern(s->data() + kLen * i, kLen, 200 + i);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    post_trecv(r->data() + kLen, kLen, r->desc, 7, ctx(2));
    auto t1 = threshold_ctx(c0, 1);
    auto t2 = threshold_ctx(a().send_cntr, 1);
    auto t3 = threshold_ctx(a().write_cntr, 1);
    // Posted last to first, so nothing but the chain can order them.
    ASSERT_FI_OK(tsendmsg(a().ep, s->data() + 2 * kLen, kLen, s->desc, a().peer[1], 7, &t3));
    ASSERT_FI_OK(rmamsg(true, a().ep, s->data() + kLen, kLen, s->desc, a().peer[1],
                        rma_addr(*target), target->key, &t2));
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t1));
    ASSERT_FALSE(shows_up_within_hold(a(), &t1)) << "the chain started without its trigger";
    ASSERT_FI_OK(fi_cntr_add(c0, 1));
    ASSERT_TRUE(poll_until([&] { return a().log.has(&t3) || a().log.has_err(&t3); }))
        << "the chain did not reach op3: " << a().log.summary()
        << " send_cntr=" << fi_cntr_read(a().send_cntr)
        << " write_cntr=" << fi_cntr_read(a().write_cntr);
    ASSERT_TRUE(poll_until([&] { return b().log.has(ctx(1)) && b().log.has(ctx(2)); }))
        << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), kLen, 200), -1) << "op1";
    EXPECT_EQ(eventually_pattern(target->data(), kLen, 201), -1) << "op2";
    EXPECT_EQ(check_pattern(r->data() + kLen, kLen, 202), -1) << "op3";
    // Completion order at the initiator follows the chain.
    std::vector<void *> order;
    for (auto &comp : a().log.comps) order.push_back(comp.op_context);
    EXPECT_EQ(order, (std::vector<void *>{&t1, &t2, &t3}));
}

// The same with deferred sends, each fired by the previous one's completion counter: C0 ->
// send1 -> C1 -> send2 -> C2 -> send3 -> C3; the receiver gets them in chain order although
// they were queued in reverse.
TEST_F(TriggerTest, ChainOfDeferredSendsArrivesInOrder) {
    auto c0 = cntr(), c1 = cntr(), c2 = cntr(), c3 = cntr();
    auto s = buf(kLen * 3), r = buf(kLen * 3);
    for (int i = 0; i < 3; ++i) fill_pattern(s->data() + kLen * i, kLen, 300 + i);
    for (int i = 0; i < 3; ++i) post_recv(r->data() + kLen * i, kLen, r->desc, ctx(10 + i));
    fid_cntr *trig[3] = {c0, c1, c2}, *done[3] = {c1, c2, c3};
    std::vector<std::unique_ptr<DeferredMsg>> w;
    for (int i = 2; i >= 0; --i) {
        w.push_back(std::make_unique<DeferredMsg>(FI_OP_SEND, a().ep, s->data() + kLen * i, kLen,
                                                  s->desc, a().peer[1], trig[i], 1, done[i],
                                                  ctx(20 + i)));
        ASSERT_FI_OK(queue(w.back()->work)) << "send " << i;
    }
    ASSERT_FALSE(shows_up_within_hold(b(), ctx(10))) << "chain started without its trigger";
    ASSERT_FI_OK(fi_cntr_add(c0, 1));
    ASSERT_TRUE(cntr_reaches(c3, 1))
        << "c1=" << fi_cntr_read(c1) << " c2=" << fi_cntr_read(c2) << " c3=" << fi_cntr_read(c3);
    ASSERT_TRUE(poll_until([&] { return b().log.comps.size() >= 3; })) << b().log.summary();
    for (int i = 0; i < 3; ++i)
        EXPECT_EQ(check_pattern(r->data() + kLen * i, kLen, 300 + i), -1) << "receive " << i;
}

// ---- 4. every kind of data call ---------------------------------------------------------

TEST_F(TriggerTest, TriggeredWriteLandsAfterThreshold) {
    auto c = cntr();
    auto s = buf(kLen), target = buf(kLen, 0, true);
    fill_pattern(s->data(), kLen, 6);
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(rmamsg(true, a().ep, s->data(), kLen, s->desc, a().peer[1], rma_addr(*target),
                        target->key, &t));
    poll_for(kHold);
    ASSERT_EQ(check_fill(target->data(), kLen, 0), -1) << "written before the threshold";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    ASSERT_TRUE(wait_comp(a(), &t)) << a().log.summary();
    EXPECT_EQ(eventually_pattern(target->data(), kLen, 6), -1);
}

TEST_F(TriggerTest, TriggeredReadFetchesAfterThreshold) {
    auto c = cntr();
    auto local = buf(kLen), target = buf(kLen, 0, true);
    fill_pattern(target->data(), kLen, 7);
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(rmamsg(false, a().ep, local->data(), kLen, local->desc, a().peer[1],
                        rma_addr(*target), target->key, &t));
    ASSERT_FALSE(shows_up_within_hold(a(), &t)) << "read completed before the threshold";
    ASSERT_EQ(check_fill(local->data(), kLen, 0), -1) << "read before the threshold";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    auto got = wait_comp(a(), &t);
    ASSERT_TRUE(got) << a().log.summary();
    EXPECT_EQ(check_pattern(local->data(), kLen, 7), -1);
}

TEST_F(TriggerTest, TriggeredFetchAtomicReturnsOldValue) {
    auto c = cntr();
    auto local = buf(64), target = buf(64, 0, true);
    uint64_t *tv = reinterpret_cast<uint64_t *>(target->data());
    uint64_t *operand = reinterpret_cast<uint64_t *>(local->data());
    uint64_t *result = operand + 1;
    *tv = 40;
    *operand = 2;
    *result = 0xdead;
    fi_ioc ioc{operand, 1};
    fi_rma_ioc rioc{rma_addr(*target), 1, target->key};
    fi_ioc res{result, 1};
    void *desc = local->desc;
    auto t = threshold_ctx(c, 1);
    fi_msg_atomic m = atomic_msg(&ioc, &desc, a().peer[1], &rioc, FI_SUM, &t);
    ASSERT_FI_OK(fi_fetch_atomicmsg(a().ep, &m, &res, &desc, 1, FI_TRIGGER));
    ASSERT_FALSE(shows_up_within_hold(a(), &t)) << "fetch atomic ran before the threshold";
    ASSERT_EQ(*tv, 40u);
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    ASSERT_TRUE(wait_comp(a(), &t)) << a().log.summary();
    EXPECT_EQ(*result, 40u);
    EXPECT_TRUE(poll_until([&] { return *tv == 42u; })) << "target " << *tv;
}

TEST_F(TriggerTest, TriggeredCompareAtomicSwapsAfterThreshold) {
    auto c = cntr();
    auto local = buf(64), target = buf(64, 0, true);
    uint64_t *tv = reinterpret_cast<uint64_t *>(target->data());
    uint64_t *v = reinterpret_cast<uint64_t *>(local->data());  // operand, compare, result
    *tv = 9;
    v[0] = 77;
    v[1] = 9;
    v[2] = 0;
    fi_ioc ioc{&v[0], 1}, cmp{&v[1], 1}, res{&v[2], 1};
    fi_rma_ioc rioc{rma_addr(*target), 1, target->key};
    void *desc = local->desc;
    auto t = threshold_ctx(c, 1);
    fi_msg_atomic m = atomic_msg(&ioc, &desc, a().peer[1], &rioc, FI_CSWAP, &t);
    ASSERT_FI_OK(fi_compare_atomicmsg(a().ep, &m, &cmp, &desc, 1, &res, &desc, 1, FI_TRIGGER));
    ASSERT_FALSE(shows_up_within_hold(a(), &t)) << "compare atomic ran before the threshold";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    ASSERT_TRUE(wait_comp(a(), &t)) << a().log.summary();
    EXPECT_EQ(v[2], 9u);
    EXPECT_TRUE(poll_until([&] { return *tv == 77u; })) << "target " << *tv;
}

// A triggered receive is posted only when triggered: a message sent before waits as
// unexpected, then lands in the receive's buffer.
TEST_F(TriggerTest, TriggeredRecvTakesMessageSentBeforeTrigger) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 8);
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(recvmsg(b().ep, r->data(), kLen, r->desc, &t));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), kLen, s->desc, a().peer[1], ctx(1)); }));
    ASSERT_FALSE(shows_up_within_hold(b(), &t)) << "the receive matched before its trigger";
    ASSERT_EQ(check_fill(r->data(), kLen, 0), -1) << "bytes landed before the trigger";
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    auto got = wait_comp(b(), &t);
    ASSERT_TRUE(got) << b().log.summary();
    EXPECT_EQ(got->len, kLen);
    EXPECT_EQ(check_pattern(r->data(), kLen, 8), -1);
}

// ---- 5. deferred work -------------------------------------------------------------------

class DeferredSendTest : public TriggerFixture {
  protected:
    Fid<fid_cntr> trig, done;
    std::unique_ptr<DataBuf> s, r;
    std::unique_ptr<DeferredMsg> w;
    void TearDown() override {
        // The fixture's own objects go before the domain.
        w.reset();
        s.reset();
        r.reset();
        trig.reset();
        done.reset();
        TriggerFixture::TearDown();
    }
    // Queues a deferred send (no FI_COMPLETION) and runs it to its completion counter.
    void run_deferred_send() {
        trig = cntr();
        done = cntr();
        s = buf(kLen);
        r = buf(kLen);
        fill_pattern(s->data(), kLen, 9);
        post_recv(r->data(), kLen, r->desc, ctx(1));
        w = std::make_unique<DeferredMsg>(FI_OP_SEND, a().ep, s->data(), kLen, s->desc, a().peer[1],
                                          trig, 1, done, ctx(2));
        ASSERT_FI_OK(queue(w->work));
        ASSERT_FALSE(shows_up_within_hold(b(), ctx(1))) << "started before the threshold";
        ASSERT_FI_OK(fi_cntr_add(trig, 1));
        ASSERT_TRUE(wait_comp(b(), ctx(1))) << b().log.summary();
        ASSERT_EQ(check_pattern(r->data(), kLen, 9), -1);
    }
};

TEST_F(DeferredSendTest, CompletionCounterCountsOne) {
    ASSERT_NO_FATAL_FAILURE(run_deferred_send());
    ASSERT_TRUE(cntr_reaches(done, 1)) << fi_cntr_read(done);
    poll_for(kHold);
    EXPECT_EQ(fi_cntr_read(done), 1u);
}

TEST_F(DeferredSendTest, WritesNoCqEntryAtTheSender) {
    ASSERT_NO_FATAL_FAILURE(run_deferred_send());
    ASSERT_TRUE(cntr_reaches(done, 1));
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.comps.empty() && a().log.errs.empty()) << a().log.summary();
}

TEST_F(DeferredSendTest, LeavesTheEndpointSendCounterAlone) {
    ASSERT_NO_FATAL_FAILURE(run_deferred_send());
    ASSERT_TRUE(cntr_reaches(done, 1));
    poll_for(kQuiet);
    EXPECT_EQ(fi_cntr_read(a().send_cntr), 0u);
}

TEST_F(TriggerTest, DeferredWriteWithCompletionWritesOneCqEntry) {
    auto trig = cntr(), done = cntr();
    auto s = buf(kLen), target = buf(kLen, 0, true);
    fill_pattern(s->data(), kLen, 10);
    iovec iov{s->data(), kLen};
    void *desc = s->desc;
    fi_rma_iov riov{rma_addr(*target), kLen, target->key};
    fi_op_rma op{};
    op.ep = a().ep;
    op.msg.msg_iov = &iov;
    op.msg.desc = &desc;
    op.msg.iov_count = 1;
    op.msg.addr = a().peer[1];
    op.msg.rma_iov = &riov;
    op.msg.rma_iov_count = 1;
    op.msg.context = ctx(3);
    op.flags = FI_COMPLETION;
    fi_deferred_work w{};
    w.threshold = 1;
    w.triggering_cntr = trig;
    w.completion_cntr = done;
    w.op_type = FI_OP_WRITE;
    w.op.rma = &op;
    ASSERT_FI_OK(queue(w));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    ASSERT_TRUE(cntr_reaches(done, 1));
    poll_for(kQuiet);
    ASSERT_EQ(a().log.comps.size(), 1u) << a().log.summary();
    EXPECT_EQ(a().log.comps[0].op_context, ctx(3)) << "the entry carries the operation's context";
    EXPECT_EQ(eventually_pattern(target->data(), kLen, 10), -1);
}

// CNTR_SET 5 then CNTR_ADD 5 on the same trigger and threshold: 10 (the other way round: 5).
TEST_F(TriggerTest, DeferredCntrSetThenAddRunInQueueOrder) {
    auto trig = cntr(), x = cntr();
    ASSERT_FI_OK(fi_cntr_set(x, 100));
    DeferredCntr set(FI_OP_CNTR_SET, x, 5, trig, 1), add(FI_OP_CNTR_ADD, x, 5, trig, 1);
    ASSERT_FI_OK(queue(set.work));
    ASSERT_FI_OK(queue(add.work));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    poll_until([&] { return fi_cntr_read(x) == 10; }, 2s);
    EXPECT_EQ(fi_cntr_read(x), 10u);
}

// Deferred work compares success plus error count with its threshold.
TEST_F(TriggerTest, DeferredThresholdCountsErrors) {
    auto trig = cntr(), x = cntr();
    DeferredCntr add(FI_OP_CNTR_ADD, x, 1, trig, 2);
    ASSERT_FI_OK(queue(add.work));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    poll_for(kHold);
    ASSERT_EQ(fi_cntr_read(x), 0u) << "ran at 1 of 2";
    ASSERT_FI_OK(fi_cntr_adderr(trig, 1));
    EXPECT_TRUE(cntr_reaches(x, 1)) << "success 1 + error 1 did not reach threshold 2";
}

// The provider copies the request: one fi_deferred_work (and its fi_op_msg and iovec),
// rewritten for a second send right after the first was queued.
TEST_F(TriggerTest, DeferredWorkStructMayBeReused) {
    auto trig = cntr(), done = cntr();
    auto s1 = buf(kLen), s2 = buf(kLen), r = buf(kLen * 2);
    fill_pattern(s1->data(), kLen, 11);
    fill_pattern(s2->data(), kLen, 12);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    post_recv(r->data() + kLen, kLen, r->desc, ctx(2));
    DeferredMsg w(FI_OP_SEND, a().ep, s1->data(), kLen, s1->desc, a().peer[1], trig, 1, done,
                  ctx(3));
    ASSERT_FI_OK(queue(w.work));
    w.iov = {s2->data(), kLen};
    w.desc = s2->desc;
    w.op.msg.context = ctx(4);
    w.work.threshold = 2;
    ASSERT_FI_OK(queue(w.work));
    std::memset(static_cast<void *>(&w), 0xee, sizeof w);  // nothing of it may be read any more
    ASSERT_FI_OK(fi_cntr_add(trig, 2));
    ASSERT_TRUE(cntr_reaches(done, 2)) << fi_cntr_read(done);
    ASSERT_TRUE(poll_until([&] { return b().log.comps.size() >= 2; })) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), kLen, 11), -1) << "first request";
    EXPECT_EQ(check_pattern(r->data() + kLen, kLen, 12), -1) << "second request";
}

TEST_F(TriggerTest, DeferredTaggedSendAndRecvMeet) {
    constexpr uint64_t kTag = 0x77;
    auto trig = cntr(), sdone = cntr(), rdone = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 13);
    iovec siov{s->data(), kLen}, riov{r->data(), kLen};
    void *sdesc = s->desc, *rdesc = r->desc;
    fi_op_tagged sop{}, rop{};
    sop.ep = a().ep;
    sop.msg = {&siov, &sdesc, 1, a().peer[1], kTag, 0, ctx(1), 0};
    rop.ep = b().ep;
    rop.msg = {&riov, &rdesc, 1, FI_ADDR_UNSPEC, kTag, 0, ctx(2), 0};
    fi_deferred_work sw{}, rw{};
    sw.threshold = rw.threshold = 1;
    sw.triggering_cntr = rw.triggering_cntr = trig;
    sw.completion_cntr = sdone;
    rw.completion_cntr = rdone;
    sw.op_type = FI_OP_TSEND;
    rw.op_type = FI_OP_TRECV;
    sw.op.tagged = &sop;
    rw.op.tagged = &rop;
    ASSERT_FI_OK(queue(rw));
    ASSERT_FI_OK(queue(sw));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    ASSERT_TRUE(cntr_reaches(rdone, 1))
        << "recv done " << fi_cntr_read(rdone) << ", send done " << fi_cntr_read(sdone);
    EXPECT_EQ(check_pattern(r->data(), kLen, 13), -1);
}

TEST_F(TriggerTest, DeferredRecvCountsOnItsCompletionCounterOnly) {
    auto trig = cntr(), done = cntr();
    auto s = buf(kLen), r = buf(kLen);
    fill_pattern(s->data(), kLen, 14);
    DeferredMsg w(FI_OP_RECV, b().ep, r->data(), kLen, r->desc, FI_ADDR_UNSPEC, trig, 1, done,
                  ctx(2));
    ASSERT_FI_OK(queue(w.work));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), kLen, s->desc, a().peer[1], ctx(1)); }));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    ASSERT_TRUE(cntr_reaches(done, 1));
    poll_for(kHold);
    EXPECT_TRUE(b().log.comps.empty() && fi_cntr_read(b().recv_cntr) == 0)
        << "a deferred receive without FI_COMPLETION reported at the endpoint: "
        << b().log.summary() << ", recv counter " << fi_cntr_read(b().recv_cntr);
    EXPECT_EQ(check_pattern(r->data(), kLen, 14), -1);
}

TEST_F(TriggerTest, DeferredReadFetchesData) {
    auto trig = cntr(), done = cntr();
    auto local = buf(kLen), target = buf(kLen, 0, true);
    fill_pattern(target->data(), kLen, 15);
    iovec iov{local->data(), kLen};
    void *desc = local->desc;
    fi_rma_iov riov{rma_addr(*target), kLen, target->key};
    fi_op_rma op{};
    op.ep = a().ep;
    op.msg = {&iov, &desc, 1, a().peer[1], &riov, 1, ctx(1), 0};
    fi_deferred_work w{};
    w.threshold = 1;
    w.triggering_cntr = trig;
    w.completion_cntr = done;
    w.op_type = FI_OP_READ;
    w.op.rma = &op;
    ASSERT_FI_OK(queue(w));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    ASSERT_TRUE(cntr_reaches(done, 1));
    EXPECT_EQ(check_pattern(local->data(), kLen, 15), -1);
}

TEST_F(TriggerTest, DeferredFetchAtomicReturnsOldValue) {
    auto trig = cntr(), done = cntr();
    auto local = buf(64), target = buf(64, 0, true);
    uint64_t *tv = reinterpret_cast<uint64_t *>(target->data());
    uint64_t *v = reinterpret_cast<uint64_t *>(local->data());
    *tv = 1000;
    v[0] = 24;
    v[1] = 0;
    fi_ioc ioc{&v[0], 1}, res{&v[1], 1};
    fi_rma_ioc rioc{rma_addr(*target), 1, target->key};
    void *desc = local->desc;
    fi_op_fetch_atomic op{};
    op.ep = a().ep;
    op.msg.msg_iov = &ioc;
    op.msg.desc = &desc;
    op.msg.iov_count = 1;
    op.msg.addr = a().peer[1];
    op.msg.rma_iov = &rioc;
    op.msg.rma_iov_count = 1;
    op.msg.datatype = FI_UINT64;
    op.msg.op = FI_SUM;
    op.msg.context = ctx(1);
    op.fetch.msg_iov = &res;
    op.fetch.desc = &desc;
    op.fetch.iov_count = 1;
    fi_deferred_work w{};
    w.threshold = 1;
    w.triggering_cntr = trig;
    w.completion_cntr = done;
    w.op_type = FI_OP_FETCH_ATOMIC;
    w.op.fetch_atomic = &op;
    ASSERT_FI_OK(queue(w));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    ASSERT_TRUE(cntr_reaches(done, 1));
    EXPECT_EQ(v[1], 1000u);
    EXPECT_TRUE(poll_until([&] { return *tv == 1024u; })) << *tv;
}

TEST_F(TriggerTest, DeferredWriteWithBadKeyCountsAnErrorOnItsCompletionCounter) {
    auto trig = cntr(), done = cntr();
    auto s = buf(kLen), target = buf(kLen, 0, true);
    iovec iov{s->data(), kLen};
    void *desc = s->desc;
    fi_rma_iov riov{rma_addr(*target), kLen, target->key + 0x5151};
    fi_op_rma op{};
    op.ep = a().ep;
    op.msg = {&iov, &desc, 1, a().peer[1], &riov, 1, ctx(1), 0};
    fi_deferred_work w{};
    w.threshold = 1;
    w.triggering_cntr = trig;
    w.completion_cntr = done;
    w.op_type = FI_OP_WRITE;
    w.op.rma = &op;
    ASSERT_FI_OK(queue(w));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    EXPECT_TRUE(cntr_err_reaches(done, 1))
        << "error " << fi_cntr_readerr(done) << ", success " << fi_cntr_read(done);
}

// ---- 6. cancel --------------------------------------------------------------------------

TEST_F(TriggerTest, CancelPendingTriggeredSendWritesEcanceled) {
    auto c = cntr();
    auto s = buf(kLen);
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FI_OK(fi_cancel(&a().ep->fid, &t));
    auto err = wait_err(a(), &t);
    ASSERT_TRUE(err) << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECANCELED) << describe(*err);
    poll_for(kHold);
    EXPECT_EQ(a().log.errs.size() + a().log.comps.size(), 1u) << a().log.summary();
}

TEST_F(TriggerTest, SecondCancelOfTriggeredSendIsEnoent) {
    auto c = cntr();
    auto s = buf(kLen);
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FI_OK(fi_cancel(&a().ep->fid, &t));
    EXPECT_EQ(fi_cancel(&a().ep->fid, &t), -FI_ENOENT);
}

TEST_F(TriggerTest, CancelledTriggeredSendNeverRuns) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FI_OK(fi_cancel(&a().ep->fid, &t));
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    EXPECT_FALSE(shows_up_within_hold(b(), ctx(1))) << "a cancelled send was delivered";
}

TEST_F(TriggerTest, CancelAfterTriggeredSendStartedIsEnoent) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    ASSERT_TRUE(wait_comp(a(), &t)) << a().log.summary();
    EXPECT_EQ(fi_cancel(&a().ep->fid, &t), -FI_ENOENT);
}

TEST_F(TriggerTest, CancelWorkThenAgainIsEnoent) {
    auto trig = cntr(), x = cntr();
    DeferredCntr add(FI_OP_CNTR_ADD, x, 1, trig, 1);
    ASSERT_FI_OK(queue(add.work));
    ASSERT_FI_OK(cancel_work(add.work));
    EXPECT_EQ(cancel_work(add.work), -FI_ENOENT);
}

TEST_F(TriggerTest, CancelledWorkNeverRuns) {
    auto trig = cntr(), x = cntr();
    DeferredCntr add(FI_OP_CNTR_ADD, x, 1, trig, 1);
    ASSERT_FI_OK(queue(add.work));
    ASSERT_FI_OK(cancel_work(add.work));
    ASSERT_FI_OK(fi_cntr_add(trig, 3));
    poll_for(kHold);
    EXPECT_EQ(fi_cntr_read(x), 0u) << "cancelled work ran";
}

TEST_F(TriggerTest, CancelWorkThatAlreadyRanIsEnoent) {
    auto trig = cntr(), x = cntr();
    ASSERT_FI_OK(fi_cntr_set(trig, 1));
    DeferredCntr add(FI_OP_CNTR_ADD, x, 1, trig, 1);
    ASSERT_FI_OK(queue(add.work));
    ASSERT_TRUE(cntr_reaches(x, 1));
    EXPECT_EQ(cancel_work(add.work), -FI_ENOENT);
}

// ---- 7. flush ---------------------------------------------------------------------------

TEST_F(TriggerTest, FlushAllDiscardsEveryWork) {
    auto t1 = cntr(), t2 = cntr(), x = cntr();
    DeferredCntr w1(FI_OP_CNTR_ADD, x, 1, t1, 1), w2(FI_OP_CNTR_ADD, x, 10, t2, 2);
    ASSERT_FI_OK(queue(w1.work));
    ASSERT_FI_OK(queue(w2.work));
    ASSERT_FI_OK(flush_work(nullptr));
    ASSERT_FI_OK(fi_cntr_add(t1, 5));
    ASSERT_FI_OK(fi_cntr_add(t2, 5));
    poll_for(kHold);
    EXPECT_EQ(fi_cntr_read(x), 0u) << "flushed work ran";
}

TEST_F(TriggerTest, FlushByCounterDiscardsOnlyThatCountersWork) {
    auto t1 = cntr(), t2 = cntr(), x = cntr(), y = cntr();
    DeferredCntr wx(FI_OP_CNTR_ADD, x, 1, t1, 1), wy(FI_OP_CNTR_ADD, y, 1, t2, 1);
    ASSERT_FI_OK(queue(wx.work));
    ASSERT_FI_OK(queue(wy.work));
    fi_deferred_work sel{};
    sel.triggering_cntr = t1;
    ASSERT_FI_OK(flush_work(&sel));
    ASSERT_FI_OK(fi_cntr_add(t1, 1));
    ASSERT_FI_OK(fi_cntr_add(t2, 1));
    ASSERT_TRUE(cntr_reaches(y, 1)) << "work of the other counter was discarded too";
    EXPECT_EQ(fi_cntr_read(x), 0u) << "work of the flushed counter ran";
}

TEST_F(TriggerTest, FlushedWorkWithCompletionWritesEcanceledEntry) {
    auto trig = cntr(), done = cntr();
    auto s = buf(kLen);
    DeferredMsg w(FI_OP_SEND, a().ep, s->data(), kLen, s->desc, a().peer[1], trig, 1, done, ctx(5),
                  FI_COMPLETION);
    ASSERT_FI_OK(queue(w.work));
    ASSERT_FI_OK(flush_work(nullptr));
    auto err = wait_err(a(), ctx(5));
    ASSERT_TRUE(err) << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECANCELED) << describe(*err);
}

TEST_F(TriggerTest, FlushedWorkCountsAnErrorOnItsCompletionCounter) {
    auto trig = cntr(), done = cntr();
    auto s = buf(kLen);
    DeferredMsg w(FI_OP_SEND, a().ep, s->data(), kLen, s->desc, a().peer[1], trig, 1, done, ctx(5));
    ASSERT_FI_OK(queue(w.work));
    ASSERT_FI_OK(flush_work(nullptr));
    EXPECT_TRUE(cntr_err_reaches(done, 1)) << fi_cntr_readerr(done);
}

TEST_F(TriggerTest, FlushedWorkWithoutCompletionWritesNoCqEntry) {
    auto trig = cntr(), done = cntr();
    auto s = buf(kLen);
    DeferredMsg w(FI_OP_SEND, a().ep, s->data(), kLen, s->desc, a().peer[1], trig, 1, done, ctx(5));
    ASSERT_FI_OK(queue(w.work));
    ASSERT_FI_OK(flush_work(nullptr));
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.comps.empty() && a().log.errs.empty()) << a().log.summary();
}

// FI_FLUSH_WORK is about deferred work: FI_TRIGGER operations stay.
TEST_F(TriggerTest, FlushLeavesTriggeredOpsAlone) {
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    ASSERT_FI_OK(flush_work(nullptr));
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    EXPECT_TRUE(wait_comp(a(), &t)) << a().log.summary();
}

// ---- 8. close ---------------------------------------------------------------------------

TEST_F(TriggerTest, ClosedEndpointsPendingOpsNeverRun) {
    auto c = cntr();
    auto s = buf(kLen * 4), r = buf(kLen * 4);
    auto target = buf(kLen, 0, true);
    for (int i = 0; i < 4; ++i) post_recv(r->data() + kLen * i, kLen, r->desc, ctx(10 + i));
    fi_triggered_context t[4] = {threshold_ctx(c, 1), threshold_ctx(c, 1), threshold_ctx(c, 2),
                                 threshold_ctx(c, 3)};
    for (int i = 0; i < 3; ++i)
        ASSERT_FI_OK(sendmsg(a().ep, s->data() + kLen * i, kLen, s->desc, a().peer[1], &t[i]));
    ASSERT_FI_OK(rmamsg(true, a().ep, s->data(), kLen, s->desc, a().peer[1], rma_addr(*target),
                        target->key, &t[3]));
    fid_ep *raw = a().ep.release();
    ASSERT_FI_OK(fi_close(&raw->fid));
    ASSERT_FI_OK(fi_cntr_add(c, 5));
    poll_for(kQuiet);
    EXPECT_TRUE(b().log.comps.empty() && check_fill(target->data(), kLen, 0) == -1 &&
                a().log.comps.empty() && a().log.errs.empty())
        << "work of a closed endpoint ran or reported: a: " << a().log.summary()
        << "; b: " << b().log.summary();
}

TEST_F(TriggerTest, ClosingThresholdCounterCancelsWaitingSend) {
    Fid<fid_cntr> c = cntr();
    auto s = buf(kLen);
    auto t = threshold_ctx(c, 1);
    ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t));
    fid_cntr *raw = c.release();
    ASSERT_FI_OK(fi_close(&raw->fid));
    auto err = wait_err(a(), &t);
    ASSERT_TRUE(err) << "no error completion for a send whose counter was closed: "
                     << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECANCELED) << describe(*err);
}

TEST_F(TriggerTest, ClosingCompletionCounterDiscardsDeferredWork) {
    auto trig = cntr();
    Fid<fid_cntr> done = cntr();
    auto s = buf(kLen), r = buf(kLen);
    post_recv(r->data(), kLen, r->desc, ctx(1));
    DeferredMsg w(FI_OP_SEND, a().ep, s->data(), kLen, s->desc, a().peer[1], trig, 1, done, ctx(5));
    ASSERT_FI_OK(queue(w.work));
    fid_cntr *raw = done.release();
    ASSERT_FI_OK(fi_close(&raw->fid));
    ASSERT_FI_OK(fi_cntr_add(trig, 1));
    EXPECT_FALSE(shows_up_within_hold(b(), ctx(1))) << "work naming a closed counter ran";
}

// ---- 9. bad input -----------------------------------------------------------------------

TEST_F(TriggerTest, CounterOfAnotherDomainIsEinval) {
    Fid<fid_domain> d2;
    ASSERT_FI_OK(fi_domain(fabric, info.get(), d2.out(), nullptr));
    Fid<fid_cntr> foreign;
    fi_cntr_attr attr{};
    attr.events = FI_CNTR_EVENTS_COMP;
    ASSERT_FI_OK(fi_cntr_open(d2, &attr, foreign.out(), nullptr));
    auto s = buf(kLen);
    auto t = threshold_ctx(foreign, 1);
    EXPECT_EQ(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t), -FI_EINVAL);
}

TEST_F(TriggerTest, DeferredWorkOnCounterOfAnotherDomainIsEinval) {
    Fid<fid_domain> d2;
    ASSERT_FI_OK(fi_domain(fabric, info.get(), d2.out(), nullptr));
    Fid<fid_cntr> foreign;
    fi_cntr_attr attr{};
    attr.events = FI_CNTR_EVENTS_COMP;
    ASSERT_FI_OK(fi_cntr_open(d2, &attr, foreign.out(), nullptr));
    auto x = cntr();
    DeferredCntr add(FI_OP_CNTR_ADD, x, 1, foreign, 1);
    EXPECT_EQ(queue(add.work), -FI_EINVAL);
}

TEST_F(TriggerTest, ThresholdOnANonCounterIsEinval) {
    auto s = buf(kLen);
    auto t = threshold_ctx(reinterpret_cast<fid_cntr *>(a().cq.get()), 1);
    EXPECT_EQ(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t), -FI_EINVAL);
}

TEST_F(TriggerTest, NullContextIsEinval) {
    auto s = buf(kLen);
    EXPECT_EQ(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], nullptr), -FI_EINVAL);
}

TEST_F(TriggerTest, XpuTriggerWithoutXpuCapIsEinval) {
    auto s = buf(kLen);
    fi_trigger_var var{};
    fi_triggered_context t{};
    t.event_type = FI_TRIGGER_XPU;
    t.trigger.xpu.count = 1;
    t.trigger.xpu.iface = FI_HMEM_SYSTEM;
    t.trigger.xpu.var = &var;
    EXPECT_EQ(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t), -FI_EINVAL);
}

TEST_F(TriggerTest, EndpointWithoutTriggerCapIsEopnotsupp) {
    InfoPtr plain(fi_dupinfo(info.get()));
    ASSERT_TRUE(plain);
    plain->caps &= ~FI_TRIGGER;
    plain->tx_attr->caps &= ~FI_TRIGGER;
    plain->rx_attr->caps &= ~FI_TRIGGER;
    Fid<fid_cq> cq;
    Fid<fid_av> av;
    Fid<fid_ep> ep;
    ASSERT_NO_FATAL_FAILURE(open_cq(cq, opts.cq_format, FI_WAIT_NONE));
    ASSERT_NO_FATAL_FAILURE(open_av(av));
    ASSERT_FI_OK(fi_endpoint(domain, plain.get(), ep.out(), nullptr));
    ASSERT_FI_OK(fi_ep_bind(ep, &av->fid, 0));
    ASSERT_FI_OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    ASSERT_FI_OK(fi_enable(ep));
    fi_addr_t to = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(av, b().name.data(), 1, &to, 0, nullptr), 1);
    auto c = cntr();
    auto s = buf(kLen);
    auto t = threshold_ctx(c, 1);
    EXPECT_EQ(sendmsg(ep, s->data(), kLen, s->desc, to, &t), -FI_EOPNOTSUPP);
}

TEST_F(TriggerTest, CntrOpWithCompletionCounterIsEinval) {
    auto trig = cntr(), x = cntr(), done = cntr();
    DeferredCntr add(FI_OP_CNTR_ADD, x, 1, trig, 1);
    add.work.completion_cntr = done;
    EXPECT_EQ(queue(add.work), -FI_EINVAL);
}

TEST_F(TriggerTest, UnknownOpTypeIsEnosys) {
    auto trig = cntr(), x = cntr();
    DeferredCntr add(FI_OP_CNTR_ADD, x, 1, trig, 1);
    add.work.op_type = static_cast<fi_op_type>(99);
    EXPECT_EQ(queue(add.work), -FI_ENOSYS);
}

TEST_F(TriggerTest, DeferredOpWithNullEndpointIsEinval) {
    auto trig = cntr(), done = cntr();
    auto s = buf(kLen);
    DeferredMsg w(FI_OP_SEND, nullptr, s->data(), kLen, s->desc, a().peer[1], trig, 1, done,
                  ctx(1));
    EXPECT_EQ(queue(w.work), -FI_EINVAL);
}

TEST_F(TriggerTest, DeferredOpWithEndpointOfAnotherDomainIsEinval) {
    Fid<fid_domain> d2;
    ASSERT_FI_OK(fi_domain(fabric, info.get(), d2.out(), nullptr));
    Fid<fid_ep> foreign;
    ASSERT_FI_OK(fi_endpoint(d2, info.get(), foreign.out(), nullptr));
    auto trig = cntr(), done = cntr();
    auto s = buf(kLen);
    DeferredMsg w(FI_OP_SEND, foreign, s->data(), kLen, s->desc, a().peer[1], trig, 1, done,
                  ctx(1));
    EXPECT_EQ(queue(w.work), -FI_EINVAL);
}

// ---- 10. queue depth --------------------------------------------------------------------

class TriggerDepthTest : public TriggerFixture {
  protected:
    void configure(FabricOptions &o) override {
        TriggerFixture::configure(o);
        o.tx_size = 8;
    }
};

TEST_F(TriggerDepthTest, OneMorePendingTriggeredSendThanTxSizeIsEagain) {
    const size_t n = info->tx_attr->size;
    ASSERT_EQ(n, 8u) << "tx_attr->size granted";
    auto c = cntr();
    auto s = buf(kLen);
    std::vector<fi_triggered_context> t(n + 1, threshold_ctx(c, 1));
    for (size_t i = 0; i < n; ++i)
        ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t[i])) << "send " << i;
    EXPECT_EQ(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t[n]), -FI_EAGAIN);
}

TEST_F(TriggerDepthTest, PostingWorksAgainOnceTriggeredSendsCompleted) {
    const size_t n = info->tx_attr->size;
    ASSERT_EQ(n, 8u) << "tx_attr->size granted";
    auto c = cntr();
    auto s = buf(kLen), r = buf(kLen * (n + 1));
    for (size_t i = 0; i <= n; ++i) post_recv(r->data() + kLen * i, kLen, r->desc, ctx(10 + i));
    std::vector<fi_triggered_context> t(n + 1, threshold_ctx(c, 1));
    for (size_t i = 0; i < n; ++i)
        ASSERT_FI_OK(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t[i])) << "send " << i;
    ASSERT_EQ(sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t[n]), -FI_EAGAIN);
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    ASSERT_TRUE(poll_until([&] {
        for (size_t i = 0; i < n; ++i)
            if (!a().log.has(&t[i])) return false;
        return true;
    })) << a().log.summary();
    // Slots may come back a little after the completions (over the link, a send is reported
    // when it is handed to the link and leaves the queue when the link is done with it): as
    // always, -FI_EAGAIN means progress and retry.
    EXPECT_FI_OK(post([&] {
        return sendmsg(a().ep, s->data(), kLen, s->desc, a().peer[1], &t[n]);
    })) << "the queue depth never came back";
    EXPECT_TRUE(wait_comp(a(), &t[n])) << a().log.summary();
}

}  // namespace
}  // namespace tandem_test

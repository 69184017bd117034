// tandem as the peer of another provider's counter (fi_peer(3), "PEER COUNTER", 1.19): a
// counter opened with FI_PEER counts every completion of the endpoints bound to it into the
// owner's counter (inc, incerr) and keeps none; the owner's fi_cntr_read drives tandem's
// progress through it, and its other calls are the owner's (-FI_ENOSYS).
//
// The owner is the test's: a counter recording each call. Two plain tandem endpoints, each of a
// domain of its own, bind the owner's counters before they are enabled.
#include <gtest/gtest.h>

#include "peer/peer_cntr.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

namespace {

using tandem::peer::OwnerCntr;
using tandem::peer::OwnerCntrContext;
using tandem::peer::OwnerCntrOps;

struct TestOwnerCntr {
    OwnerCntr cntr{};
    OwnerCntrOps ops{};
    size_t incs = 0, errors = 0;
    TestOwnerCntr() {
        ops.size = sizeof ops;
        ops.inc = [](OwnerCntr *c) { ++reinterpret_cast<TestOwnerCntr *>(c)->incs; };
        ops.incerr = [](OwnerCntr *c) { ++reinterpret_cast<TestOwnerCntr *>(c)->errors; };
        cntr.owner_ops = &ops;
    }
    OwnerCntrContext context() { return {sizeof(OwnerCntrContext), &cntr}; }
};
static_assert(offsetof(TestOwnerCntr, cntr) == 0);

fid_cntr *open_peer_cntr(fid_domain *dom, OwnerCntrContext *ctx, int *ret) {
    fi_cntr_attr attr{};
    attr.events = FI_CNTR_EVENTS_COMP;
    attr.flags = FI_PEER;
    fid_cntr *c = nullptr;
    *ret = fi_cntr_open(dom, &attr, &c, ctx);
    return c;
}

class OwnerCntrTest : public ::testing::Test {
  protected:
    void SetUp() override {
        fi_info *hints = fi_allocinfo();
        hints->ep_attr->type = FI_EP_RDM;
        hints->caps = FI_TAGGED;
        hints->fabric_attr->prov_name = strdup("tandem");
        ASSERT_EQ(fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &info_), 0);
        fi_freeinfo(hints);
        ASSERT_EQ(fi_fabric(info_->fabric_attr, &fabric_, nullptr), 0);
        open_side(send_, send_owner_, FI_SEND);
        open_side(recv_, recv_owner_, FI_RECV);
        char name[128];
        size_t len = sizeof name;
        ASSERT_EQ(fi_getname(&recv_.ep->fid, name, &len), 0);
        ASSERT_EQ(fi_av_insert(send_.av, name, 1, &to_receiver_, 0, nullptr), 1);
    }
    struct Side {
        fid_domain *dom = nullptr;
        fid_cq *cq = nullptr;
        fid_av *av = nullptr;
        fid_ep *ep = nullptr;
        fid_cntr *cntr = nullptr;  // tandem's, importing the owner's
    };
    void open_side(Side &s, TestOwnerCntr &owner, uint64_t bind) {
        ASSERT_EQ(fi_domain(fabric_, info_, &s.dom, nullptr), 0);
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        ASSERT_EQ(fi_cq_open(s.dom, &cq_attr, &s.cq, nullptr), 0);
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        ASSERT_EQ(fi_av_open(s.dom, &av_attr, &s.av, nullptr), 0);
        OwnerCntrContext ctx = owner.context();
        int ret;
        s.cntr = open_peer_cntr(s.dom, &ctx, &ret);
        ASSERT_EQ(ret, 0);
        ASSERT_EQ(fi_endpoint(s.dom, info_, &s.ep, nullptr), 0);
        ASSERT_EQ(fi_ep_bind(s.ep, &s.cq->fid, FI_TRANSMIT | FI_RECV), 0);
        ASSERT_EQ(fi_ep_bind(s.ep, &s.av->fid, 0), 0);
        ASSERT_EQ(fi_ep_bind(s.ep, &s.cntr->fid, bind), 0);
        ASSERT_EQ(fi_enable(s.ep), 0);
    }
    void TearDown() override {
        for (Side *s : {&send_, &recv_}) {
            for (fid *f : {s->ep ? &s->ep->fid : nullptr, s->cntr ? &s->cntr->fid : nullptr,
                           s->av ? &s->av->fid : nullptr, s->cq ? &s->cq->fid : nullptr,
                           s->dom ? &s->dom->fid : nullptr}) {
                if (f) {
                    EXPECT_EQ(fi_close(f), 0);
                }
            }
        }
        if (fabric_) {
            EXPECT_EQ(fi_close(&fabric_->fid), 0);
        }
        fi_freeinfo(info_);
    }
    // Drives both sides with `poll` until done() or 10 s.
    bool until(const std::function<void()> &poll, const std::function<bool()> &done) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!done()) {
            if (std::chrono::steady_clock::now() > deadline) return false;
            poll();
        }
        return true;
    }
    // Reads one side's CQ: successes and errors seen.
    void drain(Side &s, size_t &done, size_t &failed) {
        fi_cq_tagged_entry e;
        ssize_t n = fi_cq_read(s.cq, &e, 1);
        if (n == 1) ++done;
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(s.cq, &err, 0) == 1) ++failed;
        }
    }
    // What both CQs said, read until done() or 10 s.
    struct CqCounts {
        size_t sent = 0, received = 0, failed = 0;
    };
    bool until_cqs(CqCounts &n, const std::function<bool()> &done) {
        return until(
            [&] {
                drain(send_, n.sent, n.failed);
                drain(recv_, n.received, n.failed);
            },
            done);
    }
    void send(const std::vector<char> &buf, uint64_t tag) {
        ssize_t ret;
        do {
            ret = fi_tsend(send_.ep, buf.data(), buf.size(), nullptr, to_receiver_, tag, nullptr);
            if (ret == -FI_EAGAIN) fi_cntr_read(send_.cntr);
        } while (ret == -FI_EAGAIN);
        ASSERT_EQ(ret, 0);
    }

    TestOwnerCntr send_owner_, recv_owner_;
    fi_info *info_ = nullptr;
    fid_fabric *fabric_ = nullptr;
    Side send_, recv_;
    fi_addr_t to_receiver_ = FI_ADDR_NOTAVAIL;
};

// 16 B goes eager, 1 MiB by rendezvous (its send completes once the receiver has the data).
TEST_F(OwnerCntrTest, CompletionsCountIntoTheOwnersCounter) {
    std::vector<char> out[2] = {std::vector<char>(16, 'a'), std::vector<char>(1 << 20, 'b')};
    std::vector<char> in[2] = {std::vector<char>(16), std::vector<char>(1 << 20)};
    for (int i = 0; i < 2; ++i)
        ASSERT_EQ(fi_trecv(recv_.ep, in[i].data(), in[i].size(), nullptr, FI_ADDR_UNSPEC, 7 + i, 0,
                           nullptr),
                  0);
    for (int i = 0; i < 2; ++i) send(out[i], 7 + i);
    CqCounts n;
    ASSERT_TRUE(until_cqs(n, [&] { return n.sent == 2 && n.received == 2; }));
    EXPECT_EQ(n.failed, 0u);
    EXPECT_EQ(send_owner_.incs, 2u);
    EXPECT_EQ(recv_owner_.incs, 2u);
    EXPECT_EQ(send_owner_.errors + recv_owner_.errors, 0u);
    EXPECT_EQ(in[0], out[0]);
    EXPECT_EQ(in[1], out[1]);
}

// A receive too small for its message completes in error: incerr, not inc.
TEST_F(OwnerCntrTest, AFailedReceiveCountsIntoTheOwnersErrors) {
    std::vector<char> out(64, 'c'), in(8);
    ASSERT_EQ(fi_trecv(recv_.ep, in.data(), in.size(), nullptr, FI_ADDR_UNSPEC, 3, 0, nullptr), 0);
    send(out, 3);
    CqCounts n;
    ASSERT_TRUE(until_cqs(n, [&] { return n.failed == 1 && n.sent == 1; }));
    EXPECT_EQ(n.received, 0u);
    EXPECT_EQ(recv_owner_.errors, 1u);
    EXPECT_EQ(recv_owner_.incs, 0u);
    EXPECT_EQ(send_owner_.incs, 1u);
}

// No CQ is read here: only the owner's fi_cntr_read calls, through tandem's counters, move the
// transfer (tandem's progress is manual), and they answer 0, the value being the owner's.
TEST_F(OwnerCntrTest, TheOwnersReadDrivesProgress) {
    std::vector<char> out(1 << 20, 'd'), in(1 << 20);
    ASSERT_EQ(fi_trecv(recv_.ep, in.data(), in.size(), nullptr, FI_ADDR_UNSPEC, 5, 0, nullptr), 0);
    send(out, 5);
    uint64_t read_back = 0;
    ASSERT_TRUE(until(
        [&] {
            read_back |= fi_cntr_read(send_.cntr);
            read_back |= fi_cntr_read(recv_.cntr);
        },
        [&] { return send_owner_.incs == 1 && recv_owner_.incs == 1; }));
    EXPECT_EQ(read_back, 0u);
    EXPECT_EQ(in, out);
}

// What is the owner's stays the owner's; a counter without a peer context is refused.
TEST_F(OwnerCntrTest, TheOwnersCallsAndBadContextsAreRefused) {
    EXPECT_EQ(fi_cntr_add(send_.cntr, 1), -FI_ENOSYS);
    EXPECT_EQ(fi_cntr_set(send_.cntr, 1), -FI_ENOSYS);
    EXPECT_EQ(fi_cntr_adderr(send_.cntr, 1), -FI_ENOSYS);
    EXPECT_EQ(fi_cntr_seterr(send_.cntr, 1), -FI_ENOSYS);
    EXPECT_EQ(fi_cntr_wait(send_.cntr, 1, 0), -FI_ENOSYS);
    EXPECT_EQ(fi_cntr_readerr(send_.cntr), 0u);

    int ret;
    EXPECT_EQ(open_peer_cntr(send_.dom, nullptr, &ret), nullptr);
    EXPECT_EQ(ret, -FI_EINVAL);
    TestOwnerCntr half;
    half.ops.incerr = nullptr;
    OwnerCntrContext ctx = half.context();
    EXPECT_EQ(open_peer_cntr(send_.dom, &ctx, &ret), nullptr);
    EXPECT_EQ(ret, -FI_EINVAL);

    // Deferred work can neither wait on nor count into a value tandem cannot read.
    fi_cntr_attr attr{};
    attr.events = FI_CNTR_EVENTS_COMP;
    fid_cntr *own = nullptr;
    ASSERT_EQ(fi_cntr_open(send_.dom, &attr, &own, nullptr), 0);
    fi_op_cntr op{own, 1};
    fi_deferred_work work{};
    work.triggering_cntr = send_.cntr;
    work.threshold = 1;
    work.op_type = FI_OP_CNTR_ADD;
    work.op.cntr = &op;
    EXPECT_EQ(fi_control(&send_.dom->fid, FI_QUEUE_WORK, &work), -FI_EINVAL);
    work.triggering_cntr = own;
    op.cntr = send_.cntr;
    EXPECT_EQ(fi_control(&send_.dom->fid, FI_QUEUE_WORK, &work), -FI_EINVAL);
    EXPECT_EQ(fi_close(&own->fid), 0);
}

}  // namespace

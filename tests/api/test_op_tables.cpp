// Every fid tandem hands out has complete ops tables, and every libfabric 1.17 wrapper that
// reaches a part tandem does not offer (atomics, collectives, and the parts a shared context
// has no use for) returns a negative fabric errno instead of crashing the application.
#include "../common/op_tables.h"
#include "fabric_fixture.h"

// fi_wait_open and fi_poll_open: deprecated from libfabric 2.0, whose headers mark them so (a build
// against them, cmake -DTANDEM_LIBFABRIC_PREFIX). Applications of 1.x call them, and tandem serves
// those.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace tandem_test {
namespace {

// Calls every atomic wrapper of <rdma/fi_atomic.h> on ep, an endpoint opened without FI_ATOMIC
// (or a shared context, which has no atomics), so each must say -FI_EOPNOTSUPP.
void expect_no_atomics(const std::string &what, fid_ep *ep, fi_addr_t dest) {
    SCOPED_TRACE(what);
    uint64_t buf = 1, cmp = 1, res = 0;
    size_t count = 0;
    fi_ioc ioc{&buf, 1}, cioc{&cmp, 1}, rioc{&res, 1};
    void *desc = nullptr;
    fi_rma_ioc rma{0, 1, 0};
    fi_msg_atomic msg{};
    msg.msg_iov = &ioc;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = dest;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.datatype = FI_UINT64;
    msg.op = FI_SUM;
    constexpr ssize_t no = -FI_EOPNOTSUPP;
    EXPECT_EQ(fi_atomic(ep, &buf, 1, nullptr, dest, 0, 0, FI_UINT64, FI_SUM, nullptr), no);
    EXPECT_EQ(fi_atomicv(ep, &ioc, &desc, 1, dest, 0, 0, FI_UINT64, FI_SUM, nullptr), no);
    EXPECT_EQ(fi_atomicmsg(ep, &msg, 0), no);
    EXPECT_EQ(fi_inject_atomic(ep, &buf, 1, dest, 0, 0, FI_UINT64, FI_SUM), no);
    EXPECT_EQ(fi_fetch_atomic(ep, &buf, 1, nullptr, &res, nullptr, dest, 0, 0, FI_UINT64, FI_SUM,
                              nullptr),
              no);
    EXPECT_EQ(fi_fetch_atomicv(ep, &ioc, &desc, 1, &rioc, &desc, 1, dest, 0, 0, FI_UINT64, FI_SUM,
                               nullptr),
              no);
    EXPECT_EQ(fi_fetch_atomicmsg(ep, &msg, &rioc, &desc, 1, 0), no);
    EXPECT_EQ(fi_compare_atomic(ep, &buf, 1, nullptr, &cmp, nullptr, &res, nullptr, dest, 0, 0,
                                FI_UINT64, FI_CSWAP, nullptr),
              no);
    EXPECT_EQ(fi_compare_atomicv(ep, &ioc, &desc, 1, &cioc, &desc, 1, &rioc, &desc, 1, dest, 0, 0,
                                 FI_UINT64, FI_CSWAP, nullptr),
              no);
    EXPECT_EQ(fi_compare_atomicmsg(ep, &msg, &cioc, &desc, 1, &rioc, &desc, 1, 0), no);
    EXPECT_EQ(fi_atomicvalid(ep, FI_INT32, FI_SUM, &count), no);
    EXPECT_EQ(fi_fetch_atomicvalid(ep, FI_INT32, FI_SUM, &count), no);
    EXPECT_EQ(fi_compare_atomicvalid(ep, FI_INT32, FI_CSWAP, &count), no);
}

// Calls every collective wrapper of <rdma/fi_collective.h> on ep: -FI_EOPNOTSUPP where the
// object has no collectives (MSG endpoints, receive contexts, and RDM endpoints that did not
// ask for FI_COLLECTIVE, as the fixture's do not).
void expect_no_collectives(const std::string &what, fid_ep *ep) {
    constexpr ssize_t no = -FI_EOPNOTSUPP;
    SCOPED_TRACE(what);
    uint64_t buf[4] = {}, res[4] = {};
    constexpr fi_addr_t coll = 0, root = 0;
    EXPECT_EQ(fi_barrier(ep, coll, nullptr), no);
    EXPECT_EQ(fi_barrier2(ep, coll, 0, nullptr), no);
    EXPECT_EQ(fi_broadcast(ep, buf, 1, nullptr, coll, root, FI_UINT64, 0, nullptr), no);
    EXPECT_EQ(fi_alltoall(ep, buf, 1, nullptr, res, nullptr, coll, FI_UINT64, 0, nullptr), no);
    EXPECT_EQ(fi_allreduce(ep, buf, 1, nullptr, res, nullptr, coll, FI_UINT64, FI_SUM, 0, nullptr),
              no);
    EXPECT_EQ(fi_allgather(ep, buf, 1, nullptr, res, nullptr, coll, FI_UINT64, 0, nullptr), no);
    EXPECT_EQ(
        fi_reduce_scatter(ep, buf, 1, nullptr, res, nullptr, coll, FI_UINT64, FI_SUM, 0, nullptr),
        no);
    EXPECT_EQ(
        fi_reduce(ep, buf, 1, nullptr, res, nullptr, coll, root, FI_UINT64, FI_SUM, 0, nullptr),
        no);
    EXPECT_EQ(fi_scatter(ep, buf, 1, nullptr, res, nullptr, coll, root, FI_UINT64, 0, nullptr), no);
    EXPECT_EQ(fi_gather(ep, buf, 1, nullptr, res, nullptr, coll, root, FI_UINT64, 0, nullptr), no);
}

class OpTables : public FabricTest {};

TEST_F(OpTables, FabricDomainAndCompletionObjects) {
    expect_complete_fabric("fabric", fabric);
    expect_complete_domain("domain", domain);
    expect_complete_cq("cq", a().cq);
    expect_complete_av("av", a().av);

    Fid<fid_cntr> cntr;
    open_cntr(cntr);
    expect_complete_fid("cntr", &cntr->fid);
    expect_complete_table("cntr ops", cntr->ops);

    fi_eq_attr eq_attr{};
    Fid<fid_eq> eq;
    ASSERT_FI_OK(fi_eq_open(fabric, &eq_attr, eq.out(), nullptr));
    expect_complete_eq("eq", eq);

    fi_wait_attr wait_attr{};
    wait_attr.wait_obj = FI_WAIT_UNSPEC;
    Fid<fid_wait> wait;
    ASSERT_FI_OK(fi_wait_open(fabric, &wait_attr, wait.out()));
    expect_complete_fid("wait set", &wait->fid);
    expect_complete_table("wait set ops", wait->ops);

    fi_poll_attr poll_attr{};
    Fid<fid_poll> poll;
    ASSERT_FI_OK(fi_poll_open(domain, &poll_attr, poll.out()));
    expect_complete_fid("poll set", &poll->fid);
    expect_complete_table("poll set ops", poll->ops);

    fi_av_set_attr set_attr{};
    set_attr.count = 4;
    set_attr.start_addr = FI_ADDR_NOTAVAIL;
    set_attr.end_addr = FI_ADDR_NOTAVAIL;
    Fid<fid_av_set> set;
    ASSERT_FI_OK(fi_av_set(a().av, &set_attr, set.out(), nullptr));
    expect_complete_av_set("av set", set);

    static uint8_t region[64];
    Fid<fid_mr> mr;
    ASSERT_FI_OK(
        fi_mr_reg(domain, region, sizeof region, FI_SEND, 0, next_key_++, 0, mr.out(), nullptr));
    expect_complete_fid("mr", &mr->fid);
}

TEST_F(OpTables, RdmEndpointAndItsAlias) {
    expect_complete_ep("rdm endpoint", a().ep);
    expect_no_atomics("rdm endpoint", a().ep, a().peer[1]);
    expect_no_collectives("rdm endpoint", a().ep);

    fid_ep *alias = nullptr;
    ASSERT_FI_OK(fi_ep_alias(a().ep, &alias, FI_TRANSMIT | FI_INJECT_COMPLETE));
    Fid<fid_ep> alias_owner(alias);
    expect_complete_ep("alias", alias);
    expect_no_atomics("alias", alias, a().peer[1]);
    expect_no_collectives("alias", alias);

    fi_collective_attr coll_attr{};
    coll_attr.op = FI_SUM;
    coll_attr.datatype = FI_UINT64;
    EXPECT_EQ(fi_query_collective(domain, FI_ALLREDUCE, &coll_attr, 0), 0);
    EXPECT_EQ(coll_attr.datatype_attr.size, 8u);
    // The domain offers atomics to the endpoints that ask for them (2048 bytes of elements).
    fi_atomic_attr atomic_attr{};
    EXPECT_EQ(fi_query_atomic(domain, FI_UINT64, FI_SUM, &atomic_attr, 0), 0);
    EXPECT_EQ(atomic_attr.count, 256u);
    EXPECT_EQ(atomic_attr.size, 8u);
    // The reductions of collectives: what fi_allreduce accepts.
    EXPECT_EQ(fi_query_atomic(domain, FI_UINT64, FI_SUM, &atomic_attr, FI_COLLECTIVE), 0);
    EXPECT_EQ(fi_query_atomic(domain, FI_UINT64, FI_CSWAP, &atomic_attr, FI_COLLECTIVE),
              -FI_EOPNOTSUPP);
}

TEST_F(OpTables, SharedContexts) {
    fi_rx_attr rx_attr{};
    Fid<fid_ep> srx;
    ASSERT_FI_OK(fi_srx_context(domain, &rx_attr, srx.out(), nullptr));
    expect_complete_ep("srx", srx);
    expect_no_atomics("srx", srx, 0);
    expect_no_collectives("srx", srx);
    // A receive context sends nothing and has no address.
    uint8_t byte = 0;
    EXPECT_LT(fi_send(srx, &byte, 1, nullptr, 0, nullptr), 0);
    EXPECT_LT(fi_write(srx, &byte, 1, nullptr, 0, 0, 0, nullptr), 0);
    size_t len = 1;
    EXPECT_LT(fi_getname(&srx->fid, &byte, &len), 0);

    fi_tx_attr tx_attr{};
    Fid<fid_stx> stx;
    ASSERT_FI_OK(fi_stx_context(domain, &tx_attr, stx.out(), nullptr));
    expect_complete_fid("stx", &stx->fid);
    expect_complete_table("stx ops", stx->ops);
}

class MsgOpTables : public FabricTest {
    void configure(FabricOptions &o) override {
        o.ep_type = FI_EP_MSG;
        o.caps = FI_MSG | FI_RMA;
        o.num_eps = 0;
    }
};

TEST_F(MsgOpTables, MsgAndPassiveEndpoints) {
    Fid<fid_ep> ep;
    ASSERT_FI_OK(fi_endpoint(domain, info.get(), ep.out(), nullptr));
    expect_complete_ep("msg endpoint", ep);
    expect_no_atomics("msg endpoint", ep, 0);
    expect_no_collectives("msg endpoint", ep);

    Fid<fid_pep> pep;
    ASSERT_FI_OK(fi_passive_ep(fabric, info.get(), pep.out(), nullptr));
    expect_complete_fid("pep", &pep->fid);
    expect_complete_table("pep ops", pep->ops);
    expect_complete_table("pep cm", pep->cm);
}

}  // namespace
}  // namespace tandem_test

// Invalid use of the API: every case must fail cleanly (negative return or error completion),
// never succeed, crash or hang, and leave the objects usable.
#include "fabric_fixture.h"

namespace tandem_test {
namespace {

class BadInputTest : public FabricTest {
  protected:
    // Posts a send to `dest` and returns true when it failed (negative return or error
    // completion). Fails the test when it completed successfully or nothing happened.
    bool send_fails(fi_addr_t dest, void *c) {
        auto s = buf(64);
        ssize_t ret = post([&] { return fi_send(a().ep, s->data(), 64, s->desc, dest, c); });
        if (ret != 0) {
            EXPECT_LT(ret, 0);
            return true;
        }
        bool done = poll_until([&] { return a().log.has(c) || a().log.has_err(c); });
        EXPECT_TRUE(done) << "send to an invalid address neither failed nor completed";
        EXPECT_FALSE(a().log.has(c)) << "send to an invalid address completed successfully";
        return a().log.has_err(c);
    }
    // The pair still works after the failure.
    void check_still_works(uint32_t seed) { exchange_checked(seed); }

    // An endpoint from the fixture's info, not bound to anything yet.
    void raw_endpoint(Fid<fid_ep> &ep) {
        ASSERT_FI_OK(fi_endpoint(domain, info.get(), ep.out(), nullptr));
    }
};

TEST_F(BadInputTest, SendToNeverInsertedAddressFails) {
    EXPECT_TRUE(send_fails(4242, ctx(0)));
    ASSERT_NO_FATAL_FAILURE(check_still_works(500));
}

TEST_F(BadInputTest, SendToAddrNotAvailFails) {
    EXPECT_TRUE(send_fails(FI_ADDR_NOTAVAIL, ctx(0)));
    ASSERT_NO_FATAL_FAILURE(check_still_works(501));
}

TEST_F(BadInputTest, SendToRemovedAddressFails) {
    // Talk once so that any connection exists, then remove the peer and use its old fi_addr.
    ASSERT_NO_FATAL_FAILURE(check_still_works(502));
    const fi_addr_t old = a().peer[1];
    ASSERT_FI_OK(fi_av_remove(a().av, &a().peer[1], 1, 0));
    EXPECT_TRUE(send_fails(old, ctx(0)));
    fi_addr_t again = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(a().av, b().name.data(), 1, &again, 0, nullptr), 1);
    a().peer[1] = again;
    ASSERT_NO_FATAL_FAILURE(check_still_works(503));
}

TEST_F(BadInputTest, TaggedSendToUnknownAddressFails) {
    auto s = buf(64);
    ssize_t ret = post([&] { return fi_tsend(a().ep, s->data(), 64, s->desc, 777, 1, ctx(0)); });
    if (ret == 0) {
        ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(0)) || a().log.has_err(ctx(0)); }));
        EXPECT_TRUE(a().log.has_err(ctx(0))) << a().log.summary();
    } else {
        EXPECT_LT(ret, 0);
    }
}

TEST_F(BadInputTest, InjectLargerThanInjectSizeFails) {
    const size_t len = info->tx_attr->inject_size + 1;
    std::vector<uint8_t> s(len);
    EXPECT_LT(fi_inject(a().ep, s.data(), len, a().peer[1]), 0);
    EXPECT_LT(fi_tinject(a().ep, s.data(), len, a().peer[1], 9), 0);
    auto target = buf(len, 0, true);
    EXPECT_LT(fi_inject_write(a().ep, s.data(), len, a().peer[1], rma_addr(*target), target->key),
              0);
    poll_for(kQuiet);
    EXPECT_TRUE(b().log.comps.empty()) << b().log.summary();
    ASSERT_NO_FATAL_FAILURE(check_still_works(504));
}

TEST_F(BadInputTest, EnableWithoutCqFails) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_av(av));
    Fid<fid_ep> ep;  // declared last: closed first
    ASSERT_NO_FATAL_FAILURE(raw_endpoint(ep));
    ASSERT_FI_OK(fi_ep_bind(ep, &av->fid, 0));
    int ret = fi_enable(ep);
    EXPECT_LT(ret, 0) << "fi_enable without a CQ succeeded";
}

TEST_F(BadInputTest, EnableRdmWithoutAvFails) {
    Fid<fid_cq> cq;
    ASSERT_NO_FATAL_FAILURE(open_cq(cq, FI_CQ_FORMAT_TAGGED, FI_WAIT_NONE));
    Fid<fid_ep> ep;
    ASSERT_NO_FATAL_FAILURE(raw_endpoint(ep));
    ASSERT_FI_OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    int ret = fi_enable(ep);
    EXPECT_LT(ret, 0) << "fi_enable of an RDM endpoint without an AV succeeded";
}

TEST_F(BadInputTest, SendOnEndpointThatIsNotEnabledFails) {
    Fid<fid_cq> cq;
    ASSERT_NO_FATAL_FAILURE(open_cq(cq, FI_CQ_FORMAT_TAGGED, FI_WAIT_NONE));
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_av(av));
    Fid<fid_ep> ep;
    ASSERT_NO_FATAL_FAILURE(raw_endpoint(ep));
    ASSERT_FI_OK(fi_ep_bind(ep, &av->fid, 0));
    ASSERT_FI_OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    fi_addr_t dest;
    ASSERT_FI_RET(fi_av_insert(av, b().name.data(), 1, &dest, 0, nullptr), 1);
    auto s = buf(16);
    ssize_t ret = fi_send(ep, s->data(), 16, s->desc, dest, ctx(0));
    EXPECT_LT(ret, 0) << "send on a disabled endpoint was accepted";
    EXPECT_EQ(ret, -FI_EOPBADSTATE) << fi_err_str(ret);
    ret = fi_recv(ep, s->data(), 16, s->desc, FI_ADDR_UNSPEC, ctx(1));
    EXPECT_LT(ret, 0) << "receive on a disabled endpoint was accepted";
}

TEST_F(BadInputTest, ConnectOnRdmEndpointFails) {
    int ret = fi_connect(a().ep, b().name.data(), nullptr, 0);
    EXPECT_LT(ret, 0) << "fi_connect on an FI_EP_RDM endpoint succeeded";
    ASSERT_NO_FATAL_FAILURE(check_still_works(505));
}

TEST_F(BadInputTest, GetnameWithSmallBufferReportsSize) {
    uint8_t small[4];
    size_t len = sizeof(small);
    EXPECT_EQ(fi_getname(&a().ep->fid, small, &len), -FI_ETOOSMALL);
    EXPECT_EQ(len, sizeof(sockaddr_in));
}

TEST_F(BadInputTest, CqWithUnknownFormatIsRefused) {
    fi_cq_attr attr{};
    attr.format = static_cast<fi_cq_format>(99);
    Fid<fid_cq> cq;
    EXPECT_LT(fi_cq_open(domain, &attr, cq.out(), nullptr), 0);
}

TEST_F(BadInputTest, CqWithWaitSetButNoSetIsRefused) {
    fi_cq_attr attr{};
    attr.format = FI_CQ_FORMAT_CONTEXT;
    attr.wait_obj = FI_WAIT_SET;
    attr.wait_set = nullptr;
    Fid<fid_cq> cq;
    EXPECT_LT(fi_cq_open(domain, &attr, cq.out(), nullptr), 0);
}

TEST_F(BadInputTest, AvWithUnknownTypeIsRefused) {
    fi_av_attr attr{};
    attr.type = static_cast<fi_av_type>(99);
    Fid<fid_av> av;
    EXPECT_LT(fi_av_open(domain, &attr, av.out(), nullptr), 0);
}

TEST_F(BadInputTest, CounterWithUnknownEventsIsRefused) {
    fi_cntr_attr attr{};
    attr.events = static_cast<fi_cntr_events>(99);
    Fid<fid_cntr> c;
    EXPECT_LT(fi_cntr_open(domain, &attr, c.out(), nullptr), 0);
}

TEST_F(BadInputTest, AvInsertOfWrongFamilyFails) {
    sockaddr_in6 sin6{};
    sin6.sin6_family = AF_INET6;
    sin6.sin6_port = htons(1234);
    sin6.sin6_addr = in6addr_loopback;
    fi_addr_t out = 0;
    // The return value counts successful insertions; the failed slot becomes FI_ADDR_NOTAVAIL.
    EXPECT_LT(fi_av_insert(a().av, &sin6, 1, &out, 0, nullptr), 1);
    EXPECT_EQ(out, FI_ADDR_NOTAVAIL);
}

TEST_F(BadInputTest, DomainWithOpenObjectsIsBusy) {
    int ret = fi_close(&domain->fid);
    EXPECT_EQ(ret, -FI_EBUSY) << fi_err_str(ret);
    if (ret == 0) {
        domain.release();
        eps.clear();  // they are dangling now; the test has already failed
    }
}

TEST_F(BadInputTest, FabricWithOpenDomainIsBusy) {
    int ret = fi_close(&fabric->fid);
    EXPECT_EQ(ret, -FI_EBUSY) << fi_err_str(ret);
    if (ret == 0) fabric.release();
}

TEST_F(BadInputTest, CancelOfUnknownContextPostsNothing) {
    int dummy = 0;
    int ret = fi_cancel(&a().ep->fid, &dummy);
    EXPECT_LE(ret, 0);
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.comps.empty() && a().log.errs.empty()) << a().log.summary();
    ASSERT_NO_FATAL_FAILURE(check_still_works(506));
}

}  // namespace
}  // namespace tandem_test

// Peer transfers (fi_peer(3), FI_PEER_TRANSFER): the offload twins of two endpoints that talk
// over a link introduce themselves to each other with their own messages, posted on tandem's
// endpoints. Their traffic must never reach the application: a wildcard receive posted by the
// application gets the application's message only, and no twin completion lands on its CQ.
#include "peer/peer_abi.h"
#include "tests/common/rdm_endpoint.h"

#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// Peers in one process would otherwise go through the node-local path, which needs no
// introduction: this test is about the network path. Read when the provider loads.
const int g_env = setenv("FI_TANDEM_LOCAL", "0", 1);

// The endpoint and the diagnostics tandem reports about its offload twin.
struct Rdm : tandem_test::RdmEndpoint {
    tandem::peer::EpDiagOps *diag = nullptr;

    void open(uint64_t caps = FI_MSG | FI_TAGGED) {
        ASSERT_NO_FATAL_FAILURE(RdmEndpoint::open(caps));
        void *ops = nullptr;
        ASSERT_EQ(fi_open_ops(&ep->fid, tandem::peer::kEpDiagOpsName, 0, &ops, nullptr), 0);
        diag = static_cast<tandem::peer::EpDiagOps *>(ops);
    }
};

TEST(PeerTransfer, TwinsIntroduceThemselvesAndStayOutOfTheApplicationsWay) {
    ASSERT_EQ(g_env, 0);
    Rdm a, b;
    ASSERT_NO_FATAL_FAILURE(a.open());
    ASSERT_NO_FATAL_FAILURE(b.open());
    fi_addr_t b_at_a = a.insert(b), a_at_b = b.insert(a);

    // The application's wildcard receives: any tag, any source.
    char inbox_b[64] = {}, inbox_a[64] = {};
    ASSERT_EQ(fi_trecv(b.ep, inbox_b, sizeof inbox_b, nullptr, FI_ADDR_UNSPEC, 0, ~0ull, inbox_b),
              0);
    ASSERT_EQ(fi_trecv(a.ep, inbox_a, sizeof inbox_a, nullptr, FI_ADDR_UNSPEC, 0, ~0ull, inbox_a),
              0);
    const char hello_b[] = "application to b", hello_a[] = "application to a";
    ASSERT_EQ(fi_tsend(a.ep, hello_b, sizeof hello_b, nullptr, b_at_a, 0x1, (void *)hello_b), 0);
    ASSERT_EQ(fi_tsend(b.ep, hello_a, sizeof hello_a, nullptr, a_at_b, 0x2, (void *)hello_a), 0);

    int sends = 0, recvs = 0;
    uint64_t caps_of_a = 0, caps_of_b = 0;
    bool a_knows = false, b_knows = false;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline &&
           !(a_knows && b_knows && sends == 2 && recvs == 2)) {
        for (Rdm *r : {&a, &b}) {
            fi_cq_tagged_entry e{};
            ssize_t n = fi_cq_read(r->cq, &e, 1);
            if (n == -FI_EAGAIN) continue;
            ASSERT_EQ(n, 1) << "error completion on the application's CQ";
            if (e.flags & FI_SEND) {
                EXPECT_TRUE(e.op_context == hello_a || e.op_context == hello_b);
                ++sends;
            } else {
                // Only the application's own message, never a twin's hello.
                ASSERT_TRUE(e.flags & FI_RECV);
                if (r == &b) {
                    EXPECT_EQ(e.op_context, inbox_b);
                    EXPECT_EQ(e.tag, 0x1u);
                    EXPECT_EQ(e.len, sizeof hello_b);
                    EXPECT_STREQ(inbox_b, hello_b);
                } else {
                    EXPECT_EQ(e.op_context, inbox_a);
                    EXPECT_EQ(e.tag, 0x2u);
                    EXPECT_STREQ(inbox_a, hello_a);
                }
                ++recvs;
            }
        }
        b_knows = b.diag->remote_twin(b.ep, a_at_b, &caps_of_a) == 1;
        a_knows = a.diag->remote_twin(a.ep, b_at_a, &caps_of_b) == 1;
    }
    EXPECT_EQ(sends, 2);
    EXPECT_EQ(recvs, 2);
    EXPECT_TRUE(b_knows) << "b's twin never heard from a's";
    EXPECT_TRUE(a_knows) << "a's twin never heard from b's";
    EXPECT_TRUE(caps_of_a & 1u);  // kTwinNodeLocal
    EXPECT_TRUE(caps_of_b & 1u);
    // Nothing more for the application: the twins' completions went to the twins.
    for (int i = 0; i < 1000; ++i)
        for (Rdm *r : {&a, &b}) {
            fi_cq_tagged_entry e{};
            ASSERT_EQ(fi_cq_read(r->cq, &e, 1), -FI_EAGAIN);
        }
    // An unknown peer has no twin on record.
    EXPECT_EQ(a.diag->remote_twin(a.ep, 12345, nullptr), 0);
    a.close();
    b.close();
}

// The twins' introductions are tagged messages of tandem's own: they flow on endpoints whose
// application asked for FI_MSG alone too (fi_pingpong's), where tandem used to refuse the
// twin's tagged receive as a capability the application had not requested.
TEST(PeerTransfer, TwinsIntroduceThemselvesOnEndpointsWithoutTaggedCaps) {
    ASSERT_EQ(g_env, 0);
    Rdm a, b;
    ASSERT_NO_FATAL_FAILURE(a.open(FI_MSG));
    ASSERT_NO_FATAL_FAILURE(b.open(FI_MSG));
    fi_addr_t b_at_a = a.insert(b), a_at_b = b.insert(a);
    // Each owner reaches the other over the link, so each twin introduces itself.
    char inbox[64] = {}, inbox_a[64] = {};
    ASSERT_EQ(fi_recv(b.ep, inbox, sizeof inbox, nullptr, FI_ADDR_UNSPEC, inbox), 0);
    ASSERT_EQ(fi_recv(a.ep, inbox_a, sizeof inbox_a, nullptr, FI_ADDR_UNSPEC, inbox_a), 0);
    const char hello[] = "application to b", hello_a[] = "application to a";
    ASSERT_EQ(fi_send(a.ep, hello, sizeof hello, nullptr, b_at_a, (void *)hello), 0);
    ASSERT_EQ(fi_send(b.ep, hello_a, sizeof hello_a, nullptr, a_at_b, (void *)hello_a), 0);
    int completions = 0;
    bool a_knows = false, b_knows = false;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline && !(a_knows && b_knows)) {
        for (Rdm *r : {&a, &b}) {
            fi_cq_tagged_entry e{};
            ssize_t n = fi_cq_read(r->cq, &e, 1);
            if (n == -FI_EAGAIN) continue;
            ASSERT_EQ(n, 1) << "error completion on the application's CQ";
            ++completions;
        }
        b_knows = b.diag->remote_twin(b.ep, a_at_b, nullptr) == 1;
        a_knows = a.diag->remote_twin(a.ep, b_at_a, nullptr) == 1;
    }
    EXPECT_TRUE(b_knows) << "b's twin never heard from a's";
    EXPECT_TRUE(a_knows) << "a's twin never heard from b's";
    EXPECT_STREQ(inbox, hello);
    EXPECT_STREQ(inbox_a, hello_a);
    a.close();
    b.close();
}

}  // namespace

// Back-pressure on the node-local path: a receiver that does not poll fills its inbox ring,
// and then the sender's fi_send / fi_tsend / fi_inject answer -FI_EAGAIN (tandem advertises
// FI_RM_ENABLED) instead of queueing without bound. Once the receiver drains, every message
// the sender was told went arrives, once, in order, intact.
//
// Small rings (16 cells) and no cross-memory attach, so that a 64 KiB message travels as a
// stream of cells: both read when the provider loads.
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
#include <ostream>
#include <string>
#include <vector>

namespace {

constexpr size_t kRingCells = 16;
const int g_env = setenv("FI_OFF_TANDEM_RING_CELLS", "16", 1) |
                  setenv("FI_OFF_TANDEM_CMA", "0", 1) | setenv("FI_TANDEM_LOCAL", "1", 1);

using Clock = std::chrono::steady_clock;

using Rdm = tandem_test::RdmEndpoint;

enum class Call { Send, Tsend, Inject, LargeSend };
const char *name_of(Call c) {
    switch (c) {
        case Call::Send:
            return "fi_send";
        case Call::Tsend:
            return "fi_tsend";
        case Call::Inject:
            return "fi_inject";
        case Call::LargeSend:
            return "fi_send_64KiB";
    }
    return "?";
}

void PrintTo(Call c, std::ostream *os) {
    *os << name_of(c);
}

class LocalBackpressure : public ::testing::TestWithParam<Call> {
  protected:
    void SetUp() override {
        ASSERT_EQ(g_env, 0);
        ASSERT_NO_FATAL_FAILURE(sender.open());
        ASSERT_NO_FATAL_FAILURE(receiver.open());
        dest = sender.insert(receiver);
    }
    void TearDown() override {
        sender.close();
        receiver.close();
    }
    Rdm sender, receiver;
    fi_addr_t dest = FI_ADDR_NOTAVAIL;
};

TEST_P(LocalBackpressure, FullRingGivesEagainAndEverythingArrivesAfterTheDrain) {
    const Call call = GetParam();
    const size_t len = call == Call::LargeSend ? 64 * 1024 : 8;
    // Messages the sender may have posted before its first -FI_EAGAIN: what its ring holds
    // (cells of len bytes), and in no case more than a whole transmit queue of operations.
    const size_t cells_per_message = (len + 8000) / 8000;
    const size_t ring_bound = kRingCells / cells_per_message + 1;
    const size_t give_up = sender.info->tx_attr->size + 4 * kRingCells;
    ASSERT_LT(ring_bound, give_up);
    std::vector<std::vector<uint64_t>> payloads;
    auto payload_of = [&](size_t i) {
        std::vector<uint64_t> words(len / sizeof(uint64_t));
        for (size_t w = 0; w < words.size(); ++w) words[w] = i * 1000003 + w;
        return words;
    };
    payloads.reserve(give_up);
    auto post = [&](size_t i) -> ssize_t {
        if (payloads.size() <= i) payloads.push_back(payload_of(i));
        void *buf = payloads[i].data();
        void *ctx = &payloads[i];
        switch (call) {
            case Call::Send:
            case Call::LargeSend:
                return fi_send(sender.ep, buf, len, nullptr, dest, ctx);
            case Call::Tsend:
                return fi_tsend(sender.ep, buf, len, nullptr, dest, 0x77, ctx);
            case Call::Inject:
                return fi_inject(sender.ep, buf, len, dest);
        }
        return -FI_EINVAL;
    };

    // The receiver does not poll: post until the sender is refused.
    std::vector<void *> sent;
    size_t send_errors = 0;
    size_t posted = 0;
    ssize_t ret = 0;
    while (posted < give_up) {
        ret = post(posted);
        if (ret == -FI_EAGAIN) break;
        ASSERT_EQ(ret, 0) << name_of(call) << " #" << posted;
        ++posted;
        sender.poll(sent, send_errors);
    }
    ASSERT_EQ(ret, -FI_EAGAIN) << name_of(call) << " posted " << posted
                               << " messages to a receiver that does not poll, never refused";
    EXPECT_LE(posted, ring_bound) << "more messages accepted than the receiver's ring holds";
    // Refused it stays, however often the sender tries and progresses: nothing piles up.
    for (int i = 0; i < 1000; ++i) {
        sender.poll(sent, send_errors);
        ASSERT_EQ(post(posted), -FI_EAGAIN) << "attempt " << i << " after the first refusal";
    }

    // The receiver drains: everything accepted arrives once, in order, intact.
    std::vector<std::vector<uint64_t>> inbox(posted, std::vector<uint64_t>(len / 8 + 1, 0));
    for (size_t i = 0; i < posted; ++i) {
        void *buf = inbox[i].data();
        ssize_t r = call == Call::Tsend
                        ? fi_trecv(receiver.ep, buf, len + 8, nullptr, FI_ADDR_UNSPEC, 0x77, 0, buf)
                        : fi_recv(receiver.ep, buf, len + 8, nullptr, FI_ADDR_UNSPEC, buf);
        ASSERT_EQ(r, 0);
    }
    std::vector<void *> received;
    size_t recv_errors = 0;
    const size_t sends_reported = call == Call::Inject ? 0 : posted;
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while ((received.size() < posted || sent.size() < sends_reported) && Clock::now() < deadline) {
        receiver.poll(received, recv_errors);
        sender.poll(sent, send_errors);
    }
    EXPECT_EQ(send_errors + recv_errors, 0u);
    ASSERT_EQ(received.size(), posted);
    for (size_t i = 0; i < posted; ++i) {
        ASSERT_EQ(received[i], inbox[i].data()) << "receive " << i << " out of order";
        std::vector<uint64_t> want = payload_of(i);
        EXPECT_EQ(std::memcmp(inbox[i].data(), want.data(), len), 0) << "message " << i;
    }
    ASSERT_EQ(sent.size(), sends_reported);
    for (size_t i = 0; i < sends_reported; ++i) EXPECT_EQ(sent[i], &payloads[i]);
    // And the path is open again.
    ASSERT_EQ(post(posted), 0);
}

INSTANTIATE_TEST_SUITE_P(Calls, LocalBackpressure,
                         ::testing::Values(Call::Send, Call::Tsend, Call::Inject, Call::LargeSend),
                         [](const auto &info) { return std::string(name_of(info.param)); });

}  // namespace

// The link contract: what the protocol relies on from any link (link.h), checked on the TCP
// link (sendmsg and splice) and on the verbs link (over the RDMA device tests/common/
// verbs_device.h finds: a real one, or the emulated device of tests/emurdma). Written against
// LinkDomain / LinkTransport / LinkConnection only. Where links differ by design, the test
// asks LinkCaps and asserts the one outcome that link promises.
#include "main_prov/link/tcp_link.h"
#include "tests/common/verbs_device.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/fabric.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

using namespace tandem;

namespace {

// One registered region with one key, checked the way an RNIC checks an rkey (for links that
// ask the resolver: TCP).
class OneRegion : public RemoteKeyResolver {
  public:
    std::vector<uint8_t> mem = std::vector<uint8_t>(1 << 16);
    uint64_t key = 0x77;
    uint64_t access = FI_REMOTE_READ | FI_REMOTE_WRITE;
    int writes_done = 0, reads_done = 0;

    bool resolve(uint64_t k, uint64_t addr, size_t len, uint64_t acc,
                 LocalPieces &out) noexcept override {
        if (k != key || !(access & acc)) return false;
        if (addr > mem.size() || len > mem.size() - addr) return false;
        // Two pieces when the range crosses the middle: exercises scattered regions.
        size_t half = mem.size() / 2;
        out.count = 0;
        if (addr < half && addr + len > half) {
            out.iov[out.count++] = {mem.data() + addr, half - addr};
            out.iov[out.count++] = {mem.data() + half, addr + len - half};
        } else {
            out.iov[out.count++] = {mem.data() + addr, len};
        }
        return true;
    }
    void remote_access_done(uint64_t, uint64_t acc) noexcept override {
        (acc == FI_REMOTE_WRITE ? writes_done : reads_done)++;
    }
};

struct Side {
    OneRegion region;
    std::shared_ptr<LinkDomain> domain;
    std::unique_ptr<LinkRegion> registered;  // the link's own key for region.mem, if it has keys
    std::unique_ptr<LinkTransport> transport;
    std::deque<WorkCompletion> wcs;
    std::deque<CmEvent> events;
    std::vector<std::vector<uint8_t>> rx_buffers;

    // The key peers name region.mem by: the link's (verbs rkey) or the resolver's; and the
    // address of its byte `offset`: a virtual address under the link's key, else the offset.
    uint64_t key() const { return registered ? registered->key : region.key; }
    uint64_t at(uint64_t offset) const {
        return registered ? reinterpret_cast<uint64_t>(region.mem.data()) + offset : offset;
    }
    // (Again) after region.mem or region.access changed.
    void expose() {
        registered.reset();
        ASSERT_EQ(domain->register_region({region.mem.data(), region.mem.size()}, hmem::kHost,
                                          region.access, registered),
                  0);
    }
    void pump() {
        WorkCompletion wc[16];
        int n = transport->poll(wc, 16);
        for (int i = 0; i < n; ++i) wcs.push_back(wc[i]);
        CmEvent ev;
        while (transport->poll_cm(ev)) events.push_back(std::move(ev));
    }
    void post_buffers(int count, size_t size) {
        for (int i = 0; i < count; ++i) {
            rx_buffers.emplace_back(size);
            transport->post_recv(rx_buffers.back().data(), size, 1000 + rx_buffers.size() - 1);
        }
    }
};

// The variants: TCP (inline copies up to 64 bytes, sendmsg or splice above), and verbs on
// the device of this host.
struct Variant {
    std::shared_ptr<LinkDomain> domain;
    TcpLinkConfig tcp;
    std::unique_ptr<LinkTransport> transport(RemoteKeyResolver *resolver) const {
        if (domain->kind() == std::string("tcp"))
            return std::make_unique<TcpTransport>(resolver, tcp);
        return domain->transport(resolver, 4096);
    }
};

Variant make_variant(const std::string &kind, TcpLinkConfig cfg, std::string *why) {
    Variant v;
    if (kind == "tcp" || kind == "tcp_splice") {
        cfg.max_send_size = 4096;
        cfg.max_inline = 64;
        // Every payload above the inline size by vmsplice + splice instead of sendmsg.
        if (kind == "tcp_splice") cfg.splice_min = 65;
        v.tcp = cfg;
        v.domain = std::make_shared<TcpLinkDomain>(cfg);
        return v;
    }
    static test::VerbsTestDevice dev = test::open_test_verbs_device();
    static bool said = false;
    if (!dev.device) {
        *why = dev.why;
        return v;
    }
    if (!said) printf("[ verbs link on %s ]\n", dev.label.c_str());
    said = true;
    v.domain = dev.device;
    return v;
}

class LinkContract : public ::testing::TestWithParam<std::string> {
  protected:
    Side a, b;
    LinkConnection *ab = nullptr;  // a's end
    LinkConnection *ba = nullptr;  // b's end

    void SetUp() override { start(); }

    void start(const TcpLinkConfig &cfg = {}) {
        std::string why;
        Variant v = make_variant(GetParam(), cfg, &why);
        if (!v.domain) GTEST_SKIP() << "link " << GetParam() << " is not available here: " << why;
        a.domain = b.domain = v.domain;
        a.transport = v.transport(&a.region);
        b.transport = v.transport(&b.region);
        a.expose();
        b.expose();
        sockaddr_in sin{};
        sin.sin_family = AF_INET;
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ASSERT_EQ(b.transport->listen(reinterpret_cast<sockaddr *>(&sin), sizeof sin, 8), 0);
    }
    const LinkCaps &caps() const { return a.domain->caps(); }

    bool pump_until(const std::function<bool()> &done, int ms = 5000) {
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        while (std::chrono::steady_clock::now() < end) {
            a.pump();
            b.pump();
            if (done()) return true;
        }
        return false;
    }

    void connect(const std::string &priv = "hello", const std::string &answer = "welcome") {
        sockaddr_storage name = b.transport->name();
        ab = a.transport->connect(reinterpret_cast<sockaddr *>(&name), sizeof(sockaddr_in),
                                  priv.data(), priv.size());
        ASSERT_NE(ab, nullptr);
        ASSERT_TRUE(pump_until([&] { return !b.events.empty(); }));
        CmEvent req = std::move(b.events.front());
        b.events.pop_front();
        ASSERT_EQ(req.type, CmEventType::ConnectRequest);
        EXPECT_EQ(std::string(req.private_data.begin(), req.private_data.end()), priv);
        ba = req.conn;
        ASSERT_EQ(ba->accept(answer.data(), answer.size()), 0);
        ASSERT_TRUE(pump_until([&] { return !a.events.empty() && !b.events.empty(); }));
        EXPECT_EQ(b.events.front().type, CmEventType::Established);
        EXPECT_EQ(a.events.front().type, CmEventType::Established);
        EXPECT_EQ(
            std::string(a.events.front().private_data.begin(), a.events.front().private_data.end()),
            answer);
        a.events.clear();
        b.events.clear();
        EXPECT_TRUE(ab->established());
        EXPECT_TRUE(ba->established());
    }
};

TEST_P(LinkContract, ConnectCarriesPrivateDataBothWays) {
    connect("request-data", "reply");
}

TEST_P(LinkContract, RejectCarriesPrivateData) {
    sockaddr_storage name = b.transport->name();
    a.transport->connect(reinterpret_cast<sockaddr *>(&name), sizeof(sockaddr_in), "x", 1);
    ASSERT_TRUE(pump_until([&] { return !b.events.empty(); }));
    ASSERT_EQ(b.events.front().conn->reject("no thanks", 9), 0);
    ASSERT_TRUE(pump_until([&] { return !a.events.empty(); }));
    EXPECT_EQ(a.events.front().type, CmEventType::Rejected);
    EXPECT_EQ(
        std::string(a.events.front().private_data.begin(), a.events.front().private_data.end()),
        "no thanks");
}

// A rejected request names no connection of the application's (it never destroys it): the
// link lets it go once the requester has the answer and closes.
TEST_P(LinkContract, ARejectedConnectionIsLetGoOnceTheRequesterCloses) {
    sockaddr_storage name = b.transport->name();
    LinkConnection *req =
        a.transport->connect(reinterpret_cast<sockaddr *>(&name), sizeof(sockaddr_in), "x", 1);
    ASSERT_NE(req, nullptr);
    ASSERT_TRUE(pump_until([&] { return !b.events.empty(); }));
    ASSERT_EQ(b.events.front().type, CmEventType::ConnectRequest);
    ASSERT_FALSE(b.transport->idle());
    ASSERT_EQ(b.events.front().conn->reject(nullptr, 0), 0);
    b.events.clear();
    ASSERT_TRUE(pump_until([&] { return !a.events.empty(); }));
    ASSERT_EQ(a.events.front().type, CmEventType::Rejected);
    a.transport->destroy(req);
    EXPECT_TRUE(pump_until([&] { return b.transport->idle(); }));
    EXPECT_TRUE(b.events.empty());
}

TEST_P(LinkContract, ConnectToNobodyIsUnreachable) {
    sockaddr_storage name = b.transport->name();
    b.transport.reset();  // nobody listens there any more
    a.transport->connect(reinterpret_cast<sockaddr *>(&name), sizeof(sockaddr_in), "x", 1);
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (a.events.empty() && std::chrono::steady_clock::now() < end) a.pump();
    ASSERT_FALSE(a.events.empty());
    EXPECT_EQ(a.events.front().type, CmEventType::Unreachable);
}

TEST_P(LinkContract, SendLandsInAPostedBufferAndCompletesAfterThePeerHasIt) {
    connect();
    b.post_buffers(1, 4096);
    const char msg[] = "sixteen bytes!!";
    iovec iov{const_cast<char *>(msg), sizeof msg};
    uint32_t imm = 0xabcd;
    ASSERT_EQ(ab->post_send(&iov, 1, &imm, 1), 0);
    ASSERT_TRUE(pump_until([&] { return !b.wcs.empty() && !a.wcs.empty(); }));
    const WorkCompletion &r = b.wcs.front();
    EXPECT_EQ(r.opcode, WcOpcode::Recv);
    EXPECT_EQ(r.status, WcStatus::Success);
    EXPECT_EQ(r.wr_id, 1000u);
    EXPECT_EQ(r.byte_len, sizeof msg);
    EXPECT_TRUE(r.has_imm);
    EXPECT_EQ(r.imm, 0xabcdu);
    EXPECT_EQ(memcmp(b.rx_buffers[0].data(), msg, sizeof msg), 0);
    EXPECT_EQ(a.wcs.front().opcode, WcOpcode::Send);
    EXPECT_EQ(a.wcs.front().wr_id, 1u);
    EXPECT_EQ(a.wcs.front().status, WcStatus::Success);
}

TEST_P(LinkContract, ASendWithoutAPostedBufferWaitsForOne) {
    connect();
    char msg[100];
    memset(msg, 'r', sizeof msg);
    iovec iov{msg, sizeof msg};
    ASSERT_EQ(ab->post_send(&iov, 1, nullptr, 5), 0);
    pump_until([] { return false; }, 100);
    EXPECT_TRUE(b.wcs.empty());  // receiver not ready: nothing delivered
    EXPECT_TRUE(a.wcs.empty());  // and nothing acknowledged
    b.post_buffers(1, 4096);
    ASSERT_TRUE(pump_until([&] { return !b.wcs.empty() && !a.wcs.empty(); }));
    EXPECT_EQ(b.wcs.front().byte_len, sizeof msg);
}

TEST_P(LinkContract, OversizedSendIsRefusedAtPost) {
    connect();
    std::vector<char> big(b.transport->caps().max_send_size + 1);
    iovec iov{big.data(), big.size()};
    EXPECT_EQ(ab->post_send(&iov, 1, nullptr, 1), -FI_EMSGSIZE);
}

TEST_P(LinkContract, WriteAndReadMoveDataUnderAKey) {
    connect();
    std::vector<uint8_t> src(10000);
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 7);
    iovec wiov{src.data(), src.size()};
    ASSERT_EQ(ab->post_write(&wiov, nullptr, 1, {b.at(100), b.key()}, nullptr, 2), 0);
    std::vector<uint8_t> back(src.size());
    iovec riov{back.data(), back.size()};
    ASSERT_EQ(ab->post_read(&riov, nullptr, 1, {b.at(100), b.key()}, 3), 0);
    ASSERT_TRUE(pump_until([&] { return a.wcs.size() == 2; }));
    EXPECT_EQ(a.wcs[0].opcode, WcOpcode::Write);
    EXPECT_EQ(a.wcs[0].status, WcStatus::Success);
    EXPECT_EQ(a.wcs[1].opcode, WcOpcode::Read);
    EXPECT_EQ(a.wcs[1].status, WcStatus::Success);
    EXPECT_EQ(memcmp(b.region.mem.data() + 100, src.data(), src.size()), 0);
    EXPECT_EQ(back, src);
    // Only a link whose target sees remote accesses counts them (FI_RMA_EVENT).
    int events = caps().remote_access_events ? 1 : 0;
    EXPECT_EQ(b.region.writes_done, events);
    EXPECT_EQ(b.region.reads_done, events);
}

TEST_P(LinkContract, BadKeysAndRangesFailAtTheInitiatorAndWriteNothing) {
    connect();
    std::vector<uint8_t> src(64, 0xee);
    iovec iov{src.data(), src.size()};
    ASSERT_EQ(ab->post_write(&iov, nullptr, 1, {b.at(0), b.key() + 1}, nullptr, 1), 0);  // bad key
    ASSERT_EQ(
        ab->post_write(&iov, nullptr, 1, {b.at(b.region.mem.size() - 10), b.key()}, nullptr, 2), 0);
    std::vector<uint8_t> dst(64);
    iovec riov{dst.data(), dst.size()};
    ASSERT_EQ(ab->post_read(&riov, nullptr, 1, {0, 999}, 3), 0);  // bad key
    ASSERT_TRUE(pump_until([&] { return a.wcs.size() == 3; }));
    for (uint8_t v : b.region.mem) ASSERT_EQ(v, 0);
    EXPECT_EQ(b.region.writes_done, 0);
    if (caps().access_error_ends_connection) {
        // RC: the first refusal moves the queue pair to the error state; what follows is
        // flushed and the connection is over.
        EXPECT_EQ(a.wcs[0].status, WcStatus::RemoteAccessError);
        EXPECT_EQ(a.wcs[1].status, WcStatus::Flushed);
        EXPECT_EQ(a.wcs[2].status, WcStatus::Flushed);
        ASSERT_TRUE(pump_until([&] { return !a.events.empty(); }));
        EXPECT_EQ(a.events.front().type, CmEventType::Disconnected);
        EXPECT_TRUE(ab->failed());
        EXPECT_EQ(ab->post_send(&iov, 1, nullptr, 4), -FI_ENOTCONN);
        return;
    }
    for (const auto &wc : a.wcs) EXPECT_EQ(wc.status, WcStatus::RemoteAccessError) << wc.wr_id;
    // The connection survives a refused access.
    b.post_buffers(1, 4096);
    ASSERT_EQ(ab->post_send(&iov, 1, nullptr, 4), 0);
    ASSERT_TRUE(pump_until([&] { return !b.wcs.empty(); }));
}

TEST_P(LinkContract, ReadOnlyRegionRefusesWrites) {
    connect();
    b.region.access = FI_REMOTE_READ;
    b.expose();
    std::vector<uint8_t> src(8, 1);
    iovec iov{src.data(), src.size()};
    ASSERT_EQ(ab->post_write(&iov, nullptr, 1, {b.at(0), b.key()}, nullptr, 1), 0);
    ASSERT_TRUE(pump_until([&] { return !a.wcs.empty(); }));
    EXPECT_EQ(a.wcs.front().status, WcStatus::RemoteAccessError);
}

TEST_P(LinkContract, CompletionsComeInPostingOrder) {
    connect();
    b.post_buffers(4, 4096);
    std::vector<uint8_t> data(3000, 5), back(3000);
    iovec iov{data.data(), data.size()}, riov{back.data(), back.size()};
    ASSERT_EQ(ab->post_send(&iov, 1, nullptr, 1), 0);
    ASSERT_EQ(ab->post_read(&riov, nullptr, 1, {b.at(0), b.key()}, 2), 0);
    ASSERT_EQ(ab->post_write(&iov, nullptr, 1, {b.at(0), b.key()}, nullptr, 3), 0);
    ASSERT_EQ(ab->post_send(&iov, 1, nullptr, 4), 0);
    ASSERT_TRUE(pump_until([&] { return a.wcs.size() == 4; }));
    for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(a.wcs[i].wr_id, i + 1);
}

TEST_P(LinkContract, LargeTransfersSurvivePartialSocketWrites) {
    connect();
    const size_t size = 8 << 20;
    std::vector<uint8_t> src(size);
    for (size_t i = 0; i < size; ++i) src[i] = uint8_t(i ^ (i >> 9));
    b.region.mem.assign(size, 0);
    b.expose();
    iovec iov{src.data(), src.size()};
    ASSERT_EQ(ab->post_write(&iov, nullptr, 1, {b.at(0), b.key()}, nullptr, 1), 0);
    ASSERT_TRUE(pump_until([&] { return !a.wcs.empty(); }, 20000));
    EXPECT_EQ(a.wcs.front().status, WcStatus::Success);
    EXPECT_TRUE(b.region.mem == src);
}

// The protocol reuses or frees a payload as soon as its work request completes: what the
// peer placed must be what the buffer held when it was posted, even where the link hands the
// pages themselves to the socket (splice).
TEST_P(LinkContract, APayloadIsFreeAgainOnceItsWorkRequestCompletes) {
    connect();
    const size_t size = 3 << 20;
    b.region.mem.assign(2 * size, 0);
    b.expose();
    std::vector<uint8_t> src(size), expect(2 * size, 0);
    for (size_t round = 0; round < 2; ++round) {
        for (size_t i = 0; i < size; ++i) src[i] = uint8_t(i * 13 + round * 101);
        std::copy(src.begin(), src.end(), expect.begin() + round * size);
        iovec iov{src.data(), src.size()};
        ASSERT_EQ(ab->post_write(&iov, nullptr, 1, {b.at(round * size), b.key()}, nullptr, round),
                  0);
        ASSERT_TRUE(pump_until([&] { return a.wcs.size() == round + 1; }, 20000));
        EXPECT_EQ(a.wcs.back().status, WcStatus::Success);
        std::fill(src.begin(), src.end(), 0xdd);  // the application writes its buffer again
    }
    // Let anything still in flight land before comparing.
    b.post_buffers(1, 4096);
    iovec small{src.data(), 16};
    ASSERT_EQ(ab->post_send(&small, 1, nullptr, 7), 0);
    ASSERT_TRUE(pump_until([&] { return !b.wcs.empty() && a.wcs.size() == 3; }));
    EXPECT_TRUE(b.region.mem == expect);
}

// Large payloads queued behind and between small frames keep their order and their bytes
// (a spliced payload leaves through a pipe while later headers wait their turn).
TEST_P(LinkContract, QueuedLargeAndSmallFramesKeepOrderAndBytes) {
    connect();
    const size_t big = 300 * 1024;
    b.region.mem.assign(4 * big, 0);
    b.expose();
    b.post_buffers(4, 4096);
    std::vector<std::vector<uint8_t>> payloads;
    for (int k = 0; k < 4; ++k) {
        payloads.emplace_back(big);
        for (size_t i = 0; i < big; ++i) payloads[k][i] = uint8_t(i + 31 * k);
    }
    std::vector<std::vector<uint8_t>> notes;  // each its own: a posted payload is the link's
    uint64_t id = 1;
    for (int k = 0; k < 4; ++k) {
        iovec w{payloads[k].data(), big};
        ASSERT_EQ(ab->post_write(&w, nullptr, 1, {b.at(k * big), b.key()}, nullptr, id++), 0);
        notes.emplace_back(100, uint8_t(k + 1));
        iovec s{notes.back().data(), notes.back().size()};
        ASSERT_EQ(ab->post_send(&s, 1, nullptr, id++), 0);
    }
    std::vector<uint8_t> back(2 * big);
    iovec r{back.data(), back.size()};
    ASSERT_EQ(ab->post_read(&r, nullptr, 1, {b.at(big), b.key()}, id++), 0);
    ASSERT_TRUE(pump_until([&] { return a.wcs.size() == 9 && b.wcs.size() == 4; }, 20000));
    for (uint64_t i = 0; i < 9; ++i) {
        EXPECT_EQ(a.wcs[i].wr_id, i + 1);
        EXPECT_EQ(a.wcs[i].status, WcStatus::Success);
    }
    for (int k = 0; k < 4; ++k) {
        EXPECT_EQ(memcmp(b.region.mem.data() + k * big, payloads[k].data(), big), 0) << k;
        EXPECT_EQ(b.rx_buffers[k][0], uint8_t(k + 1)) << "send " << k << " out of order";
    }
    EXPECT_EQ(memcmp(back.data(), payloads[1].data(), big), 0);
    EXPECT_EQ(memcmp(back.data() + big, payloads[2].data(), big), 0);
}

// A send taken at once (post_send_now) is the link's when the call returns: the caller may
// write its buffers again, and the work request completes like a posted one. A link that
// takes none (LinkCaps::max_send_now 0) answers -FI_EAGAIN and takes nothing.
TEST_P(LinkContract, ASendTakenNowLeavesTheBuffersFreeAndCompletesLikeAPostedOne) {
    connect();
    b.post_buffers(1, 4096);
    std::vector<uint8_t> head(24, 0x5a), body(200);
    for (size_t i = 0; i < body.size(); ++i) body[i] = uint8_t(i * 7 + 1);
    const std::vector<uint8_t> sent_body = body;
    iovec iov[2] = {{head.data(), head.size()}, {body.data(), body.size()}};
    if (caps().max_send_now == 0) {
        EXPECT_EQ(ab->post_send_now(iov, 2, 1), -FI_EAGAIN);
        pump_until([] { return false; }, 50);
        EXPECT_TRUE(a.wcs.empty()) << "a refused send completed";
        EXPECT_TRUE(b.wcs.empty()) << "a refused send arrived";
        return;
    }
    ASSERT_EQ(ab->post_send_now(iov, 2, 1), 0);
    std::fill(head.begin(), head.end(), 0xee);
    std::fill(body.begin(), body.end(), 0xee);
    ASSERT_TRUE(pump_until([&] { return !b.wcs.empty() && !a.wcs.empty(); }));
    ASSERT_EQ(b.wcs.front().status, WcStatus::Success);
    ASSERT_EQ(b.wcs.front().byte_len, 24u + 200u);
    const uint8_t *got = b.rx_buffers[0].data();
    EXPECT_EQ(std::count(got, got + 24, 0x5a), 24);
    EXPECT_EQ(memcmp(got + 24, sent_body.data(), sent_body.size()), 0);
    EXPECT_EQ(a.wcs.front().opcode, WcOpcode::Send);
    EXPECT_EQ(a.wcs.front().wr_id, 1u);
    EXPECT_EQ(a.wcs.front().status, WcStatus::Success);
}

// Work queued on the connection goes first: a send is not taken at once behind it (it would
// overtake it), and posted the ordinary way it completes after it.
TEST_P(LinkContract, ASendIsNotTakenNowBehindQueuedWork) {
    connect();
    const size_t big = 8 << 20;  // more than a socket takes in one call
    b.region.mem.assign(big, 0);
    b.expose();
    b.post_buffers(1, 4096);
    std::vector<uint8_t> src(big, 9);
    iovec w{src.data(), src.size()};
    ASSERT_EQ(ab->post_write(&w, nullptr, 1, {b.at(0), b.key()}, nullptr, 1), 0);
    char note[32] = "behind the write";
    iovec n{note, sizeof note};
    EXPECT_EQ(ab->post_send_now(&n, 1, 2), -FI_EAGAIN);
    ASSERT_EQ(ab->post_send(&n, 1, nullptr, 2), 0);
    ASSERT_TRUE(pump_until([&] { return a.wcs.size() == 2 && b.wcs.size() == 1; }, 20000));
    EXPECT_EQ(a.wcs[0].wr_id, 1u);
    EXPECT_EQ(a.wcs[1].wr_id, 2u);
    EXPECT_TRUE(b.region.mem == src);
    EXPECT_STREQ(reinterpret_cast<const char *>(b.rx_buffers[0].data()), note);
}

TEST_P(LinkContract, DisconnectFlushesOutstandingWorkAndTellsThePeer) {
    connect();
    // A send b has no buffer for stays outstanding (a read would not: an RNIC serves it
    // without b's help).
    char msg[64] = {};
    iovec iov{msg, sizeof msg};
    ASSERT_EQ(ab->post_send(&iov, 1, nullptr, 9), 0);
    pump_until([] { return false; }, 50);
    ASSERT_TRUE(a.wcs.empty());
    ba->disconnect();
    ASSERT_TRUE(pump_until([&] { return !a.events.empty() && !a.wcs.empty(); }));
    EXPECT_EQ(a.events.front().type, CmEventType::Disconnected);
    EXPECT_EQ(a.wcs.front().wr_id, 9u);
    EXPECT_EQ(a.wcs.front().status, WcStatus::Flushed);
    EXPECT_TRUE(ab->failed());
    EXPECT_EQ(ab->post_send(&iov, 1, nullptr, 10), -FI_ENOTCONN);
    EXPECT_TRUE(b.wcs.empty()) << "b got what it had no buffer for";
}

// The ownership rule the protocol builds on (link.h): a work request the link accepted
// completes exactly once, as Flushed when the connection fails, even while it is being
// posted; one the link refused never completes.
TEST_P(LinkContract, AWorkRequestAcceptedAsTheConnectionFailsCompletesOnce) {
    connect();
    // A message b never reads: b's end then goes away with it unread (TCP: a reset; verbs:
    // the peer's queue pair is gone), so a's next post meets a dead connection.
    char msg[100] = {};
    iovec iov{msg, sizeof msg};
    ASSERT_EQ(ab->post_send(&iov, 1, nullptr, 1), 0);
    b.transport.reset();
    // Wait, without progressing a, until the failure reached a's descriptors: the
    // connection's own socket, or the transport's channels.
    std::vector<tandem::WaitFd> fds;
    if (ab->wait_fd() >= 0)
        fds.push_back({ab->wait_fd(), false});
    else
        a.transport->wait_fds(fds);
    std::vector<pollfd> pfds;
    for (tandem::WaitFd fd : fds) pfds.push_back({fd.fd, POLLIN, 0});
    ASSERT_GT(::poll(pfds.data(), pfds.size(), 5000), 0) << "the failure never reached a";
    std::vector<uint8_t> src(64, 3);
    iovec wiov{src.data(), src.size()};
    ASSERT_EQ(ab->post_write(&wiov, nullptr, 1, {b.at(0), b.key()}, nullptr, 2), 0);
    // A socket's reset is met by the post itself; a queue pair's by the next poll.
    if (ab->wait_fd() < 0) a.pump();
    EXPECT_TRUE(ab->failed()) << "the failure was not noticed";
    EXPECT_EQ(ab->post_send(&iov, 1, nullptr, 3), -FI_ENOTCONN);
    // (b is gone: only a is pumped.)
    for (int i = 0; i < 4; ++i) a.pump();
    // The NIC's flushes may take a moment to come.
    for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
         ab->wait_fd() < 0 && a.wcs.size() < 2 && std::chrono::steady_clock::now() < end;)
        a.pump();
    ASSERT_EQ(a.wcs.size(), 2u);
    EXPECT_EQ(a.wcs[0].wr_id, 1u);
    EXPECT_EQ(a.wcs[1].wr_id, 2u);
    EXPECT_EQ(a.wcs[0].status, caps().peer_loss_times_out ? WcStatus::Timeout : WcStatus::Flushed);
    EXPECT_EQ(a.wcs[1].status, WcStatus::Flushed);
}

// What only the TCP link has: the settings of its sockets.
class TcpLinkSockets : public LinkContract {
  protected:
    void restart(const std::string &congestion) {
        TcpLinkConfig cfg;
        cfg.congestion = congestion;
        start(cfg);
        connect();
    }
    static std::string congestion_of(const LinkConnection *conn) {
        char name[32] = {};
        socklen_t len = sizeof name - 1;
        if (getsockopt(conn->wait_fd(), IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "?";
        return std::string(name, strnlen(name, len));
    }
    static std::string system_default() {
        std::ifstream f("/proc/sys/net/ipv4/tcp_congestion_control");
        std::string name;
        f >> name;
        return name;
    }
};

// Sends taken at once into a socket that fills up (small buffers, a peer that reads nothing
// yet): the one that finds it part full leaves part of its frame there and the rest waits in
// the queue, the next ones are refused. Every send taken arrives whole and in order once the
// peer reads, and completes once.
TEST_P(TcpLinkSockets, SendsTakenNowIntoAFillingSocketArriveWholeAndInOrder) {
    TcpLinkConfig cfg;
    cfg.socket_buffer = 4096;
    start(cfg);
    connect();
    std::vector<std::vector<uint8_t>> sent;
    std::vector<uint8_t> buf;
    for (uint64_t id = 1; id <= 10000; ++id) {
        buf.assign(1000 + 37 * (id % 50), 0);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t(i * 3 + id);
        iovec v{buf.data(), buf.size()};
        int ret = ab->post_send_now(&v, 1, id);
        if (ret == -FI_EAGAIN) break;
        ASSERT_EQ(ret, 0);
        sent.push_back(buf);
        std::fill(buf.begin(), buf.end(), 0xee);  // the caller's again
    }
    ASSERT_FALSE(sent.empty());
    ASSERT_LT(sent.size(), 10000u) << "the socket never filled";
    b.post_buffers(static_cast<int>(sent.size()), 4096);
    ASSERT_TRUE(pump_until(
        [&] { return a.wcs.size() == sent.size() && b.wcs.size() == sent.size(); }, 20000));
    for (size_t i = 0; i < sent.size(); ++i) {
        EXPECT_EQ(a.wcs[i].wr_id, i + 1);
        EXPECT_EQ(a.wcs[i].status, WcStatus::Success);
        const WorkCompletion &r = b.wcs[i];
        ASSERT_EQ(r.status, WcStatus::Success);
        ASSERT_EQ(r.byte_len, sent[i].size()) << "message " << i;
        EXPECT_EQ(memcmp(b.rx_buffers[r.wr_id - 1000].data(), sent[i].data(), sent[i].size()), 0)
            << "message " << i;
    }
}

TEST_P(TcpLinkSockets, AutoCongestionControlIsRenoBetweenSocketsOfThisHost) {
    restart("auto");
    EXPECT_EQ(congestion_of(ab), "reno");
    EXPECT_EQ(congestion_of(ba), "reno");
}

TEST_P(TcpLinkSockets, SystemCongestionControlKeepsTheKernelsDefault) {
    const std::string def = system_default();
    if (def.empty()) GTEST_SKIP() << "no /proc/sys/net/ipv4/tcp_congestion_control here";
    restart("system");
    EXPECT_EQ(congestion_of(ab), def);
    EXPECT_EQ(congestion_of(ba), def);
}

TEST_P(TcpLinkSockets, AnAlgorithmTheKernelLacksLeavesTheDefaultAndAWorkingLink) {
    const std::string def = system_default();
    if (def.empty()) GTEST_SKIP() << "no /proc/sys/net/ipv4/tcp_congestion_control here";
    restart("no-such-algorithm");
    EXPECT_EQ(congestion_of(ab), def);
    b.post_buffers(1, 4096);
    char msg[] = "still works";
    iovec iov{msg, sizeof msg};
    ASSERT_EQ(ab->post_send(&iov, 1, nullptr, 7), 0);
    ASSERT_TRUE(pump_until([&] { return !b.wcs.empty() && !a.wcs.empty(); }));
    EXPECT_EQ(b.wcs.front().status, WcStatus::Success);
    EXPECT_EQ(memcmp(b.rx_buffers[0].data(), msg, sizeof msg), 0);
}

INSTANTIATE_TEST_SUITE_P(Tcp, TcpLinkSockets, ::testing::Values(std::string("tcp")),
                         [](const auto &info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Links, LinkContract,
                         ::testing::Values(std::string("tcp"), std::string("tcp_splice"),
                                           std::string("verbs")),
                         [](const auto &info) { return info.param; });

}  // namespace

// A rogue peer: raw TCP connections to a tandem endpoint's listening address that send
// garbage, malformed, oversized or wrong-version frames, a valid handshake followed by
// writes and reads with guessed, stale or out-of-bounds keys, or a connection request
// trickled a byte at a time. Each time tandem closes that connection (or, for a refused
// RMA request on a connection that identified itself, answers exactly as it answers a
// legitimate peer's bad key: Nak / an error ReadResp), its registered memory is unchanged,
// and its endpoints keep talking to each other.
//
// The frames are the TCP link's (docs/wire-protocol.md, common/wire.h). Run over the TCP
// link only (api_net).
#include "fabric_fixture.h"

#include "common/wire.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>

namespace tandem_test {
namespace {

using namespace tandem;

constexpr size_t kRegion = 4096;
constexpr uint32_t kRegionSeed = 0x5eed;

class RoguePeerTest : public FabricTest {
  protected:
    std::unique_ptr<DataBuf> region;

    void configure(FabricOptions &o) override { o.caps |= FI_RMA; }

    void SetUp() override {
        FabricTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        if (on_verbs_link()) GTEST_SKIP() << "frames of the TCP link";
        region = buf(kRegion, 0, /*always_reg=*/true);
        fill_pattern(region->data(), kRegion, kRegionSeed);
    }

    void TearDown() override {
        for (int fd : socks_) close(fd);
        region.reset();
        FabricTest::TearDown();
    }

    // A TCP connection to endpoint a's listening address.
    int connect_rogue() {
        sockaddr_storage ss{};
        std::memcpy(&ss, a().name.data(), std::min(a().name.size(), sizeof ss));
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        EXPECT_GE(fd, 0);
        if (fd < 0) return -1;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int ret = ::connect(fd, reinterpret_cast<sockaddr *>(&ss),
                            ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
        EXPECT_EQ(ret, 0) << "connect to the endpoint: " << strerror(errno);
        socks_.push_back(fd);
        progress();
        return fd;
    }

    static void send_bytes(int fd, const void *p, size_t n) {
        ASSERT_EQ(::send(fd, p, n, MSG_NOSIGNAL), static_cast<ssize_t>(n)) << strerror(errno);
    }

    // Drives tandem's progress until the rogue's socket is closed by tandem (end of stream
    // or a reset), at most `limit`. Whatever tandem sent before is read and dropped.
    bool closed_by_tandem(int fd, Ms limit = 10s) {
        const auto deadline = Clock::now() + limit;
        while (Clock::now() < deadline) {
            progress();
            // Busy, as a polling application: tandem accepts a new connection within so many
            // progress passes while it has none (Endpoint::progress).
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 0) > 0) {
                uint8_t sink[4096];
                ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
                if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
            }
        }
        return false;
    }

    // The next frame tandem sends on fd other than an Ack (with its payload), driving
    // progress, at most `limit`.
    bool next_frame(int fd, wire::TcpFrame &hdr, std::vector<uint8_t> &payload, Ms limit = 10s) {
        const auto deadline = Clock::now() + limit;
        for (;;) {
            if (!read_exact(fd, &hdr, sizeof hdr, deadline)) return false;
            payload.resize(hdr.length);
            if (hdr.length && !read_exact(fd, payload.data(), hdr.length, deadline)) return false;
            if (hdr.op != static_cast<uint8_t>(wire::TcpOp::Ack)) return true;
        }
    }

    bool read_exact(int fd, void *p, size_t n, Clock::time_point deadline) {
        auto *c = static_cast<uint8_t *>(p);
        while (n) {
            if (Clock::now() > deadline) return false;
            progress();
            ssize_t got = recv(fd, c, n, MSG_DONTWAIT);
            if (got == 0) return false;
            if (got < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
                continue;
            }
            c += got;
            n -= static_cast<size_t>(got);
        }
        return true;
    }

    // A connection request as an RDM peer sends it: the link's hello, then the protocol's,
    // naming a listening address.
    static std::vector<uint8_t> rdm_request(uint16_t tcp_version = wire::kTcpVersion) {
        sockaddr_in me{};
        me.sin_family = AF_INET;
        me.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        me.sin_port = htons(9);  // nobody listens: tandem never needs to connect back here
        wire::ConnHello hello{.magic = wire::kProtoMagic,
                              .version = wire::kConnHelloVersion,
                              .kind = static_cast<uint8_t>(wire::ConnKind::Rdm),
                              .addr_len = static_cast<uint8_t>(sizeof me),
                              .user_len = 0,
                              .reserved = 0,
                              .auth = 0};
        const uint32_t priv_len = sizeof hello + sizeof me;
        wire::TcpCmHello cm{wire::kTcpMagic, tcp_version, 0, priv_len, 0};
        wire::TcpFrame f{};
        f.op = static_cast<uint8_t>(wire::TcpOp::CmRequest);
        f.length = sizeof cm + priv_len;
        std::vector<uint8_t> out(sizeof f + f.length);
        uint8_t *p = out.data();
        std::memcpy(p, &f, sizeof f);
        std::memcpy(p += sizeof f, &cm, sizeof cm);
        std::memcpy(p += sizeof cm, &hello, sizeof hello);
        std::memcpy(p + sizeof hello, &me, sizeof me);
        return out;
    }

    // Connects and identifies as an RDM peer; true once tandem accepted.
    int handshake() {
        int fd = connect_rogue();
        if (fd < 0) return -1;
        auto req = rdm_request();
        send_bytes(fd, req.data(), req.size());
        wire::TcpFrame hdr{};
        std::vector<uint8_t> payload;
        EXPECT_TRUE(next_frame(fd, hdr, payload)) << "no answer to a valid connection request";
        EXPECT_EQ(hdr.op, static_cast<uint8_t>(wire::TcpOp::CmAccept));
        return fd;
    }

    static void send_write(int fd, uint64_t addr, uint64_t key, const void *data, size_t len) {
        wire::TcpFrame f{};
        f.op = static_cast<uint8_t>(wire::TcpOp::Write);
        f.length = len;
        wire::TcpRdma ext{addr, key, len};
        send_bytes(fd, &f, sizeof f);
        send_bytes(fd, &ext, sizeof ext);
        if (len) send_bytes(fd, data, len);
    }

    static void send_read(int fd, uint64_t addr, uint64_t key, size_t len) {
        wire::TcpFrame f{};
        f.op = static_cast<uint8_t>(wire::TcpOp::ReadReq);
        wire::TcpRdma ext{addr, key, len};
        send_bytes(fd, &f, sizeof f);
        send_bytes(fd, &ext, sizeof ext);
    }

    // The write numbered `seq` on this connection is refused: a Nak naming it, status
    // "remote access".
    void expect_nak(int fd, uint32_t seq) {
        wire::TcpFrame hdr{};
        std::vector<uint8_t> payload;
        ASSERT_TRUE(next_frame(fd, hdr, payload)) << "no answer to write " << seq;
        EXPECT_EQ(hdr.op, static_cast<uint8_t>(wire::TcpOp::Nak));
        EXPECT_EQ(hdr.status, static_cast<uint8_t>(wire::TcpStatus::RemoteAccess));
        EXPECT_EQ(hdr.imm, seq);
    }

    void expect_refused_read(int fd) {
        wire::TcpFrame hdr{};
        std::vector<uint8_t> payload;
        ASSERT_TRUE(next_frame(fd, hdr, payload)) << "no answer to the read";
        EXPECT_EQ(hdr.op, static_cast<uint8_t>(wire::TcpOp::ReadResp));
        EXPECT_EQ(hdr.status, static_cast<uint8_t>(wire::TcpStatus::RemoteAccess));
        EXPECT_EQ(hdr.length, 0u) << "a refused read returned data";
    }

    void expect_region_unchanged() {
        EXPECT_EQ(check_pattern(region->data(), kRegion, kRegionSeed), -1)
            << "the registered region was written";
    }

    std::vector<int> socks_;
};

TEST_F(RoguePeerTest, GarbageClosesTheConnection) {
    int fd = connect_rogue();
    std::vector<uint8_t> junk(512);
    std::mt19937 rng(42);
    for (auto &b : junk) b = static_cast<uint8_t>(rng());
    junk[0] = 0xee;  // no frame type
    send_bytes(fd, junk.data(), junk.size());
    EXPECT_TRUE(closed_by_tandem(fd)) << "tandem kept a connection that sent garbage";
    expect_region_unchanged();
    exchange_checked(801);
}

// Resident memory of this process, in bytes.
size_t resident_bytes() {
    long pages = 0, resident = 0;
    FILE *f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
    return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// A peer that connects, sends garbage and is dropped, again and again: what tandem kept for
// each connection (a 64 KiB receive buffer among others) goes with it.
TEST_F(RoguePeerTest, ManyGarbageConnectionsLeaveNoMemoryBehind) {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "AddressSanitizer keeps freed memory resident (its quarantine)";
#endif
    constexpr int kConnections = 300;
    std::vector<uint8_t> junk(64, 0xee);
    auto one = [&] {
        int fd = connect_rogue();
        send_bytes(fd, junk.data(), junk.size());
        EXPECT_TRUE(closed_by_tandem(fd));
        close(fd);
        socks_.pop_back();
    };
    for (int i = 0; i < 20; ++i) one();  // warm-up: the allocator's steady state
    const size_t before = resident_bytes();
    for (int i = 0; i < kConnections; ++i) one();
    poll_for(100ms);
    const size_t after = resident_bytes();
    // Kept, they would hold kConnections x 64 KiB (19 MiB).
    EXPECT_LT(after, before + (4u << 20))
        << "resident memory grew from " << before << " to " << after << " bytes over "
        << kConnections << " dropped connections";
    exchange_checked(810);
}

// Even with the region's real key, data frames before a connection request are refused: the
// connection closes and nothing is written.
TEST_F(RoguePeerTest, AWriteBeforeTheHandshakeWritesNothing) {
    int fd = connect_rogue();
    std::vector<uint8_t> data(64, 0xab);
    send_write(fd, rma_addr(*region), region->key, data.data(), data.size());
    EXPECT_TRUE(closed_by_tandem(fd));
    expect_region_unchanged();
    exchange_checked(802);
}

TEST_F(RoguePeerTest, AnOversizedConnectionRequestClosesTheConnection) {
    int fd = connect_rogue();
    wire::TcpFrame f{};
    f.op = static_cast<uint8_t>(wire::TcpOp::CmRequest);
    f.length = uint64_t{1} << 40;
    send_bytes(fd, &f, sizeof f);
    EXPECT_TRUE(closed_by_tandem(fd));
    exchange_checked(803);
}

TEST_F(RoguePeerTest, AWrongVersionClosesTheConnection) {
    int fd = connect_rogue();
    auto req = rdm_request(wire::kTcpVersion + 7);
    send_bytes(fd, req.data(), req.size());
    EXPECT_TRUE(closed_by_tandem(fd));
    exchange_checked(804);
}

// A frame cut short by the peer's close: tandem drops the connection, nothing half-applied.
TEST_F(RoguePeerTest, ATruncatedFrameThenCloseLeavesNothingBehind) {
    int fd = handshake();
    ASSERT_GE(fd, 0);
    wire::TcpFrame f{};
    f.op = static_cast<uint8_t>(wire::TcpOp::Write);
    f.length = 256;
    wire::TcpRdma ext{rma_addr(*region), region->key, 256};
    std::vector<uint8_t> part(100, 0xcd);
    send_bytes(fd, &f, sizeof f);
    send_bytes(fd, &ext, sizeof ext);
    send_bytes(fd, part.data(), part.size());
    shutdown(fd, SHUT_WR);
    EXPECT_TRUE(closed_by_tandem(fd));
    // (A write with the right key lands as its bytes arrive, as an RDMA write does: its first
    // 100 bytes may be there; nothing beyond them.)
    EXPECT_EQ(check_pattern(region->data() + 100, kRegion - 100, kRegionSeed, 100), -1)
        << "bytes past what the truncated write carried changed";
    exchange_checked(805);
}

TEST_F(RoguePeerTest, GuessedAndOutOfBoundsKeysAreRefusedAndWriteNothing) {
    int fd = handshake();
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> data(64, 0xef);
    uint32_t seq = 0;
    std::mt19937_64 rng(7);
    // Guessed keys: neighbours of the real one and random ones.
    for (uint64_t key :
         {region->key + 1, region->key - 1, uint64_t(rng()), uint64_t(rng()), uint64_t(0)}) {
        send_write(fd, rma_addr(*region), key, data.data(), data.size());
        ASSERT_NO_FATAL_FAILURE(expect_nak(fd, seq++));
    }
    // The right key, past the region's end and straddling it.
    send_write(fd, rma_addr(*region, kRegion), region->key, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(expect_nak(fd, seq++));
    send_write(fd, rma_addr(*region, kRegion - 32), region->key, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(expect_nak(fd, seq++));
    // Reads past the region and with a guessed key return nothing.
    send_read(fd, rma_addr(*region, kRegion - 8), region->key, 64);
    ASSERT_NO_FATAL_FAILURE(expect_refused_read(fd));
    ++seq;
    send_read(fd, rma_addr(*region), region->key ^ 0x10000, 64);
    ASSERT_NO_FATAL_FAILURE(expect_refused_read(fd));
    ++seq;
    expect_region_unchanged();
    exchange_checked(806);
}

// A key that was valid: once its region is closed, writes under it are refused.
TEST_F(RoguePeerTest, AStaleKeyIsRefused) {
    auto old = buf(kRegion, 0x11, /*always_reg=*/true);
    const uint64_t stale = old->key, addr = rma_addr(*old);
    old->mr.reset();
    int fd = handshake();
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> data(64, 0xef);
    send_write(fd, addr, stale, data.data(), data.size());
    ASSERT_NO_FATAL_FAILURE(expect_nak(fd, 0));
    for (size_t i = 0; i < kRegion; ++i) ASSERT_EQ(old->data()[i], 0x11) << "at byte " << i;
    expect_region_unchanged();
    exchange_checked(807);
}

// A connection request trickled a byte at a time: closed within the link's request timeout
// (TcpTransport::kRequestTimeoutMs, 5 s) of its first byte, however long it would go on.
TEST_F(RoguePeerTest, ASlowlorisRequestIsClosed) {
    int fd = connect_rogue();
    auto req = rdm_request();
    const auto start = Clock::now();
    bool closed = false;
    for (size_t i = 0; i < req.size() - 1 && !closed; ++i) {
        if (::send(fd, &req[i], 1, MSG_NOSIGNAL) != 1) {
            closed = true;
            break;
        }
        closed = closed_by_tandem(fd, 500ms);
    }
    if (!closed) closed = closed_by_tandem(fd, 10s);
    EXPECT_TRUE(closed) << "a request trickled over "
                        << std::chrono::duration_cast<Ms>(Clock::now() - start).count()
                        << " ms was never closed";
    EXPECT_LT(Clock::now() - start, 15s);
    exchange_checked(808);
}

class RoguePeerSleeperTest : public RoguePeerTest {
  protected:
    void configure(FabricOptions &o) override {
        RoguePeerTest::configure(o);
        o.cq_wait = FI_WAIT_FD;
    }
};

// A request that stalls is closed on time while the application sleeps in fi_cq_sread: the
// sleep has no periodic wake-up to run the check, so it ends when the request's time runs out
// (LinkTransport::next_timer_ms, Domain::sleep_limit_ms), and the check runs before the next
// sleep. The application sleeps 8 s; the rogue waits 12 s for the close.
TEST_F(RoguePeerSleeperTest, AStalledRequestIsClosedWhileTheApplicationSleeps) {
    int fd = connect_rogue();
    auto req = rdm_request();
    ASSERT_EQ(::send(fd, req.data(), 1, MSG_NOSIGNAL), 1);
    poll_for(300ms);  // a accepts the connection and reads the byte: the request's time starts
    std::atomic<bool> closed{false};
    std::thread rogue([&] {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 12000) <= 0) return;
        uint8_t sink[64];
        const ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        closed = n == 0 || (n < 0 && errno == ECONNRESET);
    });
    fi_cq_tagged_entry e{};
    EXPECT_EQ(fi_cq_sread(a().cq, &e, 1, nullptr, 8000), -FI_EAGAIN);
    rogue.join();
    EXPECT_TRUE(closed) << "a request stalled for 8 s while its listener slept was not closed";
    exchange_checked(811);
}

// Connections that never identify themselves: beyond the link's limit (64) the oldest are
// closed, so a peer opening many holds neither sockets nor memory for ever.
TEST_F(RoguePeerTest, SilentConnectionsBeyondTheLimitAreClosed) {
    constexpr int kOpen = 72;
    std::vector<int> fds;
    for (int i = 0; i < kOpen; ++i) fds.push_back(connect_rogue());
    poll_for(200ms);
    int closed = 0;
    for (int i = 0; i < kOpen - 64; ++i) closed += closed_by_tandem(fds[i], 2s);
    EXPECT_EQ(closed, kOpen - 64) << "the oldest silent connections were not all closed";
    // The newest are still open (tandem waits for their request).
    pollfd p{fds.back(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0) << "the newest silent connection was closed too";
    exchange_checked(809);
}

}  // namespace
}  // namespace tandem_test

// fi_av(3): address vectors of both types, insert/insertsvc/remove/lookup/straddr, named AVs.
#include "fabric_fixture.h"

#include <unistd.h>

#include <set>

namespace tandem_test {
namespace {

sockaddr_in make_sin(const char *ip, uint16_t port) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    inet_pton(AF_INET, ip, &sin.sin_addr);
    return sin;
}

class AvTest : public FabricTest {
  protected:
    void configure(FabricOptions &o) override { o.caps |= FI_SHARED_AV; }
    void open_typed_av(Fid<fid_av> &av, fi_av_type type, const char *name = nullptr,
                       uint64_t flags = 0) {
        fi_av_attr attr{};
        attr.type = type;
        attr.count = 64;
        attr.name = name;
        attr.flags = flags;
        ASSERT_FI_OK(fi_av_open(domain, &attr, av.out(), nullptr));
    }
};

TEST_F(AvTest, TableIndicesAreSequentialAcrossCalls) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_TABLE));
    sockaddr_in addrs[3] = {make_sin("127.0.0.1", 30001), make_sin("127.0.0.1", 30002),
                            make_sin("127.0.0.1", 30003)};
    fi_addr_t out[3] = {FI_ADDR_NOTAVAIL, FI_ADDR_NOTAVAIL, FI_ADDR_NOTAVAIL};
    ASSERT_FI_RET(fi_av_insert(av, addrs, 2, out, 0, nullptr), 2);
    EXPECT_EQ(out[0], 0u);
    EXPECT_EQ(out[1], 1u);
    ASSERT_FI_RET(fi_av_insert(av, &addrs[2], 1, &out[2], 0, nullptr), 1);
    EXPECT_EQ(out[2], 2u);
}

TEST_F(AvTest, MapAddressesAreDistinct) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_MAP));
    sockaddr_in addrs[3] = {make_sin("127.0.0.1", 30011), make_sin("127.0.0.1", 30012),
                            make_sin("127.0.0.2", 30011)};
    fi_addr_t out[3];
    ASSERT_FI_RET(fi_av_insert(av, addrs, 3, out, 0, nullptr), 3);
    std::set<fi_addr_t> seen(out, out + 3);
    EXPECT_EQ(seen.size(), 3u);
    EXPECT_EQ(seen.count(FI_ADDR_NOTAVAIL), 0u);
}

TEST_F(AvTest, InsertOfZeroAddressesInsertsNothing) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_TABLE));
    sockaddr_in sin = make_sin("127.0.0.1", 30021);
    fi_addr_t out = 12345;
    EXPECT_FI_RET(fi_av_insert(av, &sin, 0, &out, 0, nullptr), 0);
    ASSERT_FI_RET(fi_av_insert(av, &sin, 1, &out, 0, nullptr), 1);
    EXPECT_EQ(out, 0u) << "an empty insert consumed a table index";
}

class AvTypeTest : public AvTest, public ::testing::WithParamInterface<fi_av_type> {
  protected:
    void configure(FabricOptions &o) override {
        AvTest::configure(o);
        o.av_type = GetParam();
    }
};

TEST_P(AvTypeTest, LookupReturnsInsertedAddress) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, GetParam()));
    sockaddr_in addrs[2] = {make_sin("127.0.0.1", 30031), make_sin("127.0.0.3", 30032)};
    fi_addr_t out[2];
    ASSERT_FI_RET(fi_av_insert(av, addrs, 2, out, 0, nullptr), 2);
    for (int i = 0; i < 2; ++i) {
        sockaddr_in got{};
        size_t len = sizeof(got);
        ASSERT_FI_OK(fi_av_lookup(av, out[i], &got, &len));
        EXPECT_EQ(len, sizeof(sockaddr_in));
        EXPECT_EQ(got.sin_family, AF_INET);
        EXPECT_EQ(got.sin_port, addrs[i].sin_port);
        EXPECT_EQ(got.sin_addr.s_addr, addrs[i].sin_addr.s_addr);
    }
}

TEST_P(AvTypeTest, LookupWithSmallBufferReportsNeededSize) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, GetParam()));
    sockaddr_in sin = make_sin("127.0.0.1", 30041);
    fi_addr_t out;
    ASSERT_FI_RET(fi_av_insert(av, &sin, 1, &out, 0, nullptr), 1);
    uint8_t small[4] = {0xFF, 0xFF, 0xFF, 0xFF};
    size_t len = sizeof(small);
    int ret = fi_av_lookup(av, out, small, &len);
    EXPECT_TRUE(ret == 0 || ret == -FI_ETOOSMALL) << fi_err_str(ret);
    EXPECT_EQ(len, sizeof(sockaddr_in));
    EXPECT_EQ(std::memcmp(small, &sin, sizeof(small)), 0) << "truncated copy differs";
}

TEST_P(AvTypeTest, RemovedAddressCannotBeLookedUp) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, GetParam()));
    sockaddr_in sin = make_sin("127.0.0.1", 30051);
    fi_addr_t out;
    ASSERT_FI_RET(fi_av_insert(av, &sin, 1, &out, 0, nullptr), 1);
    ASSERT_FI_OK(fi_av_remove(av, &out, 1, 0));
    sockaddr_in got{};
    size_t len = sizeof(got);
    EXPECT_NE(fi_av_lookup(av, out, &got, &len), 0);
    // Removal followed by re-insertion must work.
    fi_addr_t again;
    ASSERT_FI_RET(fi_av_insert(av, &sin, 1, &again, 0, nullptr), 1);
    len = sizeof(got);
    ASSERT_FI_OK(fi_av_lookup(av, again, &got, &len));
    EXPECT_EQ(got.sin_port, sin.sin_port);
}

TEST_P(AvTypeTest, SendAndReceiveThroughAv) {
    auto s = buf(256);
    auto r = buf(256);
    fill_pattern(s->data(), 256, 40);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 256, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s->data(), 256, s->desc, a().peer[1], ctx(0)); }));
    auto rc = wait_comp(b(), ctx(1));
    ASSERT_TRUE(rc) << b().log.summary();
    EXPECT_EQ(rc->src, b().peer[0]);
    EXPECT_EQ(check_pattern(r->data(), 256, 40), -1);
}

TEST_P(AvTypeTest, ReinsertedPeerIsReachable) {
    // Remove b from a's AV and insert it again: the new fi_addr must reach b.
    ASSERT_FI_OK(fi_av_remove(a().av, &a().peer[1], 1, 0));
    fi_addr_t again = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(a().av, b().name.data(), 1, &again, 0, nullptr), 1);
    auto s = buf(64);
    auto r = buf(64);
    fill_pattern(s->data(), 64, 41);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_send(a().ep, s->data(), 64, s->desc, again, ctx(0)); }));
    ASSERT_TRUE(wait_comp(b(), ctx(1))) << b().log.summary();
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    EXPECT_EQ(check_pattern(r->data(), 64, 41), -1);
}

INSTANTIATE_TEST_SUITE_P(Types, AvTypeTest, ::testing::Values(FI_AV_MAP, FI_AV_TABLE),
                         [](const ::testing::TestParamInfo<fi_av_type> &p) {
                             return std::string(p.param == FI_AV_MAP ? "map" : "table");
                         });

TEST_F(AvTest, TableReusesLowestFreeIndex) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_TABLE));
    sockaddr_in addrs[3] = {make_sin("127.0.0.1", 30061), make_sin("127.0.0.1", 30062),
                            make_sin("127.0.0.1", 30063)};
    fi_addr_t out[3];
    ASSERT_FI_RET(fi_av_insert(av, addrs, 3, out, 0, nullptr), 3);
    ASSERT_FI_OK(fi_av_remove(av, &out[1], 1, 0));
    sockaddr_in extra = make_sin("127.0.0.1", 30064);
    fi_addr_t got = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(av, &extra, 1, &got, 0, nullptr), 1);
    EXPECT_EQ(got, 1u);
    sockaddr_in back{};
    size_t len = sizeof(back);
    ASSERT_FI_OK(fi_av_lookup(av, 1, &back, &len));
    EXPECT_EQ(ntohs(back.sin_port), 30064);
}

TEST_F(AvTest, InsertsvcResolvesNodeAndService) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_TABLE));
    fi_addr_t out = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insertsvc(av, "127.0.0.1", "12345", &out, 0, nullptr), 1);
    sockaddr_in got{};
    size_t len = sizeof(got);
    ASSERT_FI_OK(fi_av_lookup(av, out, &got, &len));
    EXPECT_EQ(got.sin_family, AF_INET);
    EXPECT_EQ(ntohs(got.sin_port), 12345);
    EXPECT_EQ(ntohl(got.sin_addr.s_addr), 0x7F000001u);
}

TEST_F(AvTest, InsertsvcReachesEndpoint) {
    // Insert b by its numeric node/service instead of the raw address.
    sockaddr_in bsin{};
    std::memcpy(&bsin, b().name.data(), sizeof(bsin));
    char host[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &bsin.sin_addr, host, sizeof(host));
    const std::string port = std::to_string(ntohs(bsin.sin_port));
    fi_addr_t out = FI_ADDR_NOTAVAIL;
    ASSERT_FI_OK(fi_av_remove(a().av, &a().peer[1], 1, 0));
    ASSERT_FI_RET(fi_av_insertsvc(a().av, host, port.c_str(), &out, 0, nullptr), 1);
    auto s = buf(32);
    auto r = buf(32);
    fill_pattern(s->data(), 32, 42);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r->data(), 32, r->desc, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_send(a().ep, s->data(), 32, s->desc, out, ctx(0)); }));
    ASSERT_TRUE(wait_comp(b(), ctx(1))) << b().log.summary();
    EXPECT_EQ(check_pattern(r->data(), 32, 42), -1);
}

TEST_F(AvTest, StraddrPrintsIpAndPort) {
    sockaddr_in sin = make_sin("127.0.0.1", 23456);
    char out[128] = {};
    size_t len = sizeof(out);
    const char *s = fi_av_straddr(a().av, &sin, out, &len);
    ASSERT_EQ(s, out);
    const std::string str(out);
    EXPECT_NE(str.find("127.0.0.1"), std::string::npos) << str;
    EXPECT_NE(str.find("23456"), std::string::npos) << str;
    EXPECT_GT(len, str.size()) << "len must count the terminating NUL";
    // Too small a buffer: truncated, and len reports what is needed.
    char small[6];
    std::memset(small, 'x', sizeof(small));
    size_t slen = sizeof(small);
    EXPECT_EQ(fi_av_straddr(a().av, &sin, small, &slen), small);
    EXPECT_EQ(slen, len);
    EXPECT_EQ(std::memcmp(small, out, sizeof(small) - 1), 0);
}

TEST_F(AvTest, SyncErrReportsPerAddressStatus) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_TABLE));
    sockaddr_in addrs[2] = {make_sin("127.0.0.1", 30071), make_sin("127.0.0.1", 30072)};
    addrs[1].sin_family = AF_UNIX;  // not an FI_SOCKADDR_IN address
    fi_addr_t out[2] = {0, 0};
    int status[2] = {-1, 0};
    ASSERT_FI_RET(fi_av_insert(av, addrs, 2, out, FI_SYNC_ERR, status), 1);
    EXPECT_EQ(status[0], 0);
    EXPECT_NE(status[1], 0);
    EXPECT_NE(out[0], FI_ADDR_NOTAVAIL);
    EXPECT_EQ(out[1], FI_ADDR_NOTAVAIL);
}

TEST_F(AvTest, ManyAddresses) {
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_TABLE));
    constexpr int kN = 1000;
    std::vector<sockaddr_in> addrs;
    for (int i = 0; i < kN; ++i) addrs.push_back(make_sin("127.0.0.1", 40000 + i));
    std::vector<fi_addr_t> out(kN, FI_ADDR_NOTAVAIL);
    ASSERT_FI_RET(fi_av_insert(av, addrs.data(), kN, out.data(), 0, nullptr), kN);
    for (int i = 0; i < kN; i += 97) {
        EXPECT_EQ(out[i], static_cast<fi_addr_t>(i));
        sockaddr_in got{};
        size_t len = sizeof(got);
        ASSERT_FI_OK(fi_av_lookup(av, out[i], &got, &len));
        EXPECT_EQ(ntohs(got.sin_port), 40000 + i);
    }
}

TEST_F(AvTest, NamedAvIsSharedWithReadOnlyOpen) {
    const std::string name = "/tandem-api-av-" + std::to_string(getpid());
    Fid<fid_av> owner;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(owner, FI_AV_TABLE, name.c_str()));
    sockaddr_in addrs[2] = {make_sin("127.0.0.1", 30081), make_sin("127.0.0.5", 30082)};
    fi_addr_t out[2];
    ASSERT_FI_RET(fi_av_insert(owner, addrs, 2, out, 0, nullptr), 2);
    Fid<fid_av> reader;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(reader, FI_AV_TABLE, name.c_str(), FI_READ));
    for (int i = 0; i < 2; ++i) {
        sockaddr_in got{};
        size_t len = sizeof(got);
        ASSERT_FI_OK(fi_av_lookup(reader, out[i], &got, &len));
        EXPECT_EQ(got.sin_port, addrs[i].sin_port);
        EXPECT_EQ(got.sin_addr.s_addr, addrs[i].sin_addr.s_addr);
    }
}

TEST_F(AvTest, ReadOnlyOpenOfUnknownNameFails) {
    const std::string name = "/tandem-api-no-such-av-" + std::to_string(getpid());
    fi_av_attr attr{};
    attr.type = FI_AV_TABLE;
    attr.name = name.c_str();
    attr.flags = FI_READ;
    Fid<fid_av> av;
    int ret = fi_av_open(domain, &attr, av.out(), nullptr);
    EXPECT_NE(ret, 0) << "FI_READ open of an AV that does not exist succeeded";
}

TEST_F(AvTest, CloseWhileBoundIsBusy) {
    int ret = fi_close(&a().av->fid);
    EXPECT_EQ(ret, -FI_EBUSY) << fi_err_str(ret);
    if (ret == 0) a().av.release();
}

}  // namespace
}  // namespace tandem_test

// fi_av(3): address vectors of both types, insert/insertsvc/remove/lookup/straddr, named AVs.
#include "fabric_fixture.h"

#include <poll.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <latch>
#include <set>

// fi_av_bind: deprecated from libfabric 2.0, whose headers mark them so (a build against them,
// cmake -DTANDEM_LIBFABRIC_PREFIX). Applications of 1.x call them, and tandem serves those.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

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

// fi_av(3) leaves a duplicate insert to the provider; tandem keeps one entry per address,
// as libfabric's util AV does, and counts the inserts: the same fi_addr_t comes back, each
// remove gives back one insert, and the address goes with the last.
TEST_P(AvTypeTest, DuplicateInsertReturnsTheSameAddressUntilTheLastRemove) {
    fi_addr_t again = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(a().av, b().name.data(), 1, &again, 0, nullptr), 1);
    EXPECT_EQ(again, a().peer[1]);
    // Another address after it still gets an entry of its own.
    sockaddr_in other = make_sin("127.0.0.1", 30071);
    fi_addr_t other_addr = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(a().av, &other, 1, &other_addr, 0, nullptr), 1);
    EXPECT_NE(other_addr, a().peer[1]);
    EXPECT_NE(other_addr, a().peer[0]);

    ASSERT_FI_OK(fi_av_remove(a().av, &again, 1, 0));
    // One insert is left: the address stays, and b is reached through it.
    std::vector<uint8_t> got(b().name.size());
    size_t len = got.size();
    ASSERT_FI_OK(fi_av_lookup(a().av, a().peer[1], got.data(), &len));
    EXPECT_EQ(got, b().name);
    ASSERT_NO_FATAL_FAILURE(exchange_checked(42));

    ASSERT_FI_OK(fi_av_remove(a().av, &a().peer[1], 1, 0));
    len = got.size();
    EXPECT_FI_RET(fi_av_lookup(a().av, a().peer[1], got.data(), &len), -FI_EINVAL);
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

// A named AV is the user's alone: created 0600 whatever the umask, owned by the user.
TEST_F(AvTest, NamedAvIsPrivateToTheUser) {
    const std::string name = "/tandem-api-av-mode-" + std::to_string(getpid());
    mode_t old_mask = umask(0);
    Fid<fid_av> owner;
    open_typed_av(owner, FI_AV_TABLE, name.c_str());
    umask(old_mask);
    ASSERT_TRUE(owner);
    struct stat st {};
    ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_EQ(st.st_uid, geteuid());
}

// A file of that name that others may write (made by someone else, or chmod-ed) is not joined:
// it could hold addresses another user chose for this job.
TEST_F(AvTest, NamedAvOthersMayWriteIsNotJoined) {
    const std::string name = "/tandem-api-av-open-" + std::to_string(getpid());
    Fid<fid_av> owner;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(owner, FI_AV_TABLE, name.c_str()));
    ASSERT_EQ(chmod(("/dev/shm" + name).c_str(), 0666), 0);
    for (uint64_t flags : {uint64_t(0), uint64_t(FI_READ)}) {
        fi_av_attr attr{};
        attr.type = FI_AV_TABLE;
        attr.count = 64;
        attr.name = name.c_str();
        attr.flags = flags;
        Fid<fid_av> joiner;
        EXPECT_EQ(fi_av_open(domain, &attr, joiner.out(), nullptr), -FI_EACCES)
            << (flags ? "read-only" : "read-write") << " open of a world-writable AV";
    }
}

// fi_av(3): with name set and map_addr 0, the map_addr the provider uses comes back, and an
// fi_addr_t of the named AV is usable in every process that opens the name. fabtests'
// fi_rdm_shared_av reads the peer's fi_addr_t from it in a process that opened the AV (read
// only) before the peer's address was inserted.
TEST_F(AvTest, NamedAvReturnsItsMapAddr) {
    const std::string name = "/tandem-api-av-map-" + std::to_string(getpid());
    fi_av_attr attr{};
    attr.type = FI_AV_TABLE;
    attr.count = 8;
    attr.name = name.c_str();
    Fid<fid_av> owner;
    ASSERT_FI_OK(fi_av_open(domain, &attr, owner.out(), nullptr));
    ASSERT_NE(attr.map_addr, nullptr);
    fi_av_attr rattr = attr;
    rattr.map_addr = nullptr;
    rattr.flags = FI_READ;
    Fid<fid_av> reader;
    ASSERT_FI_OK(fi_av_open(domain, &rattr, reader.out(), nullptr));
    ASSERT_NE(rattr.map_addr, nullptr);
    sockaddr_in addrs[2] = {make_sin("127.0.0.1", 30091), make_sin("127.0.0.7", 30092)};
    fi_addr_t out[2];
    ASSERT_FI_RET(fi_av_insert(owner, addrs, 2, out, 0, nullptr), 2);
    const auto *table = static_cast<const fi_addr_t *>(rattr.map_addr);
    for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(table[i], out[i]);
        sockaddr_in got{};
        size_t len = sizeof got;
        ASSERT_FI_OK(fi_av_lookup(reader, table[i], &got, &len));
        EXPECT_EQ(got.sin_port, addrs[i].sin_port);
        EXPECT_EQ(got.sin_addr.s_addr, addrs[i].sin_addr.s_addr);
    }
}

class AsyncAvTest : public AvTest {
  protected:
    void open_async_av(Fid<fid_av> &av, Fid<fid_eq> &eq) {
        ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_TABLE, nullptr, FI_EVENT));
        fi_eq_attr eq_attr{};
        ASSERT_FI_OK(fi_eq_open(fabric, &eq_attr, eq.out(), nullptr));
    }
};

// fi_av(3): an AV opened with FI_EVENT inserts asynchronously whatever the call's flags: the
// call returns 0, then an error event per failed address (its index in data) and one
// FI_AV_COMPLETE with the number inserted, all with the call's context.
TEST_F(AsyncAvTest, InsertsOfAnAvOpenedWithFiEventCompleteOnTheEq) {
    Fid<fid_av> av;
    Fid<fid_eq> eq;
    ASSERT_NO_FATAL_FAILURE(open_async_av(av, eq));
    sockaddr_in addrs[3] = {make_sin("127.0.0.1", 30101), make_sin("127.0.0.1", 30102),
                            make_sin("127.0.0.1", 30103)};
    addrs[1].sin_family = AF_UNIX;  // not an FI_SOCKADDR_IN address
    fi_addr_t out[3];
    EXPECT_FI_RET(fi_av_insert(av, addrs, 3, out, 0, ctx(0)), -FI_ENOEQ);
    ASSERT_FI_OK(fi_av_bind(av, &eq->fid, 0));
    ASSERT_FI_RET(fi_av_insert(av, addrs, 3, out, 0, ctx(0)), 0);
    EXPECT_EQ(out[1], FI_ADDR_NOTAVAIL);
    fi_eq_entry entry{};
    uint32_t event = 0;
    ASSERT_FI_RET(fi_eq_read(eq, &event, &entry, sizeof entry, 0), -FI_EAVAIL);
    fi_eq_err_entry err{};
    ASSERT_FI_RET(fi_eq_readerr(eq, &err, 0), sizeof err);
    EXPECT_EQ(err.fid, &av->fid);
    EXPECT_EQ(err.context, ctx(0));
    EXPECT_EQ(err.data, 1u);
    EXPECT_EQ(err.err, FI_EINVAL);
    ASSERT_FI_RET(fi_eq_read(eq, &event, &entry, sizeof entry, 0), sizeof entry);
    EXPECT_EQ(event, uint32_t(FI_AV_COMPLETE));
    EXPECT_EQ(entry.fid, &av->fid);
    EXPECT_EQ(entry.context, ctx(0));
    EXPECT_EQ(entry.data, 2u);
    // An insert of nothing completes too.
    ASSERT_FI_RET(fi_av_insert(av, addrs, 0, out, 0, ctx(1)), 0);
    ASSERT_FI_RET(fi_eq_read(eq, &event, &entry, sizeof entry, 0), sizeof entry);
    EXPECT_EQ(event, uint32_t(FI_AV_COMPLETE));
    EXPECT_EQ(entry.context, ctx(1));
    EXPECT_EQ(entry.data, 0u);
    av.reset();
}

// Closing the AV a process published removes its name only while the name is still that AV:
// once it was removed and given to a new AV, the new one stays.
TEST_F(AvTest, ClosingAReplacedNamedAvLeavesItsSuccessor) {
    const std::string name = "/tandem-api-av-succ-" + std::to_string(getpid());
    Fid<fid_av> first;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(first, FI_AV_TABLE, name.c_str()));
    ASSERT_EQ(shm_unlink(name.c_str()), 0);  // someone removed the name ...
    Fid<fid_av> second;                      // ... and a new AV took it
    ASSERT_NO_FATAL_FAILURE(open_typed_av(second, FI_AV_TABLE, name.c_str()));
    first.reset();
    int fd = shm_open(name.c_str(), O_RDONLY, 0);
    EXPECT_GE(fd, 0) << "closing the first AV removed its successor's name";
    if (fd >= 0) close(fd);
    Fid<fid_av> third;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(third, FI_AV_TABLE, name.c_str(), FI_READ));
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

// Named AVs opened, concurrently, while another process is creating the same name. A forked
// process opens the AV with the test hook TANDEM_TEST_AV_STOP_BEFORE_PUBLISH, which stops it
// (SIGSTOP) after it has built the AV and before it has published it: the test acts at exactly
// that point, with no timing involved.
class NamedAvCreationTest : public AvTest {
  protected:
    static constexpr uint16_t kCreatorPort = 31000;
    const std::string name = "/tandem-api-av-race-" + std::to_string(getpid());
    pid_t creator = -1;
    int to_creator = -1, from_creator = -1;

    void TearDown() override {
        if (creator > 0) {
            kill(creator, SIGKILL);
            waitpid(creator, nullptr, 0);
        }
        if (to_creator >= 0) close(to_creator);
        if (from_creator >= 0) close(from_creator);
        AvTest::TearDown();
        shm_unlink(name.c_str());  // whatever a failed run left behind
    }

    // The creator process: opens the AV (stopping inside, in the hook), then inserts its own
    // address, reports, and when told, reports the ports it can look up at indices [0, n).
    [[noreturn]] void creator_main(int rfd, int wfd) {
        alarm(30);  // never outlive a broken parent for long
        setenv("TANDEM_TEST_AV_STOP_BEFORE_PUBLISH", "1", 1);
        fi_av_attr attr{};
        attr.type = FI_AV_TABLE;
        attr.count = 64;
        attr.name = name.c_str();
        fid_av *av = nullptr;
        uint8_t status = fi_av_open(domain, &attr, &av, nullptr) == 0 ? 1 : 0;
        sockaddr_in sin = make_sin("127.0.0.1", kCreatorPort);
        if (status && fi_av_insert(av, &sin, 1, nullptr, 0, nullptr) != 1) status = 0;
        if (write(wfd, &status, 1) != 1 || !status) _exit(1);
        uint8_t n = 0;
        if (read(rfd, &n, 1) != 1) _exit(1);
        std::vector<uint16_t> ports(n, 0);
        for (uint8_t i = 0; i < n; ++i) {
            sockaddr_in got{};
            size_t len = sizeof got;
            if (fi_av_lookup(av, i, &got, &len) == 0) ports[i] = ntohs(got.sin_port);
        }
        if (write(wfd, ports.data(), n * sizeof(uint16_t)) != ssize_t(n * sizeof(uint16_t)))
            _exit(1);
        _exit(0);
    }

    void start_stopped_creator() {
        int down[2], up[2];
        ASSERT_EQ(pipe(down), 0);
        ASSERT_EQ(pipe(up), 0);
        creator = fork();
        ASSERT_GE(creator, 0);
        if (creator == 0) {
            close(down[1]);
            close(up[0]);
            creator_main(down[0], up[1]);
        }
        close(down[0]);
        close(up[1]);
        to_creator = down[1];
        from_creator = up[0];
        int status = 0;
        ASSERT_EQ(waitpid(creator, &status, WUNTRACED), creator);
        ASSERT_TRUE(WIFSTOPPED(status)) << "the creator did not stop before publishing the AV";
    }

    bool read_from_creator(void *p, size_t n) {
        pollfd pfd{from_creator, POLLIN, 0};
        return ::poll(&pfd, 1, 20000) == 1 && read(from_creator, p, n) == ssize_t(n);
    }

    static std::multiset<uint16_t> ports_of(fid_av *av, size_t n) {
        std::multiset<uint16_t> ports;
        for (size_t i = 0; i < n; ++i) {
            sockaddr_in got{};
            size_t len = sizeof got;
            if (fi_av_lookup(av, i, &got, &len) == 0) ports.insert(ntohs(got.sin_port));
        }
        return ports;
    }
};

TEST_F(NamedAvCreationTest, OpenersWhileTheCreatorPublishesAllJoinOneAv) {
    ASSERT_NO_FATAL_FAILURE(start_stopped_creator());
    // Four threads open the name at once while the creator is stopped before publishing.
    constexpr size_t kOpeners = 4;
    std::vector<Fid<fid_av>> avs(kOpeners);
    std::vector<int> rets(kOpeners, -1);
    std::latch start(kOpeners);
    std::vector<std::thread> threads;
    for (size_t k = 0; k < kOpeners; ++k) {
        threads.emplace_back([&, k] {
            fi_av_attr attr{};
            attr.type = FI_AV_TABLE;
            attr.count = 64;
            attr.name = name.c_str();
            start.arrive_and_wait();
            rets[k] = fi_av_open(domain, &attr, avs[k].out(), nullptr);
        });
    }
    for (auto &t : threads) t.join();
    for (size_t k = 0; k < kOpeners; ++k)
        ASSERT_FI_OK(rets[k]) << "opener " << k << " of an AV being created";
    for (size_t k = 0; k < kOpeners; ++k) {
        sockaddr_in sin = make_sin("127.0.0.1", static_cast<uint16_t>(kCreatorPort + 1 + k));
        ASSERT_FI_RET(fi_av_insert(avs[k], &sin, 1, nullptr, 0, nullptr), 1);
    }
    // The creator goes on: it must join the AV the openers made, not replace it.
    ASSERT_EQ(kill(creator, SIGCONT), 0);
    uint8_t opened = 0;
    ASSERT_TRUE(read_from_creator(&opened, 1)) << "the creator did not report";
    ASSERT_EQ(opened, 1) << "the creator could not open or insert into the AV";

    const size_t n = kOpeners + 1;
    std::multiset<uint16_t> want;
    for (size_t k = 0; k < n; ++k) want.insert(static_cast<uint16_t>(kCreatorPort + k));
    for (size_t k = 0; k < kOpeners; ++k) EXPECT_EQ(ports_of(avs[k], n), want) << "opener " << k;
    uint8_t count = n;
    ASSERT_EQ(write(to_creator, &count, 1), 1);
    std::vector<uint16_t> seen(n);
    ASSERT_TRUE(read_from_creator(seen.data(), n * sizeof(uint16_t)));
    EXPECT_EQ(std::multiset<uint16_t>(seen.begin(), seen.end()), want) << "the creator's view";
}

TEST_F(NamedAvCreationTest, ACreatorKilledBeforePublishingLeavesNothingBehind) {
    ASSERT_NO_FATAL_FAILURE(start_stopped_creator());
    kill(creator, SIGKILL);
    waitpid(creator, nullptr, 0);
    creator = -1;
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_typed_av(av, FI_AV_TABLE, name.c_str()));
    sockaddr_in got{};
    size_t len = sizeof got;
    EXPECT_NE(fi_av_lookup(av, 0, &got, &len), 0) << "a new AV has an entry";
    sockaddr_in sin = make_sin("127.0.0.1", 31100);
    fi_addr_t out = FI_ADDR_NOTAVAIL;
    ASSERT_FI_RET(fi_av_insert(av, &sin, 1, &out, 0, nullptr), 1);
    EXPECT_EQ(out, 0u);
}

}  // namespace
}  // namespace tandem_test

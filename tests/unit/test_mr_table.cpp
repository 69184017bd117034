// MrTable: remote keys, bounds and access as the link's target side checks them.
#include "main_prov/mr.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

using namespace tandem;

namespace {
// The single local address a resolution maps to, or nullptr when refused.
void *one(const MrTable &t, uint64_t key, uint64_t addr, size_t len, uint64_t access) {
    LocalPieces p;
    if (!t.resolve(key, addr, len, access, p)) return nullptr;
    return p.count == 1 ? p.iov[0].iov_base : nullptr;
}
}  // namespace

TEST(MrTable, InternalKeysGrantRemoteReadOfExactlyTheirRange) {
    MrTable t;
    std::vector<char> buf(4096);
    uint64_t key = t.insert_internal({buf.data(), buf.size()});
    auto base = reinterpret_cast<uint64_t>(buf.data());
    EXPECT_EQ(one(t, key, base, 4096, FI_REMOTE_READ), buf.data());
    EXPECT_EQ(one(t, key, base + 100, 10, FI_REMOTE_READ), buf.data() + 100);
    EXPECT_EQ(one(t, key, base + 4090, 10, FI_REMOTE_READ), nullptr);  // past the end
    EXPECT_EQ(one(t, key, base - 1, 1, FI_REMOTE_READ), nullptr);      // before it
    EXPECT_EQ(one(t, key, base, 8, FI_REMOTE_WRITE), nullptr);         // read only
    EXPECT_EQ(one(t, key ^ 1, base, 8, FI_REMOTE_READ), nullptr);      // wrong key
    t.erase_internal(key);
    EXPECT_EQ(one(t, key, base, 8, FI_REMOTE_READ), nullptr);
}

// A rendezvous source's key is random: no peer counts its way from one message's to the next.
TEST(MrTable, InternalKeysCannotBeCountedTo) {
    MrTable t;
    char a[64];
    std::vector<uint64_t> keys;
    for (int i = 0; i < 64; ++i) keys.push_back(t.insert_internal({a + i, 1}));
    std::sort(keys.begin(), keys.end());
    for (size_t i = 1; i < keys.size(); ++i) EXPECT_GT(keys[i] - keys[i - 1], 1u);
    EXPECT_GT(keys.back() - keys.front(), uint64_t{1} << 40);
}

TEST(MrTable, InternalKeysAreDistinct) {
    MrTable t;
    char a[8], b[8];
    uint64_t ka = t.insert_internal({a, 8});
    uint64_t kb = t.insert_internal({b, 8});
    EXPECT_NE(ka, kb);
    EXPECT_EQ(t.find(ka), nullptr);  // not an application region
}

namespace {
// A link with keys of its own (as a NIC's rkeys), recording what it was asked to register.
class KeyedLink final : public LinkDomain {
  public:
    const char *kind() const override { return "keyed"; }
    const LinkCaps &caps() const override { return caps_; }
    int register_region(const iovec &, hmem::MemRef, uint64_t access,
                        std::unique_ptr<LinkRegion> &out) override {
        accesses.push_back(access);
        out = std::make_unique<LinkRegion>();
        out->key = next_key++;
        return 0;
    }
    std::unique_ptr<LinkTransport> transport(RemoteKeyResolver *, size_t) override {
        return nullptr;
    }
    std::vector<uint64_t> accesses;
    uint64_t next_key = 0x1000;

  private:
    LinkCaps caps_;
};
}  // namespace

TEST(MrTable, ALinksInternalKeyIsItsOwnKeyWithTheOwnerBitAndGrantsOnlyTheAccessAskedFor) {
    MrTable t;
    KeyedLink link;
    t.set_link(&link, false);
    std::vector<char> buf(256);
    auto base = reinterpret_cast<uint64_t>(buf.data());
    uint64_t dst = t.insert_internal({buf.data(), buf.size()}, hmem::kHost, FI_REMOTE_WRITE);
    uint64_t src = t.insert_internal({buf.data(), buf.size()}, hmem::kHost, FI_REMOTE_READ);
    ASSERT_EQ(link.accesses, (std::vector<uint64_t>{FI_REMOTE_WRITE, FI_REMOTE_READ}));
    EXPECT_EQ(dst, kLinkKeyOwnerBit | 0x1000);
    EXPECT_EQ(src, kLinkKeyOwnerBit | 0x1001);
    // A served read's destination takes writes only, a source reads only.
    EXPECT_EQ(one(t, dst, base + 8, 16, FI_REMOTE_WRITE), buf.data() + 8);
    EXPECT_EQ(one(t, dst, base, 8, FI_REMOTE_READ), nullptr);
    EXPECT_EQ(one(t, src, base, 8, FI_REMOTE_READ), buf.data());
    EXPECT_EQ(one(t, src, base, 8, FI_REMOTE_WRITE), nullptr);
    // The link's bare key is not the internal registration's: an application's key space
    // (the domain's own keys, Domain::rma_served) never reaches it.
    EXPECT_EQ(one(t, 0x1000, base, 8, FI_REMOTE_WRITE), nullptr);
    LocalPieces p;
    ASSERT_TRUE(t.resolve(src, base, 8, FI_REMOTE_READ, p));
    EXPECT_FALSE(p.application);
}

TEST(MrTable, ApplicationRegionsTakeTheLinksKeysOnlyWhenTheLinkNamesThem) {
    MrTable t;
    KeyedLink link;
    t.set_link(&link, false);  // a served domain: remote access events or keys of its own
    EXPECT_EQ(t.link(), &link);
    EXPECT_EQ(t.region_link(), nullptr);
    t.set_link(&link, true);  // the NIC's keys
    EXPECT_EQ(t.region_link(), &link);
    t.set_link(nullptr, true);  // TCP: no keys of the link's
    EXPECT_EQ(t.region_link(), nullptr);
}

// MrTable: remote keys, bounds and access as the link's target side checks them.
#include "main_prov/mr.h"

#include <gtest/gtest.h>

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

TEST(MrTable, InternalKeysAreDistinct) {
    MrTable t;
    char a[8], b[8];
    uint64_t ka = t.insert_internal({a, 8});
    uint64_t kb = t.insert_internal({b, 8});
    EXPECT_NE(ka, kb);
    EXPECT_EQ(t.find(ka), nullptr);  // not an application region
}

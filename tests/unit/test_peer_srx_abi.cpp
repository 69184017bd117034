// An exported SRX speaks to a peer provider of another libfabric release in that release's
// layout (peer/peer_abi_versions.h): each of the four layouts from 1.17 to 2.6, driven here by
// a fake peer through the owner ops table it would find in fid_peer_srx, the way shm does:
// get (expected and unexpected), queue, start, foreach_unspec_addr and free_entry.
// (The layouts themselves are checked against libfabric 2.6's own header in the build against
// it, TANDEM_LIBFABRIC_PREFIX; the oldest is this build's fi_ext.h.)
#include "peer/peer_srx.h"

#include <gtest/gtest.h>

#include <rdma/fi_errno.h>

#include <cstring>
#include <vector>

namespace tandem::peer {
namespace {

// An owner with one posted receive (or none): what a matcher would answer.
struct FakeOwner final : SrxOwner {
    ExportedSrx *srx = nullptr;
    bool posted = false;
    char buffer[64] = {};
    iovec buf_iov{buffer, sizeof buffer};
    int recv_context = 0;
    std::vector<OwnerRxEntry *> entries;
    fi_peer_rx_entry *queued = nullptr;
    fi_peer_rx_entry *freed = nullptr;
    fi_addr_t got_addr = 0;
    uint64_t got_tag = 0;

    OwnerRxEntry *entry(fi_addr_t addr, uint64_t tag, size_t size) {
        auto *e = new OwnerRxEntry;
        entries.push_back(e);
        e->entry.srx = srx->fid();
        e->entry.addr = addr;
        e->entry.tag = tag;
        e->entry.size = size;
        e->entry.iov = e->iov;
        e->entry.desc = e->desc;
        e->owner = this;
        return e;
    }
    void fill(OwnerRxEntry *e) {
        e->iov[0] = buf_iov;
        e->entry.count = 1;
        e->entry.context = &recv_context;
        e->entry.flags = FI_RECV | FI_TAGGED | FI_COMPLETION;
    }
    int get(fi_addr_t addr, uint64_t tag, size_t size, fi_peer_rx_entry **out) {
        got_addr = addr;
        got_tag = tag;
        OwnerRxEntry *e = entry(addr, tag, size);
        *out = &e->entry;
        if (!posted) return -FI_ENOENT;
        fill(e);
        return 0;
    }
    int peer_get_msg(fi_addr_t addr, size_t size, fi_peer_rx_entry **e) override {
        return get(addr, 0, size, e);
    }
    int peer_get_tag(fi_addr_t addr, uint64_t tag, fi_peer_rx_entry **e) override {
        return get(addr, tag, 0, e);
    }
    int peer_queue_msg(fi_peer_rx_entry *e) override { return queued = e, 0; }
    int peer_queue_tag(fi_peer_rx_entry *e) override { return queued = e, 0; }
    void peer_free_entry(fi_peer_rx_entry *e) override { freed = e; }
    void peer_foreach_unspec_addr(const std::function<void(fi_peer_rx_entry *)> &fn) override {
        for (OwnerRxEntry *e : entries)
            if (e->entry.addr == FI_ADDR_UNSPEC) fn(&e->entry);
    }
    ~FakeOwner() {
        for (auto *e : entries) delete e;
    }
};

// What the fake peer's start_tag saw.
void *g_started = nullptr;
int start(fi_peer_rx_entry *e) {
    g_started = e;
    return 0;
}
int discard(fi_peer_rx_entry *) {
    return 0;
}
fi_ops_srx_peer g_peer_ops = {sizeof(fi_ops_srx_peer), start, start, discard, discard};

// The peer's side of one layout: its entry type and its owner ops table.
template <SrxAbi Abi>
struct PeerOf {
    using Entry = std::conditional_t<Abi == SrxAbi::V2_3, RxEntryUnlinked, RxEntryLinked>;
    using Ops = std::conditional_t<Abi == SrxAbi::V1_19, SrxOwnerOps1_19, SrxOwnerOps2_0>;
    static Ops *ops(ExportedSrx &srx) { return reinterpret_cast<Ops *>(srx.fid()->owner_ops); }
    // get_tag as the peer calls it: the 1.19 form names the source and tag, 2.0's a match
    // attribute that carries the size too.
    static int get_tag(ExportedSrx &srx, fi_addr_t addr, uint64_t tag, size_t size, Entry **e) {
        void *out = nullptr;
        int ret;
        if constexpr (Abi == SrxAbi::V1_19) {
            ret = ops(srx)->get_tag(srx.fid(), addr, tag, &out);
        } else {
            MatchAttr attr{addr, size, tag};
            ret = ops(srx)->get_tag(srx.fid(), &attr, &out);
        }
        *e = static_cast<Entry *>(out);
        return ret;
    }
};

template <class T>
class ForeignSrx : public ::testing::Test {};
template <SrxAbi A>
struct AbiTag {
    static constexpr SrxAbi value = A;
};
using Layouts = ::testing::Types<AbiTag<SrxAbi::V1_19>, AbiTag<SrxAbi::V2_0>, AbiTag<SrxAbi::V2_3>>;
TYPED_TEST_SUITE(ForeignSrx, Layouts);

// A receive posted first: the peer finds its buffer, context and flags where its release keeps
// them, and frees the entry it was given.
TYPED_TEST(ForeignSrx, ExpectedMessageFindsTheBufferInThePeersLayout) {
    using P = PeerOf<TypeParam::value>;
    FakeOwner owner;
    ExportedSrx srx(owner, TypeParam::value);
    owner.srx = &srx;
    owner.posted = true;
    typename P::Entry *e = nullptr;
    ASSERT_EQ(P::get_tag(srx, 5, 0x77, 12, &e), 0);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(owner.got_addr, 5u);
    EXPECT_EQ(owner.got_tag, 0x77u);
    EXPECT_EQ(e->srx, srx.fid());
    EXPECT_EQ(e->count, 1u);
    EXPECT_EQ(e->iov[0].iov_base, owner.buffer);
    EXPECT_EQ(e->iov[0].iov_len, sizeof owner.buffer);
    EXPECT_EQ(e->context, &owner.recv_context);
    EXPECT_EQ(e->flags, uint64_t(FI_RECV | FI_TAGGED | FI_COMPLETION));
    EXPECT_EQ(e->tag, 0x77u);
    P::ops(srx)->free_entry(e);
    EXPECT_EQ(owner.freed, &owner.entries[0]->entry);
}

// The message first: what the peer writes into the entry it queues reaches the owner, and the
// owner's later start hands the peer the same entry, now with the buffer.
TYPED_TEST(ForeignSrx, QueuedMessageCarriesThePeersFieldsAndStartsInItsLayout) {
    using P = PeerOf<TypeParam::value>;
    FakeOwner owner;
    ExportedSrx srx(owner, TypeParam::value);
    owner.srx = &srx;
    srx.fid()->peer_ops = &g_peer_ops;
    typename P::Entry *e = nullptr;
    ASSERT_EQ(P::get_tag(srx, 9, 0x42, 24, &e), -FI_ENOENT);
    ASSERT_NE(e, nullptr);
    int peer_message = 0;
    e->peer_context = &peer_message;
    e->size = 24;
    e->cq_data = 0xdada;
    e->flags = FI_REMOTE_CQ_DATA;
    ASSERT_EQ(P::ops(srx)->queue_tag(e), 0);
    fi_peer_rx_entry *native = &owner.entries[0]->entry;
    ASSERT_EQ(owner.queued, native);
    EXPECT_EQ(native->peer_context, &peer_message);
    EXPECT_EQ(native->size, 24u);
    EXPECT_EQ(native->flags, uint64_t(FI_REMOTE_CQ_DATA));
    EXPECT_EQ(owner.entries[0]->cq_data, 0xdadau);
    // A receive posted later: the owner fills its own entry and starts it.
    owner.fill(owner.entries[0]);
    g_started = nullptr;
    ASSERT_EQ(srx.start(native, true), 0);
    ASSERT_EQ(g_started, e);
    EXPECT_EQ(e->iov[0].iov_base, owner.buffer);
    EXPECT_EQ(e->context, &owner.recv_context);
    EXPECT_EQ(e->peer_context, &peer_message);
}

// A source not in the AV when the message came: the peer names it when asked.
fi_addr_t name_source(void *) {
    return 31;
}
TYPED_TEST(ForeignSrx, ForeachUnspecAddrLetsThePeerNameTheSource) {
    using P = PeerOf<TypeParam::value>;
    FakeOwner owner;
    ExportedSrx srx(owner, TypeParam::value);
    owner.srx = &srx;
    typename P::Entry *e = nullptr;
    ASSERT_EQ(P::get_tag(srx, FI_ADDR_UNSPEC, 1, 8, &e), -FI_ENOENT);
    ASSERT_EQ(P::ops(srx)->queue_tag(e), 0);
    P::ops(srx)->foreach_unspec_addr(srx.fid(), name_source);
    EXPECT_EQ(owner.entries[0]->entry.addr, 31u);
}

// 2.0's get_tag tells the size of a tagged message, which 1.x's did not.
TEST(ForeignSrx2_0, GetTagRecordsTheMessageSize) {
    using P = PeerOf<SrxAbi::V2_0>;
    FakeOwner owner;
    ExportedSrx srx(owner, SrxAbi::V2_0);
    owner.srx = &srx;
    P::Entry *e = nullptr;
    ASSERT_EQ(P::get_tag(srx, 3, 4, 4096, &e), -FI_ENOENT);
    EXPECT_EQ(owner.entries[0]->entry.size, 4096u);
    EXPECT_EQ(e->size, 4096u);
}

TEST(SrxAbi, ChosenByTheCoresRelease) {
    EXPECT_EQ(srx_abi_of(FI_VERSION(1, 17)), SrxAbi::V1_17);
    EXPECT_EQ(srx_abi_of(FI_VERSION(1, 18)), SrxAbi::V1_17);
    EXPECT_EQ(srx_abi_of(FI_VERSION(1, 19)), SrxAbi::V1_19);
    EXPECT_EQ(srx_abi_of(FI_VERSION(1, 22)), SrxAbi::V1_19);
    EXPECT_EQ(srx_abi_of(FI_VERSION(2, 0)), SrxAbi::V2_0);
    EXPECT_EQ(srx_abi_of(FI_VERSION(2, 2)), SrxAbi::V2_0);
    EXPECT_EQ(srx_abi_of(FI_VERSION(2, 3)), SrxAbi::V2_3);
    EXPECT_EQ(srx_abi_of(FI_VERSION(2, 6)), SrxAbi::V2_3);
}

}  // namespace
}  // namespace tandem::peer

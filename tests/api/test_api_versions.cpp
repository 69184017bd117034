// One tandem for every libfabric from 1.17 to 2.6 (docs/compatibility.md): the API version
// tandem declares, fi_getinfo's answers by the version the application asked for (what
// fabric.h's capability bits mean in it), and endpoints that keep those meanings.
//
// - Provider.*: the provider's own entry points, loaded from FI_PROVIDER_PATH as the core
//   loads them, so that a version newer than the system core's can be asked for here too
//   (the core refuses to pass on a version newer than itself).
// - Receives.*: endpoints through the core. Under a core of 2.0 or later the test asks for
//   API 2.0 as an application of that release would; under an older core it takes the 1.17
//   answer and marks it answered for 2.0 (fabric_attr->api_version, which the core fills
//   with the version asked for), which is what the endpoint reads. The outcome asserted is
//   the same either way.
#include "fabric_fixture.h"
#include "../common/rdm_endpoint.h"
#include "common/fabric_compat.h"

#include <dlfcn.h>

#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_prov.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace tandem_test {
namespace {

// The 2.0 capability bits (fabric.h of libfabric 2.0; 1.17's headers give bits 45 and 46 other
// names and bit 48 FI_VARIABLE_MSG), and 1.x's FI_XPU_TRIGGER, removed in 1.21.
constexpr uint64_t kTaggedDirectedRecv = 1ull << 45;
constexpr uint64_t kTaggedMultiRecv = 1ull << 46;
constexpr uint64_t kExactDirectedRecv = 1ull << 48;
constexpr uint64_t kXpuTrigger = 1ull << 44;

// tandem's fi_provider, from the library the core would load.
fi_provider *tandem_provider() {
    const char *dir = getenv("FI_PROVIDER_PATH");
    if (!dir) return nullptr;
    std::string path = std::string(dir) + "/libtandem-fi.so";
    void *lib = dlopen(path.c_str(), RTLD_NOW);
    if (!lib) return nullptr;
    auto ini = reinterpret_cast<fi_provider *(*)()>(dlsym(lib, "fi_prov_ini"));
    return ini ? ini() : nullptr;
}

InfoPtr rdm_hints(uint64_t caps) {
    InfoPtr h = alloc_hints();
    h->ep_attr->type = FI_EP_RDM;
    h->caps = caps;
    return h;
}

// The provider's answer for hints at API version `version`: its error, or its first entry.
int provider_getinfo(uint32_t version, const fi_info *hints, InfoPtr *out) {
    fi_provider *prov = tandem_provider();
    if (!prov) return -FI_ENOSYS;
    fi_info *info = nullptr;
    int ret = prov->getinfo(version, "127.0.0.1", nullptr, 0, hints, &info);
    out->reset(info);
    return ret;
}

// The core these tests run under is the one the caller named (scripts/test-libfabric2.sh runs
// the suites under libfabric 2.6 with TANDEM_EXPECT_CORE=2.6): without it, a wrong library
// path would run them under the system's 1.17 and prove nothing about 2.6.
TEST(Core, IsTheOneNamed) {
    const char *named = getenv("TANDEM_EXPECT_CORE");
    if (!named) GTEST_SKIP() << "TANDEM_EXPECT_CORE not set (set by scripts/test-libfabric2.sh)";
    unsigned major = 0, minor = 0;
    ASSERT_EQ(sscanf(named, "%u.%u", &major, &minor), 2) << named;
    EXPECT_EQ(fi_version(), FI_VERSION(major, minor))
        << "running under libfabric " << FI_MAJOR(fi_version()) << "." << FI_MINOR(fi_version());
}

TEST(Provider, DeclaresTheNewestApiItImplements) {
    fi_provider *prov = tandem_provider();
    ASSERT_NE(prov, nullptr) << "no libtandem-fi.so in FI_PROVIDER_PATH";
    EXPECT_EQ(prov->fi_version, FI_VERSION(2, 6));
}

TEST(Provider, TaggedDirectedRecvGrantedWhenAskedFrom2_0) {
    InfoPtr hints = rdm_hints(FI_TAGGED | FI_SEND | FI_RECV | kTaggedDirectedRecv);
    InfoPtr info;
    ASSERT_FI_OK(provider_getinfo(FI_VERSION(2, 0), hints.get(), &info));
    EXPECT_EQ(info->caps & kTaggedDirectedRecv, kTaggedDirectedRecv);
    EXPECT_EQ(info->rx_attr->caps & kTaggedDirectedRecv, kTaggedDirectedRecv);
    EXPECT_EQ(info->tx_attr->caps & kTaggedDirectedRecv, 0u) << "a receive capability";
    EXPECT_EQ(info->fabric_attr->api_version, FI_VERSION(2, 0));
}

TEST(Provider, ExactDirectedRecvGrantedWhenAskedFrom2_0) {
    InfoPtr hints = rdm_hints(FI_TAGGED | FI_MSG | kExactDirectedRecv);
    InfoPtr info;
    ASSERT_FI_OK(provider_getinfo(FI_VERSION(2, 6), hints.get(), &info));
    EXPECT_EQ(info->caps & kExactDirectedRecv, kExactDirectedRecv);
}

// The same bit is FI_HMEM_HOST_ALLOC to an application of API 1.x: no endpoint capability.
TEST(Provider, Bit45IsNoCapabilityBefore2_0) {
    InfoPtr hints = rdm_hints(FI_TAGGED | kTaggedDirectedRecv);
    InfoPtr info;
    EXPECT_EQ(provider_getinfo(FI_VERSION(1, 22), hints.get(), &info), -FI_ENODATA);
}

// Asked for nothing of 2.0's, an application of 2.0 gets none of it: each narrows matching.
TEST(Provider, ReceiveNarrowingCapsNeverOfferedUnasked) {
    InfoPtr hints = rdm_hints(0);
    InfoPtr info;
    ASSERT_FI_OK(provider_getinfo(FI_VERSION(2, 6), hints.get(), &info));
    for (fi_info *fi = info.get(); fi; fi = fi->next)
        EXPECT_EQ(fi->caps & (kTaggedDirectedRecv | kExactDirectedRecv | kTaggedMultiRecv), 0u);
}

TEST(Provider, TaggedMultiRecvGrantedWhenAskedFrom2_0) {
    InfoPtr hints = rdm_hints(FI_TAGGED | FI_RECV | kTaggedMultiRecv);
    InfoPtr info;
    ASSERT_FI_OK(provider_getinfo(FI_VERSION(2, 0), hints.get(), &info));
    EXPECT_EQ(info->caps & kTaggedMultiRecv, kTaggedMultiRecv);
    EXPECT_EQ(info->rx_attr->caps & kTaggedMultiRecv, kTaggedMultiRecv);
}

// Bit 46 is FI_HMEM_DEVICE_ONLY's value to an application of API 1.x: no capability.
TEST(Provider, Bit46IsNoCapabilityBefore2_0) {
    InfoPtr hints = rdm_hints(FI_TAGGED | kTaggedMultiRecv);
    InfoPtr info;
    EXPECT_EQ(provider_getinfo(FI_VERSION(1, 22), hints.get(), &info), -FI_ENODATA);
}

// Bit 44 was FI_XPU_TRIGGER up to 1.20 and names nothing from 1.21.
TEST(Provider, XpuTriggerBitRefusedFrom1_21) {
    InfoPtr hints = rdm_hints(FI_TAGGED | FI_TRIGGER | kXpuTrigger);
    InfoPtr info;
    EXPECT_EQ(provider_getinfo(FI_VERSION(1, 21), hints.get(), &info), -FI_ENODATA);
}

// An RDM endpoint on 127.0.0.1 answered for API 2.0 with `caps`, its CQ and AV.
struct Receiver : RdmEndpoint {
    void open(uint64_t caps) {
        InfoPtr hints = rdm_hints(caps);
        hints->fabric_attr->prov_name = strdup(provider_name());
        if (fi_version() >= FI_VERSION(2, 0)) {
            fi_info *list = nullptr;
            ASSERT_FI_OK(fi_getinfo(FI_VERSION(2, 0), "127.0.0.1", nullptr, 0, hints.get(), &list));
            for (fi_info *i = list; i && !info; i = i->next)
                if (is_own(i)) info = fi_dupinfo(i);
            fi_freeinfo(list);
            ASSERT_NE(info, nullptr) << "no " << provider_name() << " entry for API 2.0";
        } else {
            // What tandem answers a 2.0 application (Provider.* above), as the core that cannot
            // ask for it would have recorded it.
            constexpr uint64_t kOf2_0 = kTaggedDirectedRecv | kExactDirectedRecv | kTaggedMultiRecv;
            hints->caps &= ~kOf2_0;
            InfoPtr raw;
            ASSERT_FI_OK(getinfo_own("127.0.0.1", nullptr, 0, hints.get(), &raw));
            info = fi_dupinfo(raw.get());
            info->caps = caps;
            info->rx_attr->caps |= caps & kOf2_0;
            info->fabric_attr->api_version = FI_VERSION(2, 0);
        }
        ASSERT_EQ(info->caps & caps, caps);
        std::string why;
        ASSERT_TRUE(try_open_info(why)) << why;
    }
    ~Receiver() { close(); }
};

// The context of the next completion on r's CQ, progressing the senders meanwhile.
void *next_completion(Receiver &r, Receiver &s1, Receiver &s2) {
    fi_cq_tagged_entry e{};
    for (int i = 0; i < 200000; ++i) {
        if (fi_cq_read(r.cq, &e, 1) == 1) return e.op_context;
        fi_cq_read(s1.cq, &e, 0);
        fi_cq_read(s2.cq, &e, 0);
    }
    return nullptr;
}

// FI_EXACT_DIRECTED_RECV: a receive that names no source is refused, one that names a source
// is posted.
TEST(Receives, ExactDirectedRecvRefusesAnUnnamedSource) {
    Receiver r, s;
    ASSERT_NO_FATAL_FAILURE(r.open(FI_MSG | FI_TAGGED | kExactDirectedRecv));
    ASSERT_NO_FATAL_FAILURE(s.open(FI_MSG | FI_TAGGED));
    fi_addr_t from_s = r.insert(s);
    char buf[8];
    EXPECT_EQ(fi_trecv(r.ep, buf, sizeof buf, nullptr, FI_ADDR_UNSPEC, 1, 0, nullptr), -FI_EINVAL);
    EXPECT_EQ(fi_recv(r.ep, buf, sizeof buf, nullptr, FI_ADDR_UNSPEC, nullptr), -FI_EINVAL);
    EXPECT_EQ(fi_trecv(r.ep, buf, sizeof buf, nullptr, from_s, 1, 0, nullptr), 0);
}

// FI_TAGGED_DIRECTED_RECV without FI_DIRECTED_RECV: tagged receives match by source, untagged
// ones do not (fi_getinfo(3)).
TEST(Receives, TaggedDirectedRecvDirectsTaggedReceivesOnly) {
    Receiver r, s1, s2;
    ASSERT_NO_FATAL_FAILURE(r.open(FI_MSG | FI_TAGGED | kTaggedDirectedRecv));
    ASSERT_NO_FATAL_FAILURE(s1.open(FI_MSG | FI_TAGGED));
    ASSERT_NO_FATAL_FAILURE(s2.open(FI_MSG | FI_TAGGED));
    fi_addr_t from_s1 = r.insert(s1);
    fi_addr_t r_at_s1 = s1.insert(r), r_at_s2 = s2.insert(r);
    char want_s1[8], any[8], plain[8], out[8] = "payload";
    int ctx_s1, ctx_any, ctx_plain;
    // Posted first, directed at s1: s2's message of the same tag must pass it by.
    ASSERT_FI_OK(fi_trecv(r.ep, want_s1, sizeof want_s1, nullptr, from_s1, 7, 0, &ctx_s1));
    ASSERT_FI_OK(fi_trecv(r.ep, any, sizeof any, nullptr, FI_ADDR_UNSPEC, 7, 0, &ctx_any));
    ASSERT_FI_OK(fi_tsend(s2.ep, out, sizeof out, nullptr, r_at_s2, 7, nullptr));
    EXPECT_EQ(next_completion(r, s1, s2), &ctx_any);
    ASSERT_FI_OK(fi_tsend(s1.ep, out, sizeof out, nullptr, r_at_s1, 7, nullptr));
    EXPECT_EQ(next_completion(r, s1, s2), &ctx_s1);
    // Untagged: directed at s1 in vain, s2's message takes it.
    ASSERT_FI_OK(fi_recv(r.ep, plain, sizeof plain, nullptr, from_s1, &ctx_plain));
    ASSERT_FI_OK(fi_send(s2.ep, out, sizeof out, nullptr, r_at_s2, nullptr));
    EXPECT_EQ(next_completion(r, s1, s2), &ctx_plain);
}

// FI_TAGGED_MULTI_RECV: one buffer posted with FI_MULTI_RECV on fi_trecvmsg takes the
// messages its tag matches, one after the other in the buffer, each completion with its own
// place, length and tag; a message of another tag goes by it to its own receive; the buffer
// is released, with FI_MULTI_RECV on the last completion, once less than FI_OPT_MIN_MULTI_RECV
// is left. An endpoint without the capability refuses such a receive.
// The multi-receive buffer of FI_TAGGED_MULTI_RECV, posted on rx (r's endpoint, or the shared
// receive context r's endpoint is bound to), takes the messages of s its tag matches.
void check_tagged_multi_recv(Receiver &r, fid_ep *rx, Receiver &s) {
    r.insert(s);
    fi_addr_t to_r = s.insert(r);
    const size_t min_left = 16;
    ASSERT_FI_OK(
        fi_setopt(&rx->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min_left, sizeof min_left));
    char pool[64], other[32];
    iovec iov{pool, sizeof pool};
    int ctx_pool, ctx_other;
    fi_msg_tagged msg{&iov, nullptr, 1, FI_ADDR_UNSPEC, 0x50, 0x0f, &ctx_pool, 0};
    ASSERT_FI_OK(fi_trecvmsg(rx, &msg, FI_MULTI_RECV));  // tags 0x50 to 0x5f
    ASSERT_FI_OK(fi_trecv(rx, other, sizeof other, nullptr, FI_ADDR_UNSPEC, 0x60, 0, &ctx_other));
    // 20 B each: three fill 60 of the 64 B, which leaves less than 16.
    const uint64_t tags[4] = {0x51, 0x60, 0x52, 0x5f};
    char out[4][20];
    for (int i = 0; i < 4; ++i) {
        memset(out[i], 'a' + i, sizeof out[i]);
        ASSERT_FI_OK(fi_tsend(s.ep, out[i], sizeof out[i], nullptr, to_r, tags[i], nullptr));
    }
    std::vector<fi_cq_tagged_entry> got;
    fi_cq_tagged_entry e{};
    for (int i = 0; i < 400000 && got.size() < 4; ++i) {
        if (fi_cq_read(r.cq, &e, 1) == 1) got.push_back(e);
        fi_cq_read(s.cq, &e, 0);
    }
    ASSERT_EQ(got.size(), 4u);
    size_t at = 0;
    for (const fi_cq_tagged_entry &c : got) {
        if (c.op_context == &ctx_other) {
            EXPECT_EQ(c.tag, 0x60u);
            EXPECT_EQ(memcmp(other, out[1], sizeof out[1]), 0);
            continue;
        }
        ASSERT_EQ(c.op_context, &ctx_pool);
        const int i = at == 0 ? 0 : at == 20 ? 2 : 3;  // the pool's messages, in order
        EXPECT_EQ(c.tag, tags[i]);
        EXPECT_EQ(c.len, 20u);
        EXPECT_EQ(c.buf, pool + at);
        EXPECT_EQ(memcmp(pool + at, out[i], 20), 0) << "the message at " << at;
        EXPECT_EQ((c.flags & FI_MULTI_RECV) != 0, at == 40) << "released after the third";
        EXPECT_TRUE(c.flags & FI_TAGGED);
        at += 20;
    }
    EXPECT_EQ(at, 60u);
}

TEST(Receives, TaggedMultiRecvPacksTheMessagesItsTagMatches) {
    Receiver r, s;
    ASSERT_NO_FATAL_FAILURE(r.open(FI_MSG | FI_TAGGED | kTaggedMultiRecv));
    ASSERT_NO_FATAL_FAILURE(s.open(FI_MSG | FI_TAGGED));
    ASSERT_NO_FATAL_FAILURE(check_tagged_multi_recv(r, r.ep, s));

    char pool[64];
    iovec iov{pool, sizeof pool};
    fi_msg_tagged plain{&iov, nullptr, 1, FI_ADDR_UNSPEC, 0x50, 0, nullptr, 0};
    EXPECT_EQ(fi_trecvmsg(s.ep, &plain, FI_MULTI_RECV), -FI_EINVAL) << "without the capability";
}

// The same on a shared receive context (FI_SHARED_CONTEXT), which takes its capabilities from
// the rx_attr it is opened with; one opened without the capability refuses the buffer.
struct SrxReceiver : Receiver {
    fid_ep *srx = nullptr;
    void open_with_srx(uint64_t caps, uint64_t srx_caps) {
        before_enable = [this, srx_caps](fid_ep *e) {
            fi_rx_attr attr = *info->rx_attr;
            attr.caps = srx_caps;
            ASSERT_FI_OK(fi_srx_context(domain, &attr, &srx, nullptr));
            ASSERT_FI_OK(fi_ep_bind(e, &srx->fid, 0));
        };
        ASSERT_NO_FATAL_FAILURE(open(caps));
        ASSERT_NE(srx, nullptr);
    }
    ~SrxReceiver() {
        if (ep) fi_close(&ep->fid);
        ep = nullptr;
        if (srx) fi_close(&srx->fid);
    }
};

TEST(Receives, TaggedMultiRecvOnASharedReceiveContext) {
    constexpr uint64_t kCaps = FI_MSG | FI_TAGGED | kTaggedMultiRecv;
    SrxReceiver r, plain;
    Receiver s;
    ASSERT_NO_FATAL_FAILURE(r.open_with_srx(kCaps, kCaps | FI_RECV));
    ASSERT_NO_FATAL_FAILURE(s.open(FI_MSG | FI_TAGGED));
    ASSERT_NO_FATAL_FAILURE(check_tagged_multi_recv(r, r.srx, s));

    ASSERT_NO_FATAL_FAILURE(plain.open_with_srx(kCaps, (kCaps & ~kTaggedMultiRecv) | FI_RECV));
    char pool[64];
    iovec iov{pool, sizeof pool};
    fi_msg_tagged msg{&iov, nullptr, 1, FI_ADDR_UNSPEC, 0x50, 0, nullptr, 0};
    EXPECT_EQ(fi_trecvmsg(plain.srx, &msg, FI_MULTI_RECV), -FI_EINVAL)
        << "a context opened without the capability";
}

// fi_av_set_user_id by 1.20's fi_ops_av (1.17's headers lack the entry): the table's size
// says whether it is there, as the core's inline function checks.
int set_user_id(fid_av *av, fi_addr_t addr, fi_addr_t id, uint64_t flags) {
    auto *ops = reinterpret_cast<const tandem::compat::AvOps1_20 *>(av->ops);
    if (ops->size < sizeof *ops || !ops->set_user_id) return -FI_ENOSYS;
    return ops->set_user_id(av, addr, id, flags);
}

// A message from s to r; the source r's CQ names for it.
fi_addr_t source_of_next(Receiver &r, Receiver &s, fi_addr_t r_at_s, uint64_t tag) {
    char in[8], out[8] = "payload";
    EXPECT_EQ(fi_trecv(r.ep, in, sizeof in, nullptr, FI_ADDR_UNSPEC, tag, 0, nullptr), 0);
    EXPECT_EQ(fi_tsend(s.ep, out, sizeof out, nullptr, r_at_s, tag, nullptr), 0);
    fi_cq_tagged_entry e{};
    fi_addr_t src = 0x5eed;  // (what no outcome is)
    for (int i = 0; i < 400000; ++i) {
        if (fi_cq_readfrom(r.cq, &e, 1, &src) == 1) return src;
        fi_cq_read(s.cq, &e, 0);
    }
    ADD_FAILURE() << "no completion for tag " << tag;
    return src;
}

// An AV opened with FI_AV_USER_ID (2.0): a source without a user ID is FI_ADDR_NOTAVAIL, one
// given an ID by fi_av_set_user_id is named by it; per-insert IDs are refused on such an AV,
// and fi_av_set_user_id on any other AV, or for an entry the AV does not hold.
TEST(Receives, AnAvOpenedWithUserIdsNamesSourcesByTheIdsSetLater) {
    Receiver r, s;
    r.av_flags = FI_AV_USER_ID;
    ASSERT_NO_FATAL_FAILURE(r.open(FI_MSG | FI_TAGGED | FI_SOURCE));
    ASSERT_NO_FATAL_FAILURE(s.open(FI_MSG | FI_TAGGED));
    fi_addr_t from_s = r.insert(s);
    fi_addr_t r_at_s = s.insert(r);
    EXPECT_EQ(source_of_next(r, s, r_at_s, 1), FI_ADDR_NOTAVAIL) << "no user ID yet";
    ASSERT_EQ(set_user_id(r.av, from_s, 0x1d5, 0), 0);
    EXPECT_EQ(source_of_next(r, s, r_at_s, 2), fi_addr_t(0x1d5));

    EXPECT_EQ(set_user_id(r.av, from_s + 100, 0x1d6, 0), -FI_EINVAL) << "no such entry";
    EXPECT_EQ(set_user_id(s.av, r_at_s, 0x1d7, 0), -FI_EINVAL) << "an AV opened without";
    char name[64];
    size_t len = sizeof name;
    ASSERT_EQ(fi_getname(&s.ep->fid, name, &len), 0);
    fi_addr_t id = 0x1d8;
    EXPECT_EQ(fi_av_insert(r.av, name, 1, &id, FI_AV_USER_ID, nullptr), -FI_EINVAL)
        << "a per-insert ID on an AV opened with FI_AV_USER_ID";
}

// The size options of 1.22 (fi_endpoint(3)), by value: 1.17's headers do not name them.
constexpr int kOptMaxMsgSize = 12, kOptMaxTaggedSize = 13, kOptMaxRmaSize = 14,
              kOptMaxAtomicSize = 15, kOptInjectMsgSize = 16, kOptInjectTaggedSize = 17,
              kOptInjectAtomicSize = 19;

size_t get_size(fid_ep *ep, int optname) {
    size_t value = 0, len = sizeof value;
    EXPECT_EQ(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, optname, &value, &len), 0) << optname;
    EXPECT_EQ(len, sizeof value);
    return value;
}

// Each limit starts at the endpoint's attribute: max_msg_size, inject_size.
TEST(SizeOptions, StartAtTheEndpointsAttributes) {
    RdmEndpoint e;
    ASSERT_NO_FATAL_FAILURE(e.open(FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC));
    EXPECT_EQ(get_size(e.ep, kOptMaxMsgSize), e.info->ep_attr->max_msg_size);
    EXPECT_EQ(get_size(e.ep, kOptMaxRmaSize), e.info->ep_attr->max_msg_size);
    EXPECT_EQ(get_size(e.ep, kOptInjectMsgSize), e.info->tx_attr->inject_size);
    // (An atomic carries at most what the largest one takes, FI_OPT_MAX_ATOMIC_SIZE.)
    EXPECT_EQ(get_size(e.ep, kOptInjectAtomicSize),
              std::min(e.info->tx_attr->inject_size, get_size(e.ep, kOptMaxAtomicSize)));
    size_t above = e.info->ep_attr->max_msg_size + 1;
    EXPECT_EQ(fi_setopt(&e.ep->fid, FI_OPT_ENDPOINT, kOptMaxMsgSize, &above, sizeof above),
              -FI_EINVAL);
    e.close();
}

// A lowered limit holds for its kind of operation and no other: an untagged send above it is
// -FI_EMSGSIZE (node-local, where small sends take the shortest path, and over the link),
// a tagged one of the same size is posted.
TEST(SizeOptions, LoweredLimitsHoldForTheirKindOnly) {
    RdmEndpoint r, s;
    ASSERT_NO_FATAL_FAILURE(r.open());
    ASSERT_NO_FATAL_FAILURE(s.open());
    fi_addr_t to_r = s.insert(r);
    size_t max_msg = 512, inject_msg = 8;
    ASSERT_EQ(fi_setopt(&s.ep->fid, FI_OPT_ENDPOINT, kOptMaxMsgSize, &max_msg, sizeof max_msg), 0);
    ASSERT_EQ(
        fi_setopt(&s.ep->fid, FI_OPT_ENDPOINT, kOptInjectMsgSize, &inject_msg, sizeof inject_msg),
        0);
    EXPECT_EQ(get_size(s.ep, kOptMaxMsgSize), max_msg);
    EXPECT_EQ(get_size(s.ep, kOptMaxTaggedSize), s.info->ep_attr->max_msg_size);
    char buf[1024] = {};
    EXPECT_EQ(fi_send(s.ep, buf, 1024, nullptr, to_r, nullptr), -FI_EMSGSIZE);
    EXPECT_EQ(fi_inject(s.ep, buf, 16, to_r), -FI_EMSGSIZE);
    EXPECT_EQ(get_size(s.ep, kOptInjectTaggedSize), s.info->tx_attr->inject_size);
    EXPECT_EQ(fi_tinject(s.ep, buf, 16, to_r, 1), 0);
    EXPECT_EQ(fi_inject(s.ep, buf, 8, to_r), 0);
    r.close();
    s.close();
}

}  // namespace
}  // namespace tandem_test

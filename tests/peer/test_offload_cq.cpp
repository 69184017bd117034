// off_tandem writing its completions into an owner's CQ that is full for a while: the peer
// CQ's write (or writeerr) answers -FI_EAGAIN, and off_tandem must keep the completion and
// write it again later, never drop it (fi_peer(3) leaves CQ overflow to the owner; the
// system shm provider keeps the response queued until the write succeeds).
//
// The owner here is the test itself: its own fid_peer_cq, which refuses every completion's
// first attempt, and two owner endpoints of its own (just enough of a fid_ep for the twin:
// a name, and a tagged receive that is accepted and never completes), over tandem's AV and
// SRX (exported, fi_export_fid) so that addressing and matching are real. Like tandem, each
// owner endpoint lends its twin a node-local channel (peer::OffloadOps::attach) that
// reads the AV, here with fi_av_lookup.
#include <gtest/gtest.h>

#include "main_prov/shm/channel.h"
#include "peer/offload_ops.h"
#include "peer/peer_abi.h"
#include "tests/common/owner_cq.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include "tests/common/peer_structs.h"
#include <rdma/fi_tagged.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace {

constexpr uint64_t kOffloadProvOnly = 1ull << 61;  // OFI_OFFLOAD_PROV_ONLY (core-internal)

using tandem_test::OwnerCq;  // (refusing every other call: each completion is refused once)
static_assert(offsetof(OwnerCq, cq) == 0);

// An owner endpoint: its name (127.0.0.1 and a port held by a socket of ours, so no other
// endpoint has the same name) and a tagged receive the twin may post.
struct OwnerEp {
    fid_ep ep{};
    fi_ops fops{};
    fi_ops_cm cm{};
    fi_ops_tagged tagged{};
    sockaddr_in name{};
    int port_holder = -1;

    bool open() {
        port_holder = socket(AF_INET, SOCK_STREAM, 0);
        name.sin_family = AF_INET;
        name.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof name;
        if (port_holder < 0 || bind(port_holder, (sockaddr *)&name, sizeof name) != 0 ||
            getsockname(port_holder, (sockaddr *)&name, &len) != 0)
            return false;
        fops.size = sizeof fops;
        fops.ops_open = [](fid *, const char *, uint64_t, void **, void *) { return -FI_ENOSYS; };
        cm.size = sizeof cm;
        cm.getname = [](fid_t fid, void *addr, size_t *addrlen) {
            auto *self = reinterpret_cast<OwnerEp *>(fid);
            size_t room = *addrlen;
            *addrlen = sizeof self->name;
            if (room < sizeof self->name) return -FI_ETOOSMALL;
            memcpy(addr, &self->name, sizeof self->name);
            return 0;
        };
        tagged.size = sizeof tagged;
        tagged.recvmsg = [](fid_ep *, const fi_msg_tagged *, uint64_t) -> ssize_t { return 0; };
        ep.fid.fclass = FI_CLASS_EP;
        ep.fid.ops = &fops;
        ep.cm = &cm;
        ep.tagged = &tagged;
        return true;
    }
    ~OwnerEp() {
        if (port_holder >= 0) close(port_holder);
    }
};
static_assert(offsetof(OwnerEp, ep) == 0);

// tandem's AV as an owner's channel reads it: fi_av_lookup, and the reverse over the addresses
// this test inserted (nothing kept between calls: no version word).
struct AvLookups final : tandem::shm::AddressBook {
    fid_av *av = nullptr;
    std::vector<std::pair<fi_addr_t, sockaddr_in>> inserted;
    const std::atomic<uint64_t> *version_word() const override { return nullptr; }
    int lookup(fi_addr_t addr, void *buf, size_t *addrlen) const override {
        return fi_av_lookup(av, addr, buf, addrlen);
    }
    fi_addr_t addr_of(const void *addr, size_t addrlen) const override {
        for (const auto &[fi_addr, name] : inserted)
            if (addrlen == sizeof name && memcmp(addr, &name, addrlen) == 0) return fi_addr;
        return FI_ADDR_NOTAVAIL;
    }
};
// The channel an owner endpoint lends its twin.
struct LentChannel {
    tandem::shm::Sender sender;
    tandem::shm::Channel channel;
    explicit LentChannel(const AvLookups &book) : channel(sender, book) {}
};

// tandem's domain, AV and SRX; off_tandem's domain over it, importing them, and the owner's CQ.
class OffloadCqTest : public ::testing::Test {
  protected:
    void SetUp() override {
        fi_info *hints = fi_allocinfo();
        hints->ep_attr->type = FI_EP_RDM;
        hints->caps = FI_MSG | FI_TAGGED;
        hints->fabric_attr->prov_name = strdup("tandem");
        fi_info *all = nullptr;
        ASSERT_EQ(fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &all), 0);
        for (fi_info *fi = all; fi && !tinfo; fi = fi->next)
            if (strcmp(fi->fabric_attr->prov_name, "tandem") == 0) tinfo = fi_dupinfo(fi);
        fi_freeinfo(all);
        ASSERT_NE(tinfo, nullptr);
        hints->mode = FI_PEER_TRANSFER;
        free(hints->fabric_attr->prov_name);
        hints->fabric_attr->prov_name = strdup("off_tandem");
        ASSERT_EQ(fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, kOffloadProvOnly, hints, &oinfo),
                  0);
        fi_freeinfo(hints);
        ASSERT_EQ(fi_fabric(tinfo->fabric_attr, &tfab, nullptr), 0);
        ASSERT_EQ(fi_domain(tfab, tinfo, &tdom, nullptr), 0);
        ASSERT_EQ(fi_fabric(oinfo->fabric_attr, &ofab, nullptr), 0);
        fi_peer_domain_context dctx{sizeof dctx, tdom};
        ASSERT_EQ(fi_domain2(ofab, oinfo, &odom, FI_PEER, &dctx), 0);

        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        ASSERT_EQ(fi_av_open(tdom, &av_attr, &tav, nullptr), 0);
        book.av = tav;
        fid *exported = nullptr;
        ASSERT_EQ(fi_export_fid(&tav->fid, 0, &exported, nullptr), 0);
        fi_peer_av_context avctx{sizeof avctx, reinterpret_cast<decltype(avctx.av)>(exported)};
        fi_av_attr oav_attr{};
        oav_attr.flags = FI_PEER;
        ASSERT_EQ(fi_av_open(odom, &oav_attr, &oav, &avctx), 0);

        fi_rx_attr rx_attr = *tinfo->rx_attr;
        ASSERT_EQ(fi_srx_context(tdom, &rx_attr, &tsrx, nullptr), 0);
        ASSERT_EQ(fi_export_fid(&tsrx->fid, 0, &exported, nullptr), 0);
        fi_peer_srx_context srxctx{sizeof srxctx, reinterpret_cast<fid_peer_srx *>(exported)};
        fi_rx_attr orx_attr{};
        orx_attr.op_flags = FI_PEER;
        ASSERT_EQ(fi_srx_context(odom, &orx_attr, &osrx, &srxctx), 0);

        fi_peer_cq_context cqctx{sizeof cqctx, &owner_cq.cq};
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        cq_attr.flags = FI_PEER;
        ASSERT_EQ(fi_cq_open(odom, &cq_attr, &ocq, &cqctx), 0);
    }

    void TearDown() override {
        auto close = [](auto *&obj) {
            if (obj) {
                EXPECT_EQ(fi_close(&obj->fid), 0);
            }
            obj = nullptr;
        };
        for (fid_ep *&t : twin) close(t);
        close(osrx), close(oav), close(ocq), close(tsrx), close(tav);
        close(odom), close(ofab), close(tdom), close(tfab);
        fi_freeinfo(oinfo);
        fi_freeinfo(tinfo);
    }

    // The twin of owner endpoint i, bound and enabled, and the owner's address in tandem's AV;
    // lent a channel over that AV unless `lend` is false (an owner tandem did not build).
    void open_twin(int i, bool lend) {
        ASSERT_TRUE(owner[i].open());
        fi_peer_transfer_context tctx{sizeof tctx, oinfo, &owner[i].ep, nullptr};
        ASSERT_EQ(fi_endpoint2(odom, oinfo, &twin[i], FI_PEER_TRANSFER, &tctx), 0);
        if (lend) {
            void *ops = nullptr;
            ASSERT_EQ(fi_open_ops(&odom->fid, tandem::peer::kOffloadOpsName, 0, &ops, nullptr), 0);
            auto *table = static_cast<const tandem::peer::OffloadOps *>(ops);
            ASSERT_EQ(table->channel_bytes, sizeof(tandem::shm::Channel));
            lent[i] = std::make_unique<LentChannel>(book);
            ASSERT_EQ(table->attach(twin[i], &lent[i]->channel, nullptr), 0);
            EXPECT_EQ(table->attach(twin[i], &lent[i]->channel, nullptr), -FI_EOPBADSTATE);
        }
        ASSERT_EQ(fi_ep_bind(twin[i], &ocq->fid, FI_TRANSMIT | FI_RECV), 0);
        ASSERT_EQ(fi_ep_bind(twin[i], &oav->fid, 0), 0);
        ASSERT_EQ(fi_ep_bind(twin[i], &osrx->fid, 0), 0);
        ASSERT_EQ(fi_enable(twin[i]), 0);
        ASSERT_EQ(fi_av_insert(tav, &owner[i].name, 1, &addr[i], 0, nullptr), 1);
        book.inserted.emplace_back(addr[i], owner[i].name);
    }

    // The owner's progress: every completion, once (until `count` or 10 s), then 200 passes
    // that must write nothing more.
    void drive_until(size_t count) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (owner_cq.taken.size() < count && std::chrono::steady_clock::now() < deadline)
            ASSERT_EQ(fi_cq_read(ocq, nullptr, 0), 0);
        for (int i = 0; i < 200; ++i) ASSERT_EQ(fi_cq_read(ocq, nullptr, 0), 0);
    }

    // One 64 B tagged message from twin 0 to owner 1, its receive posted on tandem's SRX first.
    struct Message {
        char out[64], in[64] = {};
        int send_ctx = 0, recv_ctx = 0;
    };
    void post_and_send(Message &m, uint64_t tag) {
        memset(m.out, int('a' + tag % 26), sizeof m.out);
        ASSERT_EQ(fi_trecv(tsrx, m.in, sizeof m.in, nullptr, FI_ADDR_UNSPEC, tag, 0, &m.recv_ctx),
                  0);
        iovec iov{m.out, sizeof m.out};
        fi_msg_tagged msg{&iov, nullptr, 1, addr[1], tag, 0, &m.send_ctx, 0};
        ASSERT_EQ(fi_tsendmsg(twin[0], &msg, FI_COMPLETION), 0);
    }

    fi_info *tinfo = nullptr, *oinfo = nullptr;
    fid_fabric *tfab = nullptr, *ofab = nullptr;
    fid_domain *tdom = nullptr, *odom = nullptr;
    fid_av *tav = nullptr, *oav = nullptr;
    fid_ep *tsrx = nullptr, *osrx = nullptr;
    fid_cq *ocq = nullptr;
    OwnerCq owner_cq{true};  // (refusing every other call: each completion is refused once)
    AvLookups book;
    OwnerEp owner[2];
    fid_ep *twin[2] = {};
    fi_addr_t addr[2] = {FI_ADDR_NOTAVAIL, FI_ADDR_NOTAVAIL};
    std::unique_ptr<LentChannel> lent[2];  // (destroyed after TearDown closed the twins)
};

TEST_F(OffloadCqTest, CompletionsTheOwnersCqRefusesAreWrittenAgainNotDropped) {
    // Two twins: a sends, b receives.
    for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(open_twin(i, true));

    // Receives first (one of them too small: an error completion), then the messages.
    constexpr int kMessages = 6, kShort = 3;
    char out[kMessages][64], in[kMessages][64];
    int send_ctx[kMessages], recv_ctx[kMessages];
    for (int i = 0; i < kMessages; ++i) {
        memset(out[i], 'a' + i, sizeof out[i]);
        size_t room = i == kShort ? 16 : sizeof in[i];
        ASSERT_EQ(fi_trecv(tsrx, in[i], room, nullptr, FI_ADDR_UNSPEC, 0x100 + i, 0, &recv_ctx[i]),
                  0);
    }
    for (int i = 0; i < kMessages; ++i) {
        iovec iov{out[i], sizeof out[i]};
        fi_msg_tagged msg{&iov, nullptr, 1, addr[1], uint64_t(0x100 + i), 0, &send_ctx[i], 0};
        ASSERT_EQ(fi_tsendmsg(twin[0], &msg, FI_COMPLETION), 0);
    }
    ASSERT_NO_FATAL_FAILURE(drive_until(2 * kMessages));

    EXPECT_GE(owner_cq.refused, size_t(2 * kMessages));
    ASSERT_EQ(owner_cq.taken.size(), size_t(2 * kMessages))
        << "completions refused once by the owner's CQ were lost";
    int sends = 0, recvs = 0;
    for (const auto &e : owner_cq.taken) {
        if (e.flags & FI_SEND) {
            EXPECT_FALSE(e.err);
            EXPECT_EQ(e.context, &send_ctx[sends]) << "send completions out of order";
            ++sends;
            continue;
        }
        ASSERT_TRUE(e.flags & FI_RECV);
        EXPECT_EQ(e.context, &recv_ctx[recvs]) << "receive completions out of order";
        EXPECT_EQ(e.tag, uint64_t(0x100 + recvs));
        if (recvs == kShort) {
            EXPECT_TRUE(e.err);
            EXPECT_EQ(e.error, FI_ETRUNC);
        } else {
            EXPECT_FALSE(e.err);
            EXPECT_EQ(e.len, sizeof in[recvs]);
            EXPECT_EQ(e.src, addr[0]);
            EXPECT_EQ(memcmp(in[recvs], out[recvs], sizeof in[recvs]), 0);
        }
        ++recvs;
    }
    EXPECT_EQ(sends, kMessages);
    EXPECT_EQ(recvs, kMessages);
}

// An owner about to sleep asks its twins, through fi_trywait on their CQ (off_tandem's
// fabric), to arm their wake-ups: -FI_EAGAIN while a twin has work a pass must do (here a
// message in the receiver's inbox and completions the owner's CQ refused), 0 once it is done.
TEST_F(OffloadCqTest, TrywaitOnTheTwinsCqRefusesWhileATwinHasWorkPending) {
    for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(open_twin(i, true));
    fid *cq = &ocq->fid;
    EXPECT_EQ(fi_trywait(ofab, &cq, 1), 0) << "idle twins";

    Message m;
    ASSERT_NO_FATAL_FAILURE(post_and_send(m, 0x9));
    EXPECT_EQ(fi_trywait(ofab, &cq, 1), -FI_EAGAIN) << "a message waits, unread";

    ASSERT_NO_FATAL_FAILURE(drive_until(2));
    ASSERT_EQ(owner_cq.taken.size(), 2u);
    EXPECT_EQ(fi_trywait(ofab, &cq, 1), 0) << "everything delivered and completed";

    fid *not_ours = &tav->fid;
    EXPECT_EQ(fi_trywait(ofab, &not_ours, 1), -FI_EINVAL);
}

// An owner tandem did not build lends its twin no channel (fi_peer(3) has no such call): the
// twin makes one of its own, which cannot read the owner's AV (fi_peer(3)'s AV reads no
// entry). Its inbox is published under the owner's address, so a node-local peer reaches it,
// and the message's source is unknown to it; it reaches no peer itself.
TEST_F(OffloadCqTest, ATwinLentNoChannelIsReachedButReachesNoPeer) {
    ASSERT_NO_FATAL_FAILURE(open_twin(0, true));
    ASSERT_NO_FATAL_FAILURE(open_twin(1, false));

    Message m;
    ASSERT_NO_FATAL_FAILURE(post_and_send(m, 0x7));
    ASSERT_NO_FATAL_FAILURE(drive_until(2));
    ASSERT_EQ(owner_cq.taken.size(), 2u);
    const OwnerCq::Entry *recv = nullptr;
    for (const auto &e : owner_cq.taken) {
        EXPECT_FALSE(e.err);
        if (e.flags & FI_RECV) recv = &e;
    }
    ASSERT_NE(recv, nullptr);
    EXPECT_EQ(recv->context, &m.recv_ctx);
    EXPECT_EQ(recv->len, sizeof m.in);
    EXPECT_EQ(recv->src, FI_ADDR_NOTAVAIL) << "the twin's own channel reads no address";
    EXPECT_EQ(memcmp(m.in, m.out, sizeof m.in), 0);

    iovec iov{m.out, sizeof m.out};
    fi_msg_tagged back{&iov, nullptr, 1, addr[0], 0x7, 0, &m.send_ctx, 0};
    EXPECT_EQ(fi_tsendmsg(twin[1], &back, FI_COMPLETION), -FI_EHOSTUNREACH);
}

// tandem and off_tandem share one private extension, on the peer domain: every entry is there
// (an owner refuses a table smaller than its own; a null entry would crash it).
TEST_F(OffloadCqTest, ThePeerDomainHandsOneTableWithEveryEntry) {
    void *ops = nullptr;
    ASSERT_EQ(fi_open_ops(&odom->fid, tandem::peer::kOffloadOpsName, 0, &ops, nullptr), 0);
    const auto *t = static_cast<const tandem::peer::OffloadOps *>(ops);
    ASSERT_EQ(t->size, sizeof *t);
    const void *entries[] = {
        reinterpret_cast<const void *>(t->attach),
        reinterpret_cast<const void *>(t->take_cell),
        reinterpret_cast<const void *>(t->copy_ipc),
        reinterpret_cast<const void *>(t->export_ipc),
        reinterpret_cast<const void *>(t->coll_join),
        reinterpret_cast<const void *>(t->coll_post),
        reinterpret_cast<const void *>(t->coll_leave),
        reinterpret_cast<const void *>(t->trigger_queue),
        reinterpret_cast<const void *>(t->trigger_progress),
        reinterpret_cast<const void *>(t->trigger_pending),
        reinterpret_cast<const void *>(t->trigger_cancel),
        reinterpret_cast<const void *>(t->trigger_flush),
        reinterpret_cast<const void *>(t->trigger_flush_counter),
        reinterpret_cast<const void *>(t->trigger_discard_group),
        reinterpret_cast<const void *>(t->trigger_xpu_variable),
    };
    static_assert(sizeof entries / sizeof *entries * sizeof(void (*)()) ==
                      sizeof(tandem::peer::OffloadOps) - 2 * sizeof(size_t),
                  "an entry of peer::OffloadOps is missing here");
    for (size_t i = 0; i < sizeof entries / sizeof *entries; ++i)
        EXPECT_NE(entries[i], nullptr) << "entry " << i;
}

}  // namespace

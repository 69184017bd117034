// The peer objects between the two real providers, through the ABI only: tandem exports its
// objects (fi_export_fid), off_tandem imports them (FI_PEER), as fi_peer(3) describes. The
// data path over these objects (SRX flows, completions through the peer CQ) runs in every
// api.* test, which use the node-local path by default.
#include "tests/common/op_tables.h"

#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include "tests/common/peer_structs.h"
#include <rdma/fi_tagged.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <vector>

namespace {

// The core-internal flag that admits offload (off_*) providers (OFI_OFFLOAD_PROV_ONLY).
constexpr uint64_t kOffloadProvOnly = 1ull << 61;

fi_info *offload_info(uint64_t flags, uint64_t mode) {
    fi_info *hints = fi_allocinfo();
    hints->mode = mode;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_TAGGED;
    hints->fabric_attr->prov_name = strdup("off_tandem");
    fi_info *info = nullptr;
    int ret = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, flags, hints, &info);
    fi_freeinfo(hints);
    return ret ? nullptr : info;
}

class PeerObjects : public ::testing::Test {
  protected:
    void SetUp() override {
        fi_info *hints = fi_allocinfo();
        hints->ep_attr->type = FI_EP_RDM;
        hints->caps = FI_MSG | FI_TAGGED;
        hints->fabric_attr->prov_name = strdup("tandem");
        hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
        fi_info *all = nullptr;
        ASSERT_EQ(fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &all), 0);
        fi_freeinfo(hints);
        // The core lists "tandem;ofi_rxm" too: the owner here is tandem itself.
        for (fi_info *fi = all; fi && !tinfo_; fi = fi->next)
            if (strcmp(fi->fabric_attr->prov_name, "tandem") == 0) tinfo_ = fi_dupinfo(fi);
        fi_freeinfo(all);
        ASSERT_NE(tinfo_, nullptr);
        ASSERT_EQ(fi_fabric(tinfo_->fabric_attr, &tfab_, nullptr), 0);
        ASSERT_EQ(fi_domain(tfab_, tinfo_, &tdom_, nullptr), 0);

        oinfo_ = offload_info(kOffloadProvOnly, FI_PEER_TRANSFER);
        ASSERT_NE(oinfo_, nullptr) << "off_tandem not found with the offload-only flag";
        ASSERT_EQ(fi_fabric(oinfo_->fabric_attr, &ofab_, nullptr), 0);
        fi_peer_domain_context ctx{sizeof ctx, tdom_};
        ASSERT_EQ(fi_domain2(ofab_, oinfo_, &odom_, FI_PEER, &ctx), 0);
    }
    void TearDown() override {
        if (odom_) {
            EXPECT_EQ(fi_close(&odom_->fid), 0);
        }
        if (ofab_) {
            EXPECT_EQ(fi_close(&ofab_->fid), 0);
        }
        if (tdom_) {
            EXPECT_EQ(fi_close(&tdom_->fid), 0);
        }
        if (tfab_) {
            EXPECT_EQ(fi_close(&tfab_->fid), 0);
        }
        fi_freeinfo(oinfo_);
        fi_freeinfo(tinfo_);
    }

    fi_info *tinfo_ = nullptr, *oinfo_ = nullptr;
    fid_fabric *tfab_ = nullptr, *ofab_ = nullptr;
    fid_domain *tdom_ = nullptr, *odom_ = nullptr;
};

TEST(OffloadGetinfo, HiddenFromApplicationsAndAnswersOnlyPeerTransfer) {
    // An application's fi_getinfo never sees it ...
    EXPECT_EQ(offload_info(0, FI_PEER_TRANSFER), nullptr);
    // ... the owner finds it with the offload-only flag, and only with FI_PEER_TRANSFER.
    EXPECT_EQ(offload_info(kOffloadProvOnly, 0), nullptr);
    fi_info *info = offload_info(kOffloadProvOnly, FI_PEER_TRANSFER);
    ASSERT_NE(info, nullptr);
    EXPECT_STREQ(info->fabric_attr->prov_name, "off_tandem");
    EXPECT_TRUE(info->mode & FI_PEER_TRANSFER);
    EXPECT_EQ(info->ep_attr->type, FI_EP_RDM);
    fi_freeinfo(info);
}

TEST_F(PeerObjects, DomainOnlyAsPeerAndRegistersThroughOwner) {
    fid_domain *plain = nullptr;
    EXPECT_EQ(fi_domain(ofab_, oinfo_, &plain, nullptr), -FI_EINVAL);
    tandem_test::expect_complete_fabric("off_tandem fabric", ofab_);
    tandem_test::expect_complete_domain("off_tandem domain", odom_);
    static char buf[4096];
    fid_mr *mr = nullptr;
    ASSERT_EQ(fi_mr_reg(odom_, buf, sizeof buf, FI_REMOTE_WRITE, 0, 0, 0, &mr, nullptr), 0);
    // The region is the owner's: its fid is tandem's MR, keys and all.
    EXPECT_EQ(mr->fid.fclass, FI_CLASS_MR);
    EXPECT_NE(fi_mr_key(mr), FI_KEY_NOTAVAIL);
    EXPECT_EQ(fi_close(&mr->fid), 0);
}

TEST_F(PeerObjects, CqImportWritesGoToTandemCqAndPeerReadsAreEnosys) {
    fi_cq_attr attr{};
    attr.format = FI_CQ_FORMAT_TAGGED;
    fid_cq *tcq = nullptr;
    ASSERT_EQ(fi_cq_open(tdom_, &attr, &tcq, nullptr), 0);
    struct fid *exported = nullptr;
    ASSERT_EQ(fi_export_fid(&tcq->fid, 0, &exported, nullptr), 0);
    ASSERT_EQ(exported->fclass, FI_CLASS_PEER_CQ);
    auto *peer_cq = reinterpret_cast<fid_peer_cq *>(exported);
    tandem_test::expect_complete_table("tandem peer cq owner ops", peer_cq->owner_ops);

    fid_cq *ocq = nullptr;
    EXPECT_EQ(fi_cq_open(odom_, &attr, &ocq, nullptr), -FI_EINVAL);  // not a peer CQ
    fi_peer_cq_context ctx{sizeof ctx, peer_cq};
    attr.flags = FI_PEER;
    ASSERT_EQ(fi_cq_open(odom_, &attr, &ocq, &ctx), 0);
    tandem_test::expect_complete_cq("off_tandem cq", ocq);
    fi_cq_tagged_entry e{};
    EXPECT_EQ(fi_cq_read(ocq, &e, 1), -FI_ENOSYS);
    fi_cq_err_entry err{};
    EXPECT_EQ(fi_cq_readerr(ocq, &err, 0), -FI_ENOSYS);
    EXPECT_EQ(fi_cq_read(ocq, nullptr, 0), 0);  // the owner's way to drive progress

    // What the peer writes through the owner ops is the application's to read on tandem.
    char data[8];
    ASSERT_EQ(peer_cq->owner_ops->write(peer_cq, data, FI_RECV | FI_TAGGED, 8, data, 7, 0x99,
                                        FI_ADDR_NOTAVAIL),
              0);
    ASSERT_EQ(fi_cq_read(tcq, &e, 1), 1);
    EXPECT_EQ(e.op_context, data);
    EXPECT_EQ(e.flags, uint64_t(FI_RECV | FI_TAGGED));
    EXPECT_EQ(e.len, 8u);
    EXPECT_EQ(e.tag, 0x99u);
    fi_cq_err_entry w{};
    w.op_context = data;
    w.flags = FI_SEND;
    w.err = FI_EIO;
    w.prov_errno = FI_EIO;
    ASSERT_EQ(peer_cq->owner_ops->writeerr(peer_cq, &w), 0);
    EXPECT_EQ(fi_cq_read(tcq, &e, 1), -FI_EAVAIL);
    ASSERT_EQ(fi_cq_readerr(tcq, &err, 0), 1);
    EXPECT_EQ(err.err, FI_EIO);
    EXPECT_EQ(err.op_context, data);

    EXPECT_EQ(fi_close(&ocq->fid), 0);  // the importer's twin first (fi_peer(3))
    EXPECT_EQ(fi_close(&tcq->fid), 0);
}

TEST_F(PeerObjects, EqImportDeliversEventsOnTandemEq) {
    fi_eq_attr attr{};
    attr.wait_obj = FI_WAIT_NONE;
    fid_eq *teq = nullptr;
    ASSERT_EQ(fi_eq_open(tfab_, &attr, &teq, nullptr), 0);
    fid_eq *oeq = nullptr;
    EXPECT_EQ(fi_eq_open(ofab_, &attr, &oeq, nullptr), -FI_EINVAL);
    fi_peer_eq_context ctx{sizeof ctx, teq};
    attr.flags = FI_PEER;
    ASSERT_EQ(fi_eq_open(ofab_, &attr, &oeq, &ctx), 0);
    tandem_test::expect_complete_eq("off_tandem eq", oeq);
    fi_eq_entry in{};
    in.fid = &teq->fid;
    in.context = &in;
    in.data = 42;
    ASSERT_EQ(fi_eq_write(oeq, FI_NOTIFY, &in, sizeof in, 0), (ssize_t)sizeof in);
    uint32_t event = 0;
    fi_eq_entry out{};
    EXPECT_EQ(fi_eq_read(oeq, &event, &out, sizeof out, 0), -FI_ENOSYS);
    ASSERT_EQ(fi_eq_read(teq, &event, &out, sizeof out, 0), (ssize_t)sizeof out);
    EXPECT_EQ(event, uint32_t(FI_NOTIFY));
    EXPECT_EQ(out.data, 42u);
    EXPECT_EQ(out.context, &in);
    EXPECT_EQ(fi_close(&oeq->fid), 0);
    EXPECT_EQ(fi_close(&teq->fid), 0);
}

TEST_F(PeerObjects, AvAndAvSetImportShareTandemAddressing) {
    fi_av_attr attr{};
    attr.type = FI_AV_TABLE;
    fid_av *tav = nullptr;
    ASSERT_EQ(fi_av_open(tdom_, &attr, &tav, nullptr), 0);
    // Four addresses in tandem's AV.
    std::vector<sockaddr_in> names(4);
    for (int i = 0; i < 4; ++i) {
        names[i] = {};
        names[i].sin_family = AF_INET;
        names[i].sin_port = htons(40000 + i);
        names[i].sin_addr.s_addr = htonl(0x7f000001);
    }
    fi_addr_t addrs[4];
    ASSERT_EQ(fi_av_insert(tav, names.data(), 4, addrs, 0, nullptr), 4);

    struct fid *exported = nullptr;
    ASSERT_EQ(fi_export_fid(&tav->fid, 0, &exported, nullptr), 0);
    ASSERT_EQ(exported->fclass, FI_CLASS_PEER_AV);
    auto *peer_av = reinterpret_cast<fid_peer_av *>(exported);
    tandem_test::expect_complete_table("tandem peer av owner ops", peer_av->owner_ops);
    fi_av_attr q{};
    ASSERT_EQ(peer_av->owner_ops->query(peer_av, &q), 0);
    EXPECT_EQ(q.type, FI_AV_TABLE);
    EXPECT_EQ(q.count, 4u);

    fid_av *oav = nullptr;
    fi_av_attr oattr{};
    EXPECT_EQ(fi_av_open(odom_, &oattr, &oav, nullptr), -FI_EINVAL);
    fi_peer_av_context ctx{sizeof ctx, reinterpret_cast<decltype(ctx.av)>(peer_av)};
    oattr.flags = FI_PEER;
    ASSERT_EQ(fi_av_open(odom_, &oattr, &oav, &ctx), 0);
    tandem_test::expect_complete_av("off_tandem av", oav);
    // Addresses are the owner's to insert.
    fi_addr_t none;
    EXPECT_EQ(fi_av_insert(oav, names.data(), 1, &none, 0, nullptr), -FI_ENOSYS);

    // AV set: members 0, 2 (stride 2), then 3 inserted.
    fi_av_set_attr sattr{};
    sattr.count = 4;
    sattr.start_addr = addrs[0];
    sattr.end_addr = addrs[3];
    sattr.stride = 2;
    fid_av_set *tset = nullptr;
    ASSERT_EQ(fi_av_set(tav, &sattr, &tset, nullptr), 0);
    ASSERT_EQ(fi_av_set_insert(tset, addrs[3]), 0);
    EXPECT_EQ(fi_av_set_insert(tset, addrs[3]), -FI_EINVAL);  // already a member
    ASSERT_EQ(fi_export_fid(&tset->fid, 0, &exported, nullptr), 0);
    ASSERT_EQ(exported->fclass, FI_CLASS_PEER_AV_SET);
    auto *peer_set = reinterpret_cast<fid_peer_av_set *>(exported);
    tandem_test::expect_complete_table("tandem peer av set owner ops", peer_set->owner_ops);
    size_t count = 1;
    fi_addr_t members[4];
    EXPECT_EQ(peer_set->owner_ops->members(peer_set, members, &count), -FI_ETOOSMALL);
    EXPECT_EQ(count, 3u);
    count = 4;
    ASSERT_EQ(peer_set->owner_ops->members(peer_set, members, &count), 0);
    ASSERT_EQ(count, 3u);
    EXPECT_EQ(members[0], addrs[0]);
    EXPECT_EQ(members[1], addrs[2]);
    EXPECT_EQ(members[2], addrs[3]);

    fid_av_set *oset = nullptr;
    fi_peer_av_set_context sctx{sizeof sctx, reinterpret_cast<decltype(sctx.av_set)>(peer_set)};
    fi_av_set_attr oset_attr{};
    EXPECT_EQ(fi_av_set(oav, &oset_attr, &oset, &sctx), -FI_EINVAL);  // FI_PEER missing
    oset_attr.flags = FI_PEER;
    ASSERT_EQ(fi_av_set(oav, &oset_attr, &oset, &sctx), 0);
    tandem_test::expect_complete_av_set("off_tandem av set", oset);
    // The owner's set changes are the peer's view.
    ASSERT_EQ(fi_av_set_remove(tset, addrs[2]), 0);
    count = 4;
    ASSERT_EQ(peer_set->owner_ops->members(peer_set, members, &count), 0);
    EXPECT_EQ(count, 2u);

    EXPECT_EQ(fi_close(&oset->fid), 0);
    EXPECT_EQ(fi_close(&oav->fid), 0);
    EXPECT_EQ(fi_close(&tset->fid), 0);
    EXPECT_EQ(fi_close(&tav->fid), 0);
}

TEST_F(PeerObjects, SrxImportInstallsPeerOpsAndOwnerMatches) {
    fi_rx_attr rx_attr = *tinfo_->rx_attr;
    fid_ep *tsrx = nullptr;
    ASSERT_EQ(fi_srx_context(tdom_, &rx_attr, &tsrx, nullptr), 0);
    struct fid *exported = nullptr;
    ASSERT_EQ(fi_export_fid(&tsrx->fid, 0, &exported, nullptr), 0);
    auto *peer_srx = reinterpret_cast<fid_peer_srx *>(exported);
    EXPECT_EQ(peer_srx->peer_ops, nullptr);
    tandem_test::expect_complete_table("tandem peer srx owner ops", peer_srx->owner_ops);

    fid_ep *osrx = nullptr;
    fi_rx_attr oattr{};
    EXPECT_EQ(fi_srx_context(odom_, &oattr, &osrx, nullptr), -FI_EINVAL);
    fi_peer_srx_context ctx{sizeof ctx, peer_srx};
    oattr.op_flags = FI_PEER;
    ASSERT_EQ(fi_srx_context(odom_, &oattr, &osrx, &ctx), 0);
    ASSERT_NE(peer_srx->peer_ops, nullptr);  // off_tandem installed start/discard
    tandem_test::expect_complete_table("off_tandem srx peer ops", peer_srx->peer_ops);
    tandem_test::expect_complete_ep("off_tandem srx", osrx);
    EXPECT_NE(peer_srx->peer_ops->start_tag, nullptr);

    // Receive posted first: get_tag hands out the application's buffer.
    char buf[64];
    ASSERT_EQ(fi_trecv(tsrx, buf, sizeof buf, nullptr, FI_ADDR_UNSPEC, 0x5, 0, buf), 0);
    fi_peer_rx_entry *entry = nullptr;
    EXPECT_EQ(peer_srx->owner_ops->get_tag(peer_srx, FI_ADDR_UNSPEC, 0x6, &entry), -FI_ENOENT);
    ASSERT_NE(entry, nullptr);  // message first: an entry for the peer to queue
    peer_srx->owner_ops->free_entry(entry);
    entry = nullptr;
    ASSERT_EQ(peer_srx->owner_ops->get_tag(peer_srx, FI_ADDR_UNSPEC, 0x5, &entry), 0);
    ASSERT_NE(entry, nullptr);
    EXPECT_EQ(entry->context, buf);
    ASSERT_EQ(entry->count, 1u);
    EXPECT_EQ(entry->iov[0].iov_base, buf);
    EXPECT_EQ(entry->iov[0].iov_len, sizeof buf);
    // A receive the peer holds can no longer be cancelled.
    EXPECT_EQ(fi_cancel(&tsrx->fid, buf), -FI_ENOENT);
    peer_srx->owner_ops->free_entry(entry);

    EXPECT_EQ(fi_close(&osrx->fid), 0);
    EXPECT_EQ(fi_close(&tsrx->fid), 0);
}

// The twin endpoint off_tandem gives its owner: complete tables, and the transfer callbacks
// it installs for the owner before fi_endpoint2 returns (fi_peer(3)).
TEST_F(PeerObjects, OffloadEndpointHasCompleteTables) {
    fid_ep *tep = nullptr;
    ASSERT_EQ(fi_endpoint(tdom_, tinfo_, &tep, nullptr), 0);
    fi_peer_transfer_context ctx{sizeof ctx, oinfo_, tep, nullptr};
    fid_ep *oep = nullptr;
    ASSERT_EQ(fi_endpoint2(odom_, oinfo_, &oep, FI_PEER_TRANSFER, &ctx), 0);
    tandem_test::expect_complete_ep("off_tandem endpoint", oep);
    tandem_test::expect_complete_table("off_tandem transfer peer ops", ctx.peer_ops);
    // It carries the owner's node-local atomics, and answers the queries as the owner does.
    size_t count = 0;
    EXPECT_EQ(fi_atomicvalid(oep, FI_INT32, FI_SUM, &count), 0);
    EXPECT_EQ(count, 512u);
    EXPECT_EQ(fi_compare_atomicvalid(oep, FI_DOUBLE, FI_MSWAP, &count), -FI_EOPNOTSUPP);
    EXPECT_EQ(fi_fetch_atomicvalid(oep, FI_INT32, FI_SUM, nullptr), -FI_EINVAL);
    EXPECT_EQ(fi_barrier(oep, 0, nullptr), -FI_EOPNOTSUPP);
    EXPECT_EQ(fi_close(&oep->fid), 0);
    EXPECT_EQ(fi_close(&tep->fid), 0);
}

}  // namespace

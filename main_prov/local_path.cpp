#include "main_prov/local_path.h"

#include "common/auth_key.h"
#include "common/fabric_compat.h"
#include "common/iov.h"
#include "common/log.h"
#include "main_prov/av.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"

#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <cstring>

namespace tandem {

std::unique_ptr<OffloadDomain> OffloadDomain::open(Domain &owner) {
    std::unique_ptr<OffloadDomain> off(new OffloadDomain);
    fi_info *hints = fi_allocinfo();
    if (!hints) return nullptr;
    hints->mode = FI_PEER_TRANSFER;
    hints->caps = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | (owner.info()->caps & FI_HMEM);
    hints->ep_attr->type = FI_EP_RDM;
    hints->addr_format = owner.info()->addr_format;
    hints->domain_attr->mr_mode = owner.info()->domain_attr->mr_mode;
    hints->fabric_attr->prov_name = strdup(peer::kOffloadProvName);
    // Internal as well: FI_PROVIDER=tandem must not filter out tandem's own offload half.
    int ret = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr,
                         peer::kOffloadProvOnly | peer::kGetinfoInternal, hints, &off->info_);
    fi_freeinfo(hints);
    if (ret) {
        TANDEM_INFO(FI_LOG_DOMAIN, "no offload provider (%s): node-local peers use links\n",
                    fi_strerror(-ret));
        return nullptr;
    }
    ret = fi_fabric(off->info_->fabric_attr, &off->fabric_, nullptr);
    if (!ret) {
        fi_peer_domain_context ctx{sizeof ctx, owner.fid()};
        ret = fi_domain2(off->fabric_, off->info_, &off->domain_, FI_PEER, &ctx);
    }
    if (ret) {
        TANDEM_WARN(FI_LOG_DOMAIN, "%s refused a peer domain: %s\n", peer::kOffloadProvName,
                    fi_strerror(-ret));
        return nullptr;
    }
    off->open_ops();
    return off;
}

// off_tandem's table, taken only when it has every entry we call and lays our channel out as
// we do (the two are built together; one built apart would share a C++ object wrongly).
void OffloadDomain::open_ops() {
    void *ops = nullptr;
    int ret = fi_open_ops(&domain_->fid, peer::kOffloadOpsName, 0, &ops, nullptr);
    auto *table = static_cast<const peer::OffloadOps *>(ops);
    if (!ret && (!table || table->size < sizeof(peer::OffloadOps))) ret = -FI_ENOSYS;
    if (ret) {
        TANDEM_WARN(FI_LOG_DOMAIN,
                    "%s has no table %s: node-local path, triggers and collectives off (%s)\n",
                    peer::kOffloadProvName, peer::kOffloadOpsName, fi_strerror(-ret));
    } else if (table->channel_bytes != sizeof(shm::Channel)) {
        TANDEM_WARN(FI_LOG_DOMAIN,
                    "%s was built apart from tandem (its channel has %zu bytes, ours %zu): "
                    "node-local path, triggers and collectives off\n",
                    peer::kOffloadProvName, table->channel_bytes, sizeof(shm::Channel));
    } else {
        ops_ = table;
    }
}

OffloadDomain::~OffloadDomain() {
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    fi_freeinfo(info_);
}

LocalPath::LocalPath(Engine &ep, RxMatcher &rx, Av &av)
    : ep_(ep),
      face_(ep),
      rx_queue_(*ep.domain(), rx, &ep, PeerRxQueue::Mode::ThroughOwner, false),
      book_(av) {}

const std::atomic<uint64_t> *LocalPath::AvBook::version_word() const {
    return av_.version_word_ptr();
}

int LocalPath::AvBook::lookup(fi_addr_t addr, void *buf, size_t *addrlen) const {
    TANDEM_LOCK_ASSERT(av_.domain()->lock().held(), "the channel read the AV outside our lock");
    return av_.lookup_locked(addr, buf, addrlen);
}

fi_addr_t LocalPath::AvBook::addr_of(const void *addr, size_t addrlen) const {
    TANDEM_LOCK_ASSERT(av_.domain()->lock().held(), "the channel read the AV outside our lock");
    return av_.addr_of_bytes(addr, addrlen);
}

std::unique_ptr<LocalPath> LocalPath::open(Engine &ep, OffloadDomain &off, Av &av, RxMatcher &rx,
                                           fid_eq *eq) {
    if (!off.ops()) return nullptr;  // (OffloadDomain logged why)
    std::unique_ptr<LocalPath> lp(new LocalPath(ep, rx, av));
    lp->ops_ = off.ops();
    lp->hmem_ = ep.caps_ & FI_HMEM;
    lp->twin_fabric_ = off.fabric();
    const char *step = "fi_cq_open";
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.flags = FI_PEER;
    int ret = fi_cq_open(off.domain(), &cq_attr, &lp->cq_, lp->cq_export_.context());
    if (!ret) {
        step = "fi_av_open";
        fi_av_attr av_attr{};
        av_attr.flags = FI_PEER;
        ret = fi_av_open(off.domain(), &av_attr, &lp->av_, av.exported_to_twin().context());
    }
    if (!ret) {
        step = "fi_srx_context";
        fi_rx_attr rx_attr{};
        rx_attr.op_flags = FI_PEER;
        ret = fi_srx_context(off.domain(), &rx_attr, &lp->srx_, lp->rx_queue_.exported().context());
    }
    if (!ret) {
        step = "fi_endpoint2";
        ret = lp->open_twin(off);
    }
    if (!ret) {
        // Our channel, lent before the twin is enabled (it opens its inbox on it then), with
        // our answers about remote keys.
        step = "attach";
        ret = lp->ops_->attach(lp->twin_, &lp->channel_, &OwnerFace::owner_ops());
    }
    if (!ret && !ep.shm_permitted_) {
        // FI_OPT_SHARED_MEMORY_PERMITTED, handed on: the twin makes no segment.
        step = "fi_setopt";
        const bool permitted = false;
        ret = fi_setopt(&lp->twin_->fid, FI_OPT_ENDPOINT, compat::kOptSharedMemoryPermitted,
                        &permitted, sizeof permitted);
    }
    if (!ret && eq) {
        // The twin's events reach the application on the endpoint's EQ.
        step = "fi_eq_open";
        fi_peer_eq_context ctx{sizeof ctx, eq};
        fi_eq_attr eq_attr{};
        eq_attr.flags = FI_PEER;
        ret = fi_eq_open(off.fabric(), &eq_attr, &lp->eq_, &ctx);
        if (!ret) ret = fi_ep_bind(lp->twin_, &lp->eq_->fid, 0);
    }
    if (!ret) {
        step = "fi_ep_bind";
        ret = fi_ep_bind(lp->twin_, &lp->cq_->fid, FI_TRANSMIT | FI_RECV);
        if (!ret) ret = fi_ep_bind(lp->twin_, &lp->av_->fid, 0);
        if (!ret) ret = fi_ep_bind(lp->twin_, &lp->srx_->fid, 0);
    }
    if (!ret) {
        step = "fi_enable";
        ret = fi_enable(lp->twin_);
    }
    // We read the inbox the twin opened on our channel (OffloadOps::take_cell says how).
    if (!ret) lp->channel_.owner_reads = lp->channel_.has_inbox();
    if (ret) {
        TANDEM_WARN(FI_LOG_EP_CTRL, "node-local path not available (%s: %s)\n", step,
                    fi_strerror(-ret));
        return nullptr;
    }
    return lp;
}

// The twin endpoint (fi_endpoint2 with FI_PEER_TRANSFER), given OwnerFace as the owner's
// endpoint. It takes the endpoint's authorization key: node-local peers of another key are no
// peers of its (each side compares the keys in the other's segment).
int LocalPath::open_twin(OffloadDomain &off) {
    transfer_ = {sizeof transfer_, off.info(), face_.fid(), nullptr};
    auto [key, key_len] = endpoint_auth_key(ep_.info_, ep_.domain()->info());
    fi_info *twin_info = fi_dupinfo(off.info());
    if (twin_info && key_len && (twin_info->ep_attr->auth_key = copy_auth_key(key, key_len)))
        twin_info->ep_attr->auth_key_size = key_len;
    int ret = twin_info && twin_info->ep_attr->auth_key_size == key_len
                  ? fi_endpoint2(off.domain(), twin_info, &twin_, FI_PEER_TRANSFER, &transfer_)
                  : -FI_ENOMEM;
    // The largest message its Short cell takes (what fits one ring cell): what it answers
    // for an endpoint's inject size.
    if (twin_info) inject_limit_ = twin_info->tx_attr->inject_size;
    fi_freeinfo(twin_info);
    // fi_peer(3): the peer sets its callbacks before fi_endpoint2 returns.
    const fi_ops_transfer_peer *t = transfer_.peer_ops;
    if (!ret && (!t || !t->complete || !t->comperr)) ret = -FI_EINVAL;
    return ret;
}

// The twin goes first: it holds the peer objects until it is closed (fi_peer(3)).
LocalPath::~LocalPath() {
    if (twin_) fi_close(&twin_->fid);
    if (srx_) fi_close(&srx_->fid);
    if (av_) fi_close(&av_->fid);
    if (cq_) fi_close(&cq_->fid);
    if (eq_) fi_close(&eq_->fid);
}

int LocalPath::rma(TxOp *op, const iovec *iov, void **desc, size_t count, fi_addr_t peer,
                   uint64_t addr, uint64_t key, uint64_t flags, uint64_t data, bool write) {
    fi_rma_iov rma{addr, iov_length(iov, count), key};
    fi_msg_rma msg{iov, descs(desc), count, peer, &rma, 1, op, data};
    flags = (flags & FI_REMOTE_CQ_DATA) | FI_COMPLETION;
    return static_cast<int>(write ? fi_writemsg(twin_, &msg, flags)
                                  : fi_readmsg(twin_, &msg, flags));
}

int LocalPath::atomic(TxOp *op, const AtomicCall &a) {
    fi_msg_atomic msg = a.msg;
    msg.context = op;
    msg.desc = descs(msg.desc);
    uint64_t flags = (a.flags & FI_REMOTE_CQ_DATA) | FI_COMPLETION;
    switch (a.kind) {
        case atomic::Kind::Base:
            return static_cast<int>(fi_atomicmsg(twin_, &msg, flags));
        case atomic::Kind::Fetch:
            return static_cast<int>(fi_fetch_atomicmsg(twin_, &msg, a.result, descs(a.result_desc),
                                                       a.result_count, flags));
        case atomic::Kind::Compare:
            return static_cast<int>(
                fi_compare_atomicmsg(twin_, &msg, a.compare, descs(a.compare_desc), a.compare_count,
                                     a.result, descs(a.result_desc), a.result_count, flags));
    }
    return -FI_EINVAL;
}

void LocalPath::set_p2p(int mode) {
    int ret = fi_setopt(&twin_->fid, FI_OPT_ENDPOINT, FI_OPT_FI_HMEM_P2P, &mode, sizeof mode);
    if (ret)
        TANDEM_WARN(FI_LOG_EP_CTRL, "the offload twin refused P2P mode %d: %s\n", mode,
                    fi_strerror(-ret));
}

void LocalPath::transfer_done(const fi_cq_tagged_entry &entry, int err, size_t olen,
                              fi_addr_t src) {
    transfers_done_.push_back({entry, err, olen, src});
    ep_.poll_link_soon();  // reported from the link's side of the next pass
}

void LocalPath::flush_transfers_now() {
    fi_ops_transfer_peer *ops = transfer_.peer_ops;
    // Swapped out first: a callback may post more, whose completions wait for the next pass.
    transfers_flushing_.swap(transfers_done_);
    for (auto &t : transfers_flushing_) {
        if (!ops) continue;
        if (t.err) {
            fi_cq_err_entry e{};
            e.op_context = t.entry.op_context;
            e.flags = t.entry.flags;
            e.len = t.entry.len;
            e.buf = t.entry.buf;
            e.data = t.entry.data;
            e.tag = t.entry.tag;
            e.olen = t.olen;
            e.err = t.err;
            e.prov_errno = t.err;
            ops->comperr(twin_, &e);
        } else {
            ops->complete(twin_, &t.entry, &t.src);
        }
    }
    transfers_flushing_.clear();
}

void LocalPath::wait_fds(std::vector<WaitFd> &out) {
    shm::InboxWake *wake = channel_.wake();
    if (!wake) return;
    out.push_back({wake->fd(), false});
    // The twin's endpoint arms it (fi_trywait on the twin's CQ); -FI_EAGAIN, work pending,
    // leaves the descriptor readable, so the sleep ends at once.
    fid *twin_cq = &cq_->fid;
    fi_trywait(twin_fabric_, &twin_cq, 1);
}

// A receive's completion flags as the protocol flags rx_complete keeps.
static uint8_t proto_flags_of(uint64_t flags) {
    return ((flags & FI_TAGGED) ? wire::kProtoTagged : 0) |
           ((flags & FI_REMOTE_CQ_DATA) ? wire::kProtoCqData : 0);
}

// The twin's completions: the contexts are tandem's operations (see the header). Only the
// twin calls these, inside tandem's calls: the domain lock is held.
ssize_t LocalPath::peer_write(void *context, uint64_t flags, size_t len, void *, uint64_t data,
                              uint64_t tag, fi_addr_t src) {
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep_.domain());
    if (flags & FI_RECV) {
        ep_.rx_complete(static_cast<RxOp *>(context), len, tag, data, proto_flags_of(flags), src, 0,
                        0);
        return 0;
    }
    if (flags & (FI_REMOTE_WRITE | FI_REMOTE_READ)) {
        // Remote CQ data of an RMA write or an atomic into one of our regions (no operation
        // of ours).
        ep_.write_rx_cq({nullptr, flags, len, nullptr, data, 0, src}, src);
        return 0;
    }
    if (!context) return -FI_EINVAL;
    ep_.finish_tx(static_cast<TxOp *>(context));
    return 0;
}

ssize_t LocalPath::peer_writeerr(const fi_cq_err_entry &err) {
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep_.domain());
    if (!err.op_context) return -FI_EINVAL;
    if (err.flags & FI_RECV) {
        ep_.rx_complete(static_cast<RxOp *>(err.op_context), err.len, err.tag, err.data,
                        proto_flags_of(err.flags), FI_ADDR_NOTAVAIL, err.err ? err.err : FI_EIO,
                        err.olen);
        return 0;
    }
    auto *op = static_cast<TxOp *>(err.op_context);
    op->error = err.err ? err.err : FI_EIO;
    ep_.finish_tx(op);
    return 0;
}

}  // namespace tandem

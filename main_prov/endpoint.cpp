// Control path of the endpoint: creation, binding, enabling, options. Connection management
// is in endpoint_cm.cpp, the data path in endpoint_data.cpp and the files it names.
#include "main_prov/endpoint.h"

#include "common/auth_key.h"
#include "common/log.h"
#include "common/unsupported_ops.h"
#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/config.h"
#include "main_prov/conn_hello.h"
#include "main_prov/link/tcp_link.h"
#include "main_prov/domain.h"
#include "main_prov/endpoint_alias.h"
#include "main_prov/interfaces.h"
#include "main_prov/local_path.h"
#include "main_prov/pep.h"
#include "main_prov/srx.h"

#include <rdma/fi_errno.h>

#include <cstring>

namespace tandem {

fi_ops alias_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&EndpointAlias::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = enosys<decltype(fi_ops::control)>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

namespace {

// FI_OPT_CUDA_API_PERMITTED arrived in libfabric 1.18 (value 10, after FI_OPT_XPU_TRIGGER);
// handled by value so a 1.17 build answers it too.
constexpr int kOptCudaApiPermitted = 10;

int diag_remote_twin(fid_ep *fid, fi_addr_t addr, uint64_t *caps) noexcept try {
    return Endpoint::of(fid)->remote_twin(addr, caps);
} catch (...) {
    return current_exception_errno();
}

int diag_peer_path(fid_ep *fid, fi_addr_t addr) noexcept try {
    return Endpoint::of(fid)->peer_path(addr);
} catch (...) {
    return current_exception_errno();
}

peer::EpDiagOps ep_diag_ops = {sizeof(peer::EpDiagOps), diag_remote_twin, diag_peer_path};

fi_ops ep_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Endpoint::close>::call<fid>,
    .bind = &Trampoline<&Endpoint::bind>::call<fid>,
    .control = &Trampoline<&Endpoint::control>::call<fid>,
    .ops_open = &Trampoline<&Endpoint::ops_open>::call<fid>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_ep ep_ops = fid_ep_ops(
    &Trampoline<&Endpoint::cancel>::call<struct fid>, &Trampoline<&Endpoint::getopt>::call<fid>,
    &Trampoline<&Endpoint::setopt>::call<fid>, &Trampoline<&Endpoint::rx_size_left>::call<fid_ep>,
    &Trampoline<&Endpoint::tx_size_left>::call<fid_ep>);

fi_ops_cm ep_cm_ops = {
    .size = sizeof(fi_ops_cm),
    .setname = &Trampoline<&Endpoint::setname>::call<fid>,
    .getname = &Trampoline<&Endpoint::getname>::call<fid>,
    .getpeer = &Trampoline<&Endpoint::getpeer>::call<fid_ep>,
    .connect = &Trampoline<&Endpoint::connect>::call<fid_ep>,
    .listen = enosys<decltype(fi_ops_cm::listen)>,
    .accept = &Trampoline<&Endpoint::accept>::call<fid_ep>,
    .reject = enosys<decltype(fi_ops_cm::reject)>,
    .shutdown = &Trampoline<&Endpoint::shutdown>::call<fid_ep>,
    .join = &Trampoline<&Endpoint::join>::call<fid_ep>,
};

fi_ops_collective ep_coll_ops = {
    .size = sizeof(fi_ops_collective),
    .barrier = &DataCall<&Endpoint::coll_barrier>::call,
    .broadcast = &DataCall<&Endpoint::coll_broadcast>::call,
    .alltoall = &DataCall<&Endpoint::coll_alltoall>::call,
    .allreduce = &DataCall<&Endpoint::coll_allreduce>::call,
    .allgather = &DataCall<&Endpoint::coll_allgather>::call,
    .reduce_scatter = &DataCall<&Endpoint::coll_reduce_scatter>::call,
    .reduce = &DataCall<&Endpoint::coll_reduce>::call,
    .scatter = &DataCall<&Endpoint::coll_scatter>::call,
    .gather = &DataCall<&Endpoint::coll_gather>::call,
    .msg = &DataCall<&Endpoint::coll_msg>::call,
    .barrier2 = &DataCall<&Endpoint::coll_barrier2>::call,
};

fi_ops_atomic ep_atomic_ops = {
    .size = sizeof(fi_ops_atomic),
    .write = &DataCall<&Endpoint::atomic_write>::call,
    .writev = &DataCall<&Endpoint::atomic_writev>::call,
    .writemsg = &DataCall<&Endpoint::atomic_writemsg>::call,
    .inject = &DataCall<&Endpoint::atomic_inject>::call,
    .readwrite = &DataCall<&Endpoint::atomic_readwrite>::call,
    .readwritev = &DataCall<&Endpoint::atomic_readwritev>::call,
    .readwritemsg = &DataCall<&Endpoint::atomic_readwritemsg>::call,
    .compwrite = &DataCall<&Endpoint::atomic_compwrite>::call,
    .compwritev = &DataCall<&Endpoint::atomic_compwritev>::call,
    .compwritemsg = &DataCall<&Endpoint::atomic_compwritemsg>::call,
    .writevalid = &DataCall<&Endpoint::atomic_writevalid>::call,
    .readwritevalid = &DataCall<&Endpoint::atomic_readwritevalid>::call,
    .compwritevalid = &DataCall<&Endpoint::atomic_compwritevalid>::call,
};

fi_ops_rma ep_rma_ops = {
    .size = sizeof(fi_ops_rma),
    .read = &DataCall<&Endpoint::rma_read>::call,
    .readv = &DataCall<&Endpoint::rma_readv>::call,
    .readmsg = &DataCall<&Endpoint::rma_readmsg>::call,
    .write = &DataCall<&Endpoint::rma_write>::call,
    .writev = &DataCall<&Endpoint::rma_writev>::call,
    .writemsg = &DataCall<&Endpoint::rma_writemsg>::call,
    .inject = &DataCall<&Endpoint::rma_inject>::call,
    .writedata = &DataCall<&Endpoint::rma_writedata>::call,
    .injectdata = &DataCall<&Endpoint::rma_injectdata>::call,
};

fi_ops_ep alias_ep_ops = fid_ep_ops();

}  // namespace

Endpoint::Endpoint(Domain *domain, fi_info *info, void *context)
    : domain_(domain), info_(fi_dupinfo(info)) {
    if (!info_ || !info_->ep_attr) fail(FI_EINVAL, "endpoint without attributes");
    type_ = info_->ep_attr->type;
    if (type_ != FI_EP_RDM && type_ != FI_EP_MSG) fail(FI_EINVAL, "unsupported endpoint type");
    caps_ = info_->caps ? info_->caps : (FI_MSG | FI_TAGGED | FI_RMA);
    if (info_->ep_attr->auth_key_size > kMaxAuthKeySize)
        fail(FI_EINVAL, "authorization key longer than tandem takes");
    auth_ = endpoint_auth_digest(info_, domain_->info());
    // Without FI_HMEM there is no device memory to move: report P2P as not in use.
    if (!(caps_ & FI_HMEM)) p2p_.set(FI_HMEM_P2P_DISABLED, false);
    defaults_.tx = info_->tx_attr ? info_->tx_attr->op_flags : 0;
    defaults_.rx = info_->rx_attr ? info_->rx_attr->op_flags : 0;
    const Config &cfg = Config::get();
    eager_limit_ = cfg.eager_limit;
    inject_size_ = cfg.inject_size;
    // A posted buffer takes any protocol message: an eager one, a rendezvous request, the
    // largest atomic request (whatever the eager limit was set to).
    rx_buf_size_ =
        sizeof(wire::ProtoHeader) + std::max({eager_limit_, sizeof(wire::RtsBody),
                                              sizeof(wire::AtomicBody) + 2 * atomic::kMaxBytes});
    transport_ = domain_->link().transport(this, rx_buf_size_);
    // MSG connection data rides in the request after our hello: what the link leaves of it.
    if (size_t carried = transport_->caps().max_connect_data)
        cm_data_size_ = cm_data_max_ =
            std::min(wire::kMaxCmPrivate, carried - sizeof(wire::ConnHello));
    apply_default_p2p(cfg.hmem_p2p);

    init_fid(FI_CLASS_EP, context, &ep_fi_ops);
    fid()->ops = &ep_ops;
    fid()->cm = &ep_cm_ops;
    fid()->msg = &ep_msg_ops;
    fid()->tagged = &ep_tagged_ops;
    fid()->rma = &ep_rma_ops;
    fid()->atomic = &ep_atomic_ops;
    if (info_->ep_attr->type == FI_EP_RDM) fid()->collective = &ep_coll_ops;
    complete_ep_tables(*fid());  // MSG endpoints: no collectives (-FI_EOPNOTSUPP)

    if (info_->src_addr) {
        if (!EndpointName::from_bytes(info_->src_addr, info_->src_addrlen, src_name_))
            fail(FI_EINVAL, "bad source address");
        named_ = true;
    } else {
        src_name_.ss.ss_family = info_->addr_format == FI_SOCKADDR_IN6 ? AF_INET6 : AF_INET;
    }
    if (type_ == FI_EP_RDM) {
        int ret = transport_->listen(src_name_.sa(), src_name_.length(), 512);
        if (ret) fail(-ret, "cannot listen on the source address");
    }
    if (info_->handle) {
        if (type_ != FI_EP_MSG) fail(FI_EINVAL, "a handle in the info of a non-MSG endpoint");
        if (info_->handle->fclass == FI_CLASS_PEP) {
            // fi_endpoint(3): the active endpoint acquires the passive endpoint's address,
            // and its connection leaves from it.
            src_name_ = PassiveEndpoint::of(info_->handle)->surrender_address();
            info_->handle = nullptr;
        } else if (info_->handle->fclass != FI_CLASS_CONNREQ) {
            fail(FI_EINVAL, "the handle is neither a connection request nor a passive endpoint");
        }
    }
    domain_->hold();
}

Endpoint::~Endpoint() {
    transport_.reset();
    fi_freeinfo(info_);
    domain_->release();
}

Endpoint *Endpoint::from_fid(fid_ep *ep) {
    if (!ep) return nullptr;
    if (ep->fid.ops == &alias_fi_ops) return EndpointAlias::of(ep)->parent;
    if (ep->fid.ops == &ep_fi_ops) return Endpoint::of(ep);
    return nullptr;
}

int Endpoint::close() {
    {
        std::lock_guard guard(domain_->lock());
        if (aliases_) return -FI_EBUSY;      // close the aliases first
        if (coll_groups_) return -FI_EBUSY;  // and the collective groups joined
    }
    // Without the domain lock: this waits for an EQ read that is inside progress_cm, which
    // may be waiting for that lock. Once removed, only CQ progress reaches this endpoint, and
    // the domain's list is left under the lock below.
    TANDEM_LOCK_ASSERT(!eq_ || !domain_->lock().held(),
                       "an endpoint leaves its EQ with the domain lock held");
    if (eq_) eq_->remove_source(this);
    {
        std::lock_guard guard(domain_->lock());
        if (enabled_) domain_->remove_endpoint(this);
        // Triggered operations and deferred work that never started go with the endpoint,
        // unreported (the application closes what they would have reported on), and so do
        // its XPU trigger variables.
        if (OffloadDomain *off = used_triggers_ ? domain_->offload() : nullptr) {
            if (off->triggers()) {
                off->triggers()->discard_group(off->domain(), this);
                off->triggers()->discard_group(off->domain(), work_group());
                domain_->note_triggers();
            }
        }
        // The twin's own receives go before the twin: nothing that arrives while the endpoint
        // drains below may land in its memory.
        peer_rx_.drop_posted();
        twin_progress_ = nullptr;  // (the drain below progresses the link alone)
        twin_ep_ = nullptr;
        twin_quiet_ = nullptr;
        inbox_ring_ = nullptr;
        twin_take_cell_ = nullptr;
        local_.reset();  // the twin first: it holds entries of rx_ until it is closed
        rx_->forget_endpoint(this);
        if (srx_) SharedRxContext::of(srx_)->detach(this);
        if (stx_) SharedTxContext::of(stx_)->detach();
        // A request never accepted: refused through our own transport, before the disconnections
        // below reach it (its connection still names the passive endpoint's transport, which
        // may be closed already).
        if (pending_request_) {
            LinkConnection *request = pending_request_.get();
            transport_->adopt(std::move(pending_request_));
            request->reject(nullptr, 0);
        }
        for (auto &[name, peer] : peers_)
            if (peer->conn) peer->conn->disconnect();
        // Let queued frames (rendezvous Fins, acknowledgements) reach the peers before the
        // sockets close; bounded, so a dead peer cannot hold up fi_close.
        transport_->disconnect_all();
        transport_->drain(250);
        discard_link_work();
        if (rx_cq_) rx_cq_->discard_receives_of(&rx_completions_);
        for (Cq *cq : {tx_cq_, rx_cq_})
            if (cq) cq->release();
        for (Cntr *c : {send_cntr_, recv_cntr_, read_cntr_, write_cntr_, rread_cntr_, rwrite_cntr_})
            if (c) c->release();
        if (av_) av_->release();
    }
    delete this;
    return 0;
}

int Endpoint::bind(struct fid *bfid, uint64_t flags) {
    if (!bfid) return -FI_EINVAL;
    if (bfid->fclass == FI_CLASS_EQ) {
        // Before the guard (see DomainLock::require): from now on EQ reads, from any thread,
        // drive this endpoint's progress, so the domain lock is taken even under
        // FI_THREAD_DOMAIN.
        domain_->lock().require();
        std::lock_guard guard(domain_->lock());
        if (enabled_) return -FI_EOPBADSTATE;
        if (eq_) return -FI_EINVAL;
        eq_ = Eq::of(bfid);
        eq_->add_source(this);
        return 0;
    }
    std::lock_guard guard(domain_->lock());
    if (enabled_) return -FI_EOPBADSTATE;
    switch (bfid->fclass) {
        case FI_CLASS_CQ:
            return bind_cq(bfid, flags);
        case FI_CLASS_CNTR:
            return bind_cntr(bfid, flags);
        case FI_CLASS_AV:
            if (type_ != FI_EP_RDM) return -FI_EINVAL;
            if (av_) return -FI_EINVAL;
            if (flags) return -FI_EBADFLAGS;
            av_ = Av::of(bfid);
            av_->hold();
            av_version_word_ = av_->version_word_ptr();
            return 0;
        case FI_CLASS_SRX_CTX: {
            if (flags) return -FI_EBADFLAGS;
            if (srx_) return -FI_EINVAL;
            auto *srx = SharedRxContext::of(bfid);
            srx->attach(this);
            rx_ = &srx->matcher();
            srx_ = bfid;
            return 0;
        }
        case FI_CLASS_STX_CTX:
            if (flags) return -FI_EBADFLAGS;
            if (stx_) return -FI_EINVAL;
            stx_ = bfid;
            SharedTxContext::of(bfid)->attach();
            return 0;
        default:
            return -FI_EINVAL;
    }
}

// fi_ep_bind of a CQ, for the directions flags names. Domain lock held.
int Endpoint::bind_cq(struct fid *bfid, uint64_t flags) {
    if (flags & ~uint64_t(FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION)) return -FI_EBADFLAGS;
    if (!(flags & (FI_TRANSMIT | FI_RECV))) return -FI_EBADFLAGS;
    Cq *cq = Cq::of(bfid);
    if (((flags & FI_TRANSMIT) && tx_cq_) || ((flags & FI_RECV) && rx_cq_)) return -FI_EINVAL;
    if (flags & FI_TRANSMIT) {
        tx_cq_ = cq;
        tx_selective_ = flags & FI_SELECTIVE_COMPLETION;
        cq->hold();
    }
    if (flags & FI_RECV) {
        rx_cq_ = cq;
        rx_selective_ = flags & FI_SELECTIVE_COMPLETION;
        cq->hold();
    }
    return 0;
}

// fi_ep_bind of a counter, for the events flags names (it replaces one bound before).
int Endpoint::bind_cntr(struct fid *bfid, uint64_t flags) {
    constexpr uint64_t all =
        FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    if (!flags || (flags & ~all)) return -FI_EBADFLAGS;
    Cntr *c = Cntr::of(bfid);
    auto set = [&](uint64_t bit, Cntr *&slot) {
        if (!(flags & bit)) return;
        if (slot) slot->release();
        slot = c;
        c->hold();
    };
    set(FI_SEND, send_cntr_);
    set(FI_RECV, recv_cntr_);
    set(FI_READ, read_cntr_);
    set(FI_WRITE, write_cntr_);
    set(FI_REMOTE_READ, rread_cntr_);
    set(FI_REMOTE_WRITE, rwrite_cntr_);
    return 0;
}

int Endpoint::control(int command, void *arg) {
    switch (command) {
        case FI_ENABLE: {
            std::lock_guard guard(domain_->lock());
            return enable_locked();
        }
        case FI_GETOPSFLAG:
        case FI_SETOPSFLAG: {
            if (!arg) return -FI_EINVAL;
            auto *flags = static_cast<uint64_t *>(arg);
            bool tx = *flags & FI_TRANSMIT, rx = *flags & FI_RECV;
            if (tx == rx) return -FI_EINVAL;
            uint64_t &which = tx ? defaults_.tx : defaults_.rx;
            if (command == FI_GETOPSFLAG) {
                *flags = which | (tx ? FI_TRANSMIT : FI_RECV);
            } else {
                which = *flags & ~uint64_t(FI_TRANSMIT | FI_RECV);
            }
            return 0;
        }
        case FI_ALIAS: {
            auto *alias = static_cast<struct fi_alias *>(arg);
            if (!alias || !alias->fid) return -FI_EINVAL;
            bool tx = alias->flags & FI_TRANSMIT, rx = alias->flags & FI_RECV;
            if (tx == rx) return -FI_EINVAL;  // one direction per alias (fi_endpoint(3))
            std::lock_guard guard(domain_->lock());
            OpDefaults d = defaults_;
            (tx ? d.tx : d.rx) = alias->flags & ~uint64_t(FI_TRANSMIT | FI_RECV);
            auto *a = new EndpointAlias(this, d);
            a->init_fid(FI_CLASS_EP, base_fid()->context, &alias_fi_ops);
            a->fid()->ops = &alias_ep_ops;
            a->fid()->msg = &ep_msg_ops;
            a->fid()->tagged = &ep_tagged_ops;
            a->fid()->rma = &ep_rma_ops;
            a->fid()->atomic = &ep_atomic_ops;
            a->fid()->collective = fid()->collective;
            complete_ep_tables(*a->fid());  // no connection management of its own
            *alias->fid = a->base_fid();
            return 0;
        }
        case FI_GETWAIT:
            return -FI_ENOSYS;
        default:
            return -FI_ENOSYS;
    }
}

// fi_enable; also implied by fi_connect / fi_accept (fi_cm(3)). Domain lock held.
int Endpoint::ops_open(const char *name, uint64_t, void **ops, void *) {
    if (!name || !ops) return -FI_EINVAL;
    if (strcmp(name, peer::kEpDiagOpsName) == 0) {
        *ops = &ep_diag_ops;
        return 0;
    }
    return -FI_ENOSYS;
}

int Endpoint::remote_twin(fi_addr_t addr, uint64_t *caps) {
    std::lock_guard guard(domain_->lock());
    if (!local_) return -FI_ENOSYS;
    return local_->remote_twin(addr, caps);
}

int Endpoint::peer_path(fi_addr_t addr) {
    std::lock_guard guard(domain_->lock());
    if (!enabled_) return -FI_EOPBADSTATE;
    if (type_ == FI_EP_MSG) return int(peer::PeerPath::Link);
    Peer *peer = peer_for(addr);
    if (!goes_local(peer, addr)) return int(peer::PeerPath::Link);
    int single = local_->single_copy(addr);
    if (single < 0) return single;
    return int(single ? peer::PeerPath::LocalSingleCopy : peer::PeerPath::LocalStaged);
}

int Endpoint::enable_locked() {
    if (enabled_) return 0;
    if (type_ == FI_EP_RDM && !av_) return -FI_ENOAV;
    if ((caps_ & (FI_MSG | FI_TAGGED | FI_RMA)) && !tx_cq_ && !send_cntr_ && !write_cntr_ &&
        !read_cntr_)
        return -FI_ENOCQ;
    if (type_ == FI_EP_MSG && !eq_) return -FI_ENOEQ;
    // Post the link's receive buffers (the SRQ of a verbs link).
    size_t count = Config::get().rx_buffers;
    // Not cleared: a page of it costs resident memory only once the link has put a message
    // in it (an endpoint whose peers are all node-local never touches it).
    rx_slab_ = std::make_unique_for_overwrite<uint8_t[]>(count * rx_buf_size_);
    for (size_t i = 0; i < count; ++i) repost(rx_slab_.get() + i * rx_buf_size_);
    enabled_ = true;
    domain_->add_endpoint(this);
    if (type_ == FI_EP_RDM)
        if (OffloadDomain *off = domain_->offload())
            local_ = LocalPath::open(*this, *off, *av_, *rx_, eq_ ? eq_->fid() : nullptr);
    if (local_ && (caps_ & FI_HMEM)) local_->set_p2p(p2p_.mode());
    if (local_) {
        lane_limit_ = std::min<size_t>(local_->inject_limit(), info_->ep_attr->max_msg_size);
        twin_progress_ = local_->progress_entry();
        twin_ep_ = local_->twin();
        const peer::InboxView inbox = local_->inbox();
        inbox_ring_ = inbox.ring;
        twin_quiet_ = inbox.ring ? inbox.quiet : nullptr;
        twin_take_cell_ = local_->take_cell_entry();
    }
    transport_->set_device_p2p(p2p_.mode() != FI_HMEM_P2P_DISABLED);
    // What send_by_link takes: an eager message the link sends from the caller's buffer
    // before returning (LinkConnection::post_send_now).
    const size_t send_now = transport_->caps().max_send_now;
    link_direct_limit_ = send_now > sizeof(wire::ProtoHeader)
                             ? std::min({eager_limit_, send_now - sizeof(wire::ProtoHeader),
                                         size_t(info_->ep_attr->max_msg_size)})
                             : 0;
    direct_limit_ = std::max(lane_limit_, link_direct_limit_);
    // One line per endpoint at info level: a user's log then says which endpoint ran and
    // whether its node-local peers go through off_tandem.
    EndpointName at;
    at.ss = transport_->name();
    const fi_threading threading = domain_->threading();
    TANDEM_INFO(FI_LOG_EP_CTRL,
                "%s endpoint enabled on %s, node-local path %s, at %s, %s (domain lock %s)\n",
                type_ == FI_EP_RDM ? "RDM" : "MSG", info_->domain_attr->name, local_ ? "on" : "off",
                at.to_string().c_str(), fi_tostr(&threading, FI_TYPE_THREADING),
                domain_->lock().taken() ? "taken" : "skipped");
    if (info_->handle) {
        // Passive side: the connection request this endpoint was created for.
        auto *req = reinterpret_cast<struct fid *>(info_->handle);
        adopt_request(take_connection_request(req));
        info_->handle = nullptr;
    }
    return 0;
}

int Endpoint::getopt(int level, int optname, void *optval, size_t *optlen) {
    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    if (!optval || !optlen) return -FI_EINVAL;
    switch (optname) {
        case FI_OPT_MIN_MULTI_RECV:
            if (*optlen < sizeof(size_t)) return -FI_ETOOSMALL;
            *static_cast<size_t *>(optval) = rx_->min_multi_recv;
            *optlen = sizeof(size_t);
            return 0;
        case FI_OPT_CM_DATA_SIZE:
            if (*optlen < sizeof(size_t)) return -FI_ETOOSMALL;
            *static_cast<size_t *>(optval) = cm_data_size_;
            *optlen = sizeof(size_t);
            return 0;
        case FI_OPT_FI_HMEM_P2P:
            if (*optlen < sizeof(int)) return -FI_ETOOSMALL;
            *static_cast<int *>(optval) = p2p_.mode();
            *optlen = sizeof(int);
            return 0;
        case FI_OPT_XPU_TRIGGER:
            return xpu_trigger_shape(static_cast<fi_trigger_xpu *>(optval), optlen);
        default:
            return -FI_ENOPROTOOPT;
    }
}

int Endpoint::setopt(int level, int optname, const void *optval, size_t optlen) {
    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    if (!optval) return -FI_EINVAL;
    switch (optname) {
        case FI_OPT_MIN_MULTI_RECV:
            if (optlen != sizeof(size_t)) return -FI_EINVAL;
            rx_->min_multi_recv = *static_cast<const size_t *>(optval);
            return 0;
        case FI_OPT_CM_DATA_SIZE: {
            if (optlen != sizeof(size_t)) return -FI_EINVAL;
            size_t want = *static_cast<const size_t *>(optval);
            if (want > cm_data_max_) return -FI_EINVAL;
            cm_data_size_ = want;
            return 0;
        }
        case FI_OPT_FI_HMEM_P2P: {
            if (optlen != sizeof(int)) return -FI_EINVAL;
            int mode = *static_cast<const int *>(optval);
            std::lock_guard guard(domain_->lock());
            int ret = p2p_.set(mode, can_p2p());
            if (!ret && local_ && (caps_ & FI_HMEM)) local_->set_p2p(p2p_.mode());
            if (!ret && transport_) transport_->set_device_p2p(p2p_.mode() != FI_HMEM_P2P_DISABLED);
            return ret;
        }
        case kOptCudaApiPermitted: {
            // fi_endpoint(3): -FI_EINVAL when the CUDA library or a device is missing. Where
            // CUDA is present every path of tandem moves CUDA memory with CUDA calls (the
            // device's copy engine, IPC handles; the TCP link stages through them), so it
            // cannot promise to make none: false gives -FI_EOPNOTSUPP.
            if (optlen != sizeof(bool)) return -FI_EINVAL;
            if (!(caps_ & FI_HMEM) || !hmem::Registry::instance().available(FI_HMEM_CUDA))
                return -FI_EINVAL;
            return *static_cast<const bool *>(optval) ? 0 : -FI_EOPNOTSUPP;
        }
        default:
            return -FI_ENOPROTOOPT;
    }
}

// Some path of this endpoint can move device memory peer to peer: the node-local one (IPC
// handles and the device's copy engine) or a link that registers device memory with its NIC
// (GPUDirect RDMA); the TCP link always stages. Without FI_HMEM no transfer can be peer to
// peer, so REQUIRED cannot be met there either.
bool Endpoint::can_p2p() const {
    return (caps_ & FI_HMEM) &&
           ((transport_ && transport_->caps().device_p2p) ||
            (type_ == FI_EP_RDM && Config::get().local_path && domain_->offload() != nullptr));
}

// FI_TANDEM_HMEM_P2P: the policy an endpoint with FI_HMEM starts with, as if the application
// had set it first thing. One it cannot keep (REQUIRED where no path can) is logged and the
// endpoint keeps ENABLED, as the setopt would have been refused.
void Endpoint::apply_default_p2p(int mode) {
    if (!(caps_ & FI_HMEM) || mode == FI_HMEM_P2P_ENABLED) return;
    if (int ret = p2p_.set(mode, can_p2p()))
        TANDEM_WARN(FI_LOG_EP_CTRL, "FI_TANDEM_HMEM_P2P: this endpoint cannot take it (%s)\n",
                    fi_strerror(-ret));
}

ssize_t Endpoint::rx_size_left() {
    std::lock_guard guard(domain_->lock());
    if (!enabled_) return -FI_EOPBADSTATE;
    size_t size = info_->rx_attr ? info_->rx_attr->size : 0;
    return static_cast<ssize_t>(size > rx_->outstanding ? size - rx_->outstanding : 0);
}

ssize_t Endpoint::tx_size_left() {
    std::lock_guard guard(domain_->lock());
    if (!enabled_) return -FI_EOPBADSTATE;
    size_t size = info_->tx_attr ? info_->tx_attr->size : 0;
    return static_cast<ssize_t>(size > tx_outstanding_ ? size - tx_outstanding_ : 0);
}

int Endpoint::setname(void *addr, size_t addrlen) {
    if (!addr) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    if (enabled_) return -FI_EOPBADSTATE;
    EndpointName name;
    if (!EndpointName::from_bytes(addr, addrlen, name)) return -FI_EINVAL;
    if (type_ == FI_EP_RDM) {
        std::unique_ptr<LinkTransport> fresh = transport_->fresh();
        int ret = fresh->listen(name.sa(), name.length(), 512);
        if (ret) return ret;
        transport_ = std::move(fresh);
    }
    src_name_ = name;
    named_ = true;
    return 0;
}

int Endpoint::getname(void *addr, size_t *addrlen) {
    if (!addrlen) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    return getname_locked(addr, addrlen);
}

int Endpoint::getname_locked(void *addr, size_t *addrlen) const {
    EndpointName name = src_name_;
    if (type_ == FI_EP_RDM) {
        name.ss = transport_->name();
        // Bound to the wildcard address: advertise the domain's interface address.
        substitute_interface_address(domain_->info()->domain_attr->name, name);
    } else if (msg_peer_ && msg_peer_->conn) {
        name.ss = msg_peer_->conn->local_address();
    }
    size_t need = name.length();
    size_t have = *addrlen;
    *addrlen = need;
    if (have < need) return -FI_ETOOSMALL;
    if (!addr) return -FI_EINVAL;
    memcpy(addr, &name.ss, need);
    return 0;
}

void Endpoint::wait_fds(std::vector<int> &out) const {
    // The application may sleep on the listener, and wake because a peer connects.
    link_may_wake();
    transport_->wait_fds(out);
    if (local_) local_->wait_fds(out);
}

}  // namespace tandem

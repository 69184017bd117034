// The engine's life and configuration: creation, the binds and options its adapter sets,
// enabling, names, closing. Connection management is in engine_cm.cpp; the data path in
// endpoint_data.cpp (the small-message path, inlined into the adapter's calls) and
// engine_{send,recv,link,rma,atomic,coll,served_rma}.cpp.
#include "main_prov/engine.h"

#include "common/auth_key.h"
#include "common/fabric_compat.h"
#include "common/log.h"
#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/config.h"
#include "main_prov/conn_hello.h"
#include "main_prov/domain.h"
#include "main_prov/interfaces.h"
#include "main_prov/link/tcp_link.h"
#include "main_prov/local_path.h"
#include "main_prov/pep.h"
#include "main_prov/srx.h"

#include <rdma/fi_errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace tandem {

Engine::Engine(Domain *domain, fi_info *info, fid_ep *self)
    : domain_(domain), self_(self), info_(fi_dupinfo(info)) {
    if (!info_ || !info_->ep_attr) fail(FI_EINVAL, "endpoint without attributes");
    type_ = info_->ep_attr->type;
    if (type_ != FI_EP_RDM && type_ != FI_EP_MSG) fail(FI_EINVAL, "unsupported endpoint type");
    caps_ = info_->caps ? info_->caps : (FI_MSG | FI_TAGGED | FI_RMA);
    const compat::CapsMeaning meaning = compat::caps_meaning(caps_, compat::api_version_of(info_));
    // A MSG endpoint has one peer: a receive's source means nothing there.
    directed_[0] = type_ == FI_EP_RDM && meaning.directed_msg;
    directed_[1] = type_ == FI_EP_RDM && meaning.directed_tagged;
    exact_source_ = type_ == FI_EP_RDM && meaning.exact_directed;
    xpu_trigger_ = type_ == FI_EP_RDM && meaning.xpu_trigger;
    caps_ = compat::receive_caps(caps_, compat::api_version_of(info_));
    if (info_->ep_attr->auth_key_size > kMaxAuthKeySize)
        fail(FI_EINVAL, "authorization key longer than tandem takes");
    auth_ = endpoint_auth_digest(info_, domain_->info());
    // Without FI_HMEM there is no device memory to move: report P2P as not in use.
    if (!(caps_ & FI_HMEM)) p2p_.set(FI_HMEM_P2P_DISABLED, false);
    const Config &cfg = Config::get();
    eager_limit_ = cfg.eager_limit;
    inject_size_ = cfg.inject_size;
    for (int k = 0; k < kSizeKinds; ++k) {
        limits_.max[k] = k == kAtomicSize
                             ? std::min<size_t>(atomic::kMaxBytes, info_->ep_attr->max_msg_size)
                             : info_->ep_attr->max_msg_size;
        limits_.inject[k] = std::min(inject_size_, limits_.max[k]);
    }
    direct_inject_ = inject_size_;
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

Engine::~Engine() {
    transport_.reset();
    fi_freeinfo(info_);
    domain_->release();
}

int Engine::close() {
    {
        std::lock_guard guard(domain_->lock());
        if (coll_groups_) return -FI_EBUSY;  // close the collective groups joined first
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
            if (off->ops()) {
                off->ops()->trigger_discard_group(off->domain(), this);
                off->ops()->trigger_discard_group(off->domain(), work_group());
                domain_->note_triggers();
            }
        }
        // The twin's own receives go before the twin: nothing that arrives while the endpoint
        // drains below may land in its memory.
        peer_rx_.drop_posted();
        // Receives whose sender writes its part of a split copy: that part may still land in
        // their buffers, so they are not offered to another message; dropped, unreported.
        for (auto &[id, split] : local_splits_) rx_->drop(split.rx);
        local_splits_.clear();
        twin_cq_ = nullptr;  // (the drain below progresses the link alone)
        twin_ep_ = nullptr;
        twin_quiet_ = nullptr;
        holds_ = nullptr;
        inbox_ring_ = nullptr;
        twin_take_cell_ = nullptr;
        local_.reset();  // the twin first: it holds entries of rx_ until it is closed
        // Receives that staged messages arriving here had taken go back to the front of the
        // queue (a shared receive context outlives us), unreported.
        // (A restaged device message's went through matching in full, a multi-receive's slice
        // perhaps: dropped, as a split copy's.)
        for (auto &[id, staged] : staged_)
            if (staged.into && staged.restaged)
                rx_->drop(staged.into);
            else if (staged.into)
                rx_->post_front(staged.into);
        staged_.clear();
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
    return 0;
}

int Engine::bind_eq(Eq *eq) {
    // Before the guard (see DomainLock::require): from now on EQ reads, from any thread,
    // drive this endpoint's progress, so the domain lock is taken even under
    // FI_THREAD_DOMAIN.
    domain_->lock().require();
    std::lock_guard guard(domain_->lock());
    if (enabled_) return -FI_EOPBADSTATE;
    if (eq_) return -FI_EINVAL;
    eq_ = eq;
    eq_->add_source(this);
    return 0;
}

// A CQ for the directions flags names. Domain lock held.
int Engine::bind_cq(Cq *cq, uint64_t flags) {
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

// A counter for the events flags names (it replaces one bound before). Domain lock held.
int Engine::bind_cntr(Cntr *c, uint64_t flags) {
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

int Engine::bind_av(Av *av, uint64_t flags) {
    if (type_ != FI_EP_RDM || av_) return -FI_EINVAL;
    if (flags) return -FI_EBADFLAGS;
    av_ = av;
    av_->hold();
    av_version_word_ = av_->version_word_ptr();
    return 0;
}

int Engine::bind_srx(struct fid *srx_fid) {
    if (srx_) return -FI_EINVAL;
    auto *srx = SharedRxContext::of(srx_fid);
    if (srx->owner()) {
        if (enabled_) return -FI_EOPBADSTATE;
        // The owner links a provider of its own for this node (shm under lnx): tandem's
        // node-local path would be a second, unmatched one, so the link carries everything.
        owner_srx_ = srx->owner();
        shm_permitted_ = false;
        TANDEM_INFO(FI_LOG_EP_CTRL,
                    "receives matched by the owner of a peer SRX (FI_PEER); node-local path off\n");
    }
    srx->attach(this);
    rx_ = &srx->matcher();
    srx_ = srx_fid;
    return 0;
}

int Engine::bind_stx(struct fid *stx) {
    if (stx_) return -FI_EINVAL;
    stx_ = stx;
    SharedTxContext::of(stx)->attach();
    return 0;
}

int Engine::peer_path(fi_addr_t addr) {
    std::lock_guard guard(domain_->lock());
    if (!enabled_) return -FI_EOPBADSTATE;
    if (type_ == FI_EP_MSG) return int(peer::PeerPath::Link);
    Peer *peer = peer_for(addr);
    if (!goes_local(peer, addr)) return int(peer::PeerPath::Link);
    if (!peer->lane || peer->lane->dead) return -FI_ENOENT;
    return int(peer->lane->cma ? peer::PeerPath::LocalSingleCopy : peer::PeerPath::LocalStaged);
}

int Engine::enable_locked() {
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
        shm::Channel *channel = local_->channel();
        lane_producer_ = channel->sender().producer;
        lane_line_ = channel->sender().short_line;
        twin_cq_ = local_->twin_cq();
        twin_ep_ = local_->twin();
        const bool reads = channel->owner_reads;  // (no inbox: shared memory not permitted)
        inbox_ring_ = reads ? channel->inbox() : nullptr;
        twin_quiet_ = reads ? &channel->twin_quiet : nullptr;
        twin_take_cell_ = local_->take_cell_entry();
        holds_ = reads ? &channel->holds() : nullptr;
    }
    transport_->set_device_p2p(p2p_.mode() != FI_HMEM_P2P_DISABLED);
    // What send_by_link takes: an eager message the link sends from the caller's buffer
    // before returning (LinkConnection::post_send_now).
    const size_t send_now = transport_->caps().max_send_now;
    link_direct_limit_ = send_now > sizeof(wire::ProtoHeader)
                             ? std::min({eager_limit_, send_now - sizeof(wire::ProtoHeader),
                                         size_t(info_->ep_attr->max_msg_size)})
                             : 0;
    direct_ceiling_ = std::max(lane_limit_, link_direct_limit_);
    apply_size_limits();
    // One line per endpoint at info level: a user's log then says which endpoint ran and
    // whether its node-local peers go through off_tandem (FI_TANDEM_LOCAL=0 sends them over the
    // link though the twin is there).
    EndpointName at;
    at.ss = transport_->name();
    const fi_threading threading = domain_->threading();
    TANDEM_INFO(FI_LOG_EP_CTRL,
                "%s endpoint enabled on %s, node-local path %s, at %s, %s (domain lock %s)\n",
                type_ == FI_EP_RDM ? "RDM" : "MSG", info_->domain_attr->name,
                local_ && shm_permitted_ && Config::get().local_path ? "on" : "off",
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

int Engine::set_cm_data_size(size_t size) {
    if (size > cm_data_max_) return -FI_EINVAL;
    cm_data_size_ = size;
    return 0;
}

namespace {

// The kind of operation and the limit a size option names (fi_endpoint(3), 1.22), or -1.
int size_kind(int optname, bool *inject) {
    *inject = optname >= compat::kOptInjectMsgSize;
    const int first = *inject ? compat::kOptInjectMsgSize : compat::kOptMaxMsgSize;
    const int kind = optname - first;
    return optname >= compat::kOptMaxMsgSize && optname <= compat::kOptInjectAtomicSize ? kind : -1;
}

}  // namespace

int Engine::size_limit(int optname, size_t *value) const {
    bool inject;
    const int kind = size_kind(optname, &inject);
    if (kind < 0) return -FI_ENOPROTOOPT;
    *value = inject ? limits_.inject[kind] : limits_.max[kind];
    return 0;
}

// Domain lock held. A limit above the endpoint's attribute is refused; one below it holds
// for the operations posted from now on.
int Engine::set_size_limit(int optname, size_t value) {
    bool inject;
    const int kind = size_kind(optname, &inject);
    if (kind < 0) return -FI_ENOPROTOOPT;
    const size_t ceiling = inject ? std::min(inject_size_, size_t(info_->ep_attr->max_msg_size))
                                  : size_t(info_->ep_attr->max_msg_size);
    if (value > ceiling || (kind == kAtomicSize && !inject && value > atomic::kMaxBytes))
        return -FI_EINVAL;
    (inject ? limits_.inject : limits_.max)[kind] = value;
    apply_size_limits();
    return 0;
}

// send_direct takes only what every limit of a message, tagged or not, lets through; the
// general path checks each kind's own.
void Engine::apply_size_limits() {
    direct_limit_ = std::min({direct_ceiling_, limits_.max[kMsgSize], limits_.max[kTaggedSize]});
    direct_inject_ = std::min(limits_.inject[kMsgSize], limits_.inject[kTaggedSize]);
}

// Domain lock held.
int Engine::set_shared_memory(bool permitted) {
    if (enabled_) return -FI_EOPBADSTATE;
    shm_permitted_ = permitted;
    return 0;
}

// FI_OPT_FI_HMEM_P2P. Domain lock held.
int Engine::set_p2p(int mode) {
    int ret = p2p_.set(mode, can_p2p());
    if (!ret && local_ && (caps_ & FI_HMEM)) local_->set_p2p(p2p_.mode());
    if (!ret && transport_) transport_->set_device_p2p(p2p_.mode() != FI_HMEM_P2P_DISABLED);
    return ret;
}

// Some path of this endpoint can move device memory peer to peer: the node-local one (IPC
// handles and the device's copy engine) or a link that registers device memory with its NIC
// (GPUDirect RDMA); the TCP link always stages. Without FI_HMEM no transfer can be peer to
// peer, so REQUIRED cannot be met there either.
bool Engine::can_p2p() const {
    return (caps_ & FI_HMEM) && ((transport_ && transport_->caps().device_p2p) ||
                                 (type_ == FI_EP_RDM && Config::get().local_path &&
                                  shm_permitted_ && domain_->offload() != nullptr));
}

// FI_TANDEM_HMEM_P2P: the policy an endpoint with FI_HMEM starts with, as if the application
// had set it first thing. One it cannot keep (REQUIRED where no path can) is logged and the
// endpoint keeps ENABLED, as the setopt would have been refused.
void Engine::apply_default_p2p(int mode) {
    if (!(caps_ & FI_HMEM) || mode == FI_HMEM_P2P_ENABLED) return;
    if (int ret = p2p_.set(mode, can_p2p()))
        TANDEM_WARN(FI_LOG_EP_CTRL, "FI_TANDEM_HMEM_P2P: this endpoint cannot take it (%s)\n",
                    fi_strerror(-ret));
}

ssize_t Engine::rx_size_left() {
    std::lock_guard guard(domain_->lock());
    if (!enabled_) return -FI_EOPBADSTATE;
    size_t size = info_->rx_attr ? info_->rx_attr->size : 0;
    return static_cast<ssize_t>(size > rx_->outstanding ? size - rx_->outstanding : 0);
}

ssize_t Engine::tx_size_left() {
    std::lock_guard guard(domain_->lock());
    if (!enabled_) return -FI_EOPBADSTATE;
    size_t size = info_->tx_attr ? info_->tx_attr->size : 0;
    return static_cast<ssize_t>(size > tx_outstanding_ ? size - tx_outstanding_ : 0);
}

int Engine::setname(void *addr, size_t addrlen) {
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

int Engine::getname(void *addr, size_t *addrlen) {
    if (!addrlen) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    return getname_locked(addr, addrlen);
}

int Engine::getname_locked(void *addr, size_t *addrlen) const {
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

// (The application may sleep on the listener too, and wake because a peer connects.)
void Engine::link_fds(std::vector<WaitFd> &out) {
    link_countdown_ = 1;
    empty_link_polls_ = 0;
    transport_->before_sleep();
    transport_->wait_fds(out);
}

void Engine::wait_fds(std::vector<WaitFd> &out) {
    link_fds(out);
    if (local_) local_->wait_fds(out);
}

}  // namespace tandem

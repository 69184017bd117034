// off_tandem's fid_ep: its ops tables and the C entry points into them (the peer transfers'
// table too; the owner's extension is offload_ops.cpp), and its lifecycle: construction,
// bind, enable, options, close. What the endpoint does once enabled is in ep/, one file a
// job; endpoint.h names them.
#include "offload_prov/endpoint.h"

#include "common/auth_key.h"
#include "common/fabric_compat.h"
#include "common/log.h"
#include "common/unsupported_ops.h"
#include "main_prov/shm/copy_costs.h"
#include "offload_prov/av.h"
#include "offload_prov/config.h"
#include "offload_prov/cq.h"
#include "offload_prov/domain.h"
#include "offload_prov/srx.h"

#include <sys/random.h>
#include <unistd.h>

#include <cstring>

namespace tandem::off {

namespace {

fi_ops ep_fi_ops =
    fid_ops(&Trampoline<&Endpoint::close>::call<fid>, &Trampoline<&Endpoint::bind>::call<fid>,
            &Trampoline<&Endpoint::control>::call<fid>, enosys<decltype(fi_ops::ops_open)>);

// Receives are the owner's to cancel.
fi_ops_ep ep_ops =
    fid_ep_ops(enosys<decltype(fi_ops_ep::cancel)>, &Trampoline<&Endpoint::getopt>::call<fid>,
               &Trampoline<&Endpoint::setopt>::call<fid>);

// The owner posts with the *msg calls only (they carry every argument); the short forms
// would pretend to a use nobody makes of an offload endpoint.
fi_ops_msg msg_ops = {
    .size = sizeof(fi_ops_msg),
    .recv = enosys<decltype(fi_ops_msg::recv)>,
    .recvv = enosys<decltype(fi_ops_msg::recvv)>,
    .recvmsg = enosys<decltype(fi_ops_msg::recvmsg)>,
    .send = enosys<decltype(fi_ops_msg::send)>,
    .sendv = enosys<decltype(fi_ops_msg::sendv)>,
    .sendmsg = &Trampoline<&Endpoint::sendmsg>::call<fid_ep>,
    .inject = enosys<decltype(fi_ops_msg::inject)>,
    .senddata = enosys<decltype(fi_ops_msg::senddata)>,
    .injectdata = enosys<decltype(fi_ops_msg::injectdata)>,
};

fi_ops_tagged tagged_ops = {
    .size = sizeof(fi_ops_tagged),
    .recv = enosys<decltype(fi_ops_tagged::recv)>,
    .recvv = enosys<decltype(fi_ops_tagged::recvv)>,
    .recvmsg = enosys<decltype(fi_ops_tagged::recvmsg)>,
    .send = enosys<decltype(fi_ops_tagged::send)>,
    .sendv = enosys<decltype(fi_ops_tagged::sendv)>,
    .sendmsg = &Trampoline<&Endpoint::tsendmsg>::call<fid_ep>,
    .inject = enosys<decltype(fi_ops_tagged::inject)>,
    .senddata = enosys<decltype(fi_ops_tagged::senddata)>,
    .injectdata = enosys<decltype(fi_ops_tagged::injectdata)>,
};

fi_ops_rma rma_ops = {
    .size = sizeof(fi_ops_rma),
    .read = enosys<decltype(fi_ops_rma::read)>,
    .readv = enosys<decltype(fi_ops_rma::readv)>,
    .readmsg = &Trampoline<&Endpoint::readmsg>::call<fid_ep>,
    .write = enosys<decltype(fi_ops_rma::write)>,
    .writev = enosys<decltype(fi_ops_rma::writev)>,
    .writemsg = &Trampoline<&Endpoint::writemsg>::call<fid_ep>,
    .inject = enosys<decltype(fi_ops_rma::inject)>,
    .writedata = enosys<decltype(fi_ops_rma::writedata)>,
    .injectdata = enosys<decltype(fi_ops_rma::injectdata)>,
};

// Completions of the transfers we post on the owner's endpoint (FI_PEER_TRANSFER).
ssize_t transfer_complete(fid_ep *ep, fi_cq_tagged_entry *entry, fi_addr_t *src) noexcept try {
    if (!ep || !entry) return -FI_EINVAL;
    Endpoint::of(ep)->transfer_complete(*entry, src ? *src : FI_ADDR_NOTAVAIL);
    return 0;
} catch (...) {
    return current_exception_errno();
}
ssize_t transfer_comperr(fid_ep *ep, fi_cq_err_entry *err) noexcept try {
    if (!ep || !err) return -FI_EINVAL;
    Endpoint::of(ep)->transfer_error(*err);
    return 0;
} catch (...) {
    return current_exception_errno();
}
fi_ops_transfer_peer transfer_ops = {sizeof(fi_ops_transfer_peer), transfer_complete,
                                     transfer_comperr};

// What a peer's CMA probe must read from us (SegmentInfo::probe_value), at an address that
// stays put: random, so that a read that lands in some other process, under a pid that means
// another process there, cannot pass for one that reached us. Drawn at the first enable.
const uint64_t &probe_word() {
    static const uint64_t word = [] {
        uint64_t w = 0;
        if (getrandom(&w, sizeof w, 0) != ssize_t(sizeof w))
            w = shm::SegmentInfo::kMagic ^ uint64_t(getpid());
        return w;
    }();
    return word;
}

}  // namespace

Endpoint::Endpoint(Domain *domain, const fi_info *info, fi_peer_transfer_context *transfer)
    : domain_(domain), info_(fi_dupinfo(info)), owner_ep_(transfer->ep) {
    if (!info_) fail(FI_ENOMEM, "fi_dupinfo");
    auth_ = endpoint_auth_digest(info_, nullptr);  // the owner passes its endpoint's key
    init_fid(FI_CLASS_EP, nullptr, &ep_fi_ops);
    fid()->ops = &ep_ops;
    fid()->msg = &msg_ops;
    fid()->tagged = &tagged_ops;
    fid()->rma = &rma_ops;
    fid()->atomic = atomic_ops();
    complete_ep_tables(*fid());
    transfer->peer_ops = &transfer_ops;
    domain_->hold();
}

Endpoint::~Endpoint() {
    // Receives matched for split copies still waiting for their sender: their entries go
    // back to the owner, which is closing the endpoint they belong to.
    if (srx_) {
        for (auto &[id, split] : splits_)
            if (split.entry) srx_->owner().free_entry(split.entry);
        // (and those of receive completions the owner's CQ never took)
        for (; !cq_backlog_.empty(); cq_backlog_.pop_front())
            if (cq_backlog_.front().entry) srx_->owner().free_entry(cq_backlog_.front().entry);
    }
    // Messages queued with the owner belong to the owner's entries now: the owner frees the
    // entries when it closes (it closes us first), so only our side of them goes here.
    for (HeldMessage *h : held_) delete h;
    // The owner's channel outlives us: it names nobody who is gone (what waits in its
    // backlogs is dropped with it).
    if (sender_) *sender_ = shm::Sender{};
    if (cq_) cq_->detach(this);
    if (av_) av_->release();
    if (srx_) srx_->release();
    fi_freeinfo(info_);
    domain_->release();
}

int Endpoint::close() {
    delete this;
    return 0;
}

int Endpoint::bind(struct fid *bfid, uint64_t flags) {
    if (!bfid) return -FI_EINVAL;
    if (enabled_) return -FI_EOPBADSTATE;
    switch (bfid->fclass) {
        case FI_CLASS_CQ:
            if (cq_) return -FI_EINVAL;
            if (!(flags & (FI_TRANSMIT | FI_RECV))) return -FI_EBADFLAGS;
            cq_ = Cq::of(bfid);
            cq_->attach(this);
            return 0;
        case FI_CLASS_AV:
            if (av_) return -FI_EINVAL;
            av_ = Av::of(bfid);
            av_->hold();
            return 0;
        case FI_CLASS_SRX_CTX:
            if (srx_) return -FI_EINVAL;
            srx_ = Srx::of(bfid);
            srx_->hold();
            return 0;
        case FI_CLASS_EQ:
            return 0;  // nothing of ours raises connection events
        default:
            return -FI_EINVAL;
    }
}

int Endpoint::control(int command, void *) {
    if (command != FI_ENABLE) return -FI_ENOSYS;
    if (!cq_ || !av_ || !srx_) return -FI_ENOCQ;
    if (!enabled_) enable();
    return 0;
}

int Endpoint::attach(shm::Channel *channel, const peer::OwnerOps *owner_ops) {
    if (enabled_ || channel_) return -FI_EOPBADSTATE;
    channel_ = channel;
    owner_ep_ops_ = owner_ops;
    if (owner_ops && owner_ops->mr_generation) mr_generation_ = owner_ops->mr_generation(owner_ep_);
    return 0;
}

// The inbox is named after the owner endpoint's address, which peers know from their AV.
void Endpoint::enable() {
    uint8_t name[128];
    size_t len = sizeof name;
    int ret = fi_getname(&owner_ep_->fid, name, &len);
    if (ret) fail(-ret, "fi_getname of the owner endpoint");
    auto key = shm::local_key(name, len);
    if (!key || len > wire::kLocalNameRoom) fail(FI_EINVAL, "owner address not an IP address");
    memcpy(name_, name, len);
    proto_.name_len = static_cast<uint8_t>(len);
    short_line_.build(name_, len);
    proto_.pid = getpid();
    if (!channel_) {
        own_channel_ = std::make_unique<OwnChannel>();
        channel_ = &own_channel_->channel;
    }
    sender_ = &channel_->sender();
    sender_->producer = own_process_token();  // our claims in peers' rings
    sender_->name = name_;
    sender_->short_line = &short_line_;
    stream_ends_.ep = this;
    sender_->streams = &stream_ends_;
    if (!shm_permitted_) {
        // No segment, no inbox: our passes read nothing (as when the owner reads it). A
        // wake without a FIFO still ends a sleep for our checks (collectives probing their
        // members).
        channel_->open_wake_only();
        enabled_ = true;
        return;
    }

    // Who we are in our inbox, and whom we take for a peer: the same authorization key and
    // job in both.
    const Config &config = Config::get();
    // What copies cost decides between staging a large message and single copy
    // (stages_better): measured at set-up, so that no message waits for it, by the first
    // endpoint of the process (CopyCosts::get logs it). Before the inbox exists: its heartbeat
    // starts when it is made, and a peer that found it older than kPeerPollMs (the
    // measurement took longer) would take us for a receiver without a core and stage what it
    // sends.
    if (config.cma) (void)CopyCosts::get();
    const shm::Channel::InboxShape shape{
        .cells = static_cast<uint32_t>(config.ring_cells),
        .cell_size = wire::kLocalCellSize,
        .identity = {.probe_addr = reinterpret_cast<uint64_t>(&probe_word()),
                     .probe_value = probe_word(),
                     .auth = auth_,
                     .job = config.job}};
    channel_->open_inbox(*key, shape,
                         {.auth = shape.identity.auth,
                          .job = shape.identity.job,
                          .cma = config.cma,
                          .cma_off = " (FI_OFF_TANDEM_CMA=0)"});
    enabled_ = true;
}

int Endpoint::setopt(int level, int optname, const void *optval, size_t optlen) {
    if (level == FI_OPT_ENDPOINT && optname == compat::kOptSharedMemoryPermitted) {
        if (!optval || optlen != sizeof(bool)) return -FI_EINVAL;
        if (enabled_) return -FI_EOPBADSTATE;
        shm_permitted_ = *static_cast<const bool *>(optval);
        return 0;
    }
    if (level != FI_OPT_ENDPOINT || optname != FI_OPT_FI_HMEM_P2P) return -FI_ENOPROTOOPT;
    if (!optval || optlen != sizeof(int)) return -FI_EINVAL;
    // The node-local path can go peer to peer wherever the driver gives IPC handles.
    return p2p_.set(*static_cast<const int *>(optval), hmem::Registry::instance().any_device());
}

int Endpoint::getopt(int level, int optname, void *optval, size_t *optlen) {
    if (level != FI_OPT_ENDPOINT || optname != FI_OPT_FI_HMEM_P2P) return -FI_ENOPROTOOPT;
    if (!optval || !optlen || *optlen < sizeof(int)) return -FI_EINVAL;
    *static_cast<int *>(optval) = p2p_.mode();
    *optlen = sizeof(int);
    return 0;
}

// Completions of the peer transfers we post on the owner's endpoint: our collectives' messages
// to other processes (coll::Engine's contexts), which are all we post there.
void Endpoint::transfer_complete(const fi_cq_tagged_entry &entry, fi_addr_t) {
    note_work();
    if (coll::Engine::owns(entry.op_context))
        coll_.transfer_done(entry.op_context, 0);
    else
        TANDEM_WARN(FI_LOG_EP_DATA, "a peer transfer completed that we never posted: ignored\n");
}

void Endpoint::transfer_error(const fi_cq_err_entry &err) {
    note_work();
    if (coll::Engine::owns(err.op_context))
        coll_.transfer_done(err.op_context, err.err ? err.err : FI_EIO);
    else
        TANDEM_WARN(FI_LOG_EP_DATA, "a peer transfer failed that we never posted: %s\n",
                    fi_strerror(err.err));
}

}  // namespace tandem::off

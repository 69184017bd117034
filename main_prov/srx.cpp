#include "main_prov/srx.h"

#include "common/unsupported_ops.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"

namespace tandem {

namespace {

fi_ops srx_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&SharedRxContext::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = &Trampoline<&SharedRxContext::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_ep srx_ep_ops = fid_ep_ops(&Trampoline<&SharedRxContext::cancel>::call<struct fid>,
                                  &Trampoline<&SharedRxContext::getopt>::call<struct fid>,
                                  &Trampoline<&SharedRxContext::setopt>::call<struct fid>);

fi_ops_msg srx_msg_ops = {
    .size = sizeof(fi_ops_msg),
    .recv = &Trampoline<&SharedRxContext::recv>::call<fid_ep>,
    .recvv = &Trampoline<&SharedRxContext::recvv>::call<fid_ep>,
    .recvmsg = &Trampoline<&SharedRxContext::recvmsg>::call<fid_ep>,
    .send = enosys<decltype(fi_ops_msg::send)>,
    .sendv = enosys<decltype(fi_ops_msg::sendv)>,
    .sendmsg = enosys<decltype(fi_ops_msg::sendmsg)>,
    .inject = enosys<decltype(fi_ops_msg::inject)>,
    .senddata = enosys<decltype(fi_ops_msg::senddata)>,
    .injectdata = enosys<decltype(fi_ops_msg::injectdata)>,
};

fi_ops_tagged srx_tagged_ops = {
    .size = sizeof(fi_ops_tagged),
    .recv = &Trampoline<&SharedRxContext::trecv>::call<fid_ep>,
    .recvv = &Trampoline<&SharedRxContext::trecvv>::call<fid_ep>,
    .recvmsg = &Trampoline<&SharedRxContext::trecvmsg>::call<fid_ep>,
    .send = enosys<decltype(fi_ops_tagged::send)>,
    .sendv = enosys<decltype(fi_ops_tagged::sendv)>,
    .sendmsg = enosys<decltype(fi_ops_tagged::sendmsg)>,
    .inject = enosys<decltype(fi_ops_tagged::inject)>,
    .senddata = enosys<decltype(fi_ops_tagged::senddata)>,
    .injectdata = enosys<decltype(fi_ops_tagged::injectdata)>,
};

fi_ops stx_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&SharedTxContext::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = enosys<decltype(fi_ops::control)>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_ep stx_ep_ops = fid_ep_ops();

}  // namespace

SharedRxContext::SharedRxContext(Domain *domain, const fi_rx_attr &attr, void *context)
    : domain_(domain),
      caps_(compat::receive_caps(
          attr.caps ? attr.caps : (FI_MSG | FI_TAGGED | FI_MULTI_RECV | FI_DIRECTED_RECV),
          compat::api_version_of(domain->info()))),
      meaning_(compat::caps_meaning(caps_, compat::api_version_of(domain->info()))),
      op_flags_(attr.op_flags),
      size_(attr.size ? attr.size : domain->info()->rx_attr->size) {
    if (attr.iov_limit > kMaxIov) fail(FI_EINVAL, "iov_limit too large");
    if (attr.op_flags & FI_PEER) {
        fid_peer_srx *srx = peer::ForeignOwnerSrx::from_context(context);
        if (!srx) fail(FI_EINVAL, "FI_PEER SRX without a peer SRX context");
        owner_ = std::make_unique<peer::ForeignOwnerSrx>(srx, peer::ForeignOwnerSrx::core_abi());
        owner_->install(Engine::owner_peer_ops());
        op_flags_ &= ~uint64_t(FI_PEER);
    }
    init_fid(FI_CLASS_SRX_CTX, context, &srx_fi_ops);
    fid()->ops = &srx_ep_ops;
    fid()->msg = &srx_msg_ops;
    fid()->tagged = &srx_tagged_ops;
    complete_ep_tables(*fid());
    domain_->hold();
}

SharedRxContext::~SharedRxContext() {
    domain_->release();
}

int SharedRxContext::close() {
    {
        std::lock_guard guard(domain_->lock());
        if (!endpoints_.empty()) return -FI_EBUSY;
    }
    delete this;
    return 0;
}

// fi_export_fid: a fid_peer_srx over this context's matcher. The importer reports its
// receive completions itself (PeerRxQueue::Mode::Direct); its entries must be returned
// (free_entry) before this context is closed.
int SharedRxContext::control(int command, void *arg) {
    if (command != FI_EXPORT_FID || owner_) return -FI_ENOSYS;
    auto *exp = static_cast<fi_fid_export *>(arg);
    if (!exp || !exp->fid) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    if (!exported_)
        exported_ = std::make_unique<PeerRxQueue>(*domain_, matcher_, report_endpoint(),
                                                  PeerRxQueue::Mode::Direct, false);
    *exp->fid = exported_->exported().base_fid();
    return 0;
}

ssize_t SharedRxContext::cancel(void *context) {
    std::lock_guard guard(domain_->lock());
    return Engine::cancel_on(matcher_, report_endpoint(), context);
}

int SharedRxContext::getopt(int level, int optname, void *optval, size_t *optlen) {
    if (level != FI_OPT_ENDPOINT || optname != FI_OPT_MIN_MULTI_RECV) return -FI_ENOPROTOOPT;
    if (!optval || !optlen || *optlen < sizeof(size_t)) return -FI_EINVAL;
    *static_cast<size_t *>(optval) = matcher_.min_multi_recv;
    *optlen = sizeof(size_t);
    return 0;
}

int SharedRxContext::setopt(int level, int optname, const void *optval, size_t optlen) {
    if (level != FI_OPT_ENDPOINT || optname != FI_OPT_MIN_MULTI_RECV) return -FI_ENOPROTOOPT;
    if (!optval || optlen != sizeof(size_t)) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    matcher_.min_multi_recv = *static_cast<const size_t *>(optval);
    return 0;
}

ssize_t SharedRxContext::post(const iovec *iov, void **desc, size_t count, fi_addr_t src,
                              void *context, uint64_t flags, uint64_t tag, uint64_t ignore,
                              bool tagged) {
    if (owner_) return -FI_EOPNOTSUPP;  // (the owner posts every receive)
    std::lock_guard guard(domain_->lock());
    if (!(caps_ & (tagged ? FI_TAGGED : FI_MSG))) return -FI_EOPNOTSUPP;
    if (matcher_.outstanding >= size_) return -FI_EAGAIN;
    if (meaning_.exact_directed && src == FI_ADDR_UNSPEC) return -FI_EINVAL;
    if (!(tagged ? meaning_.directed_tagged : meaning_.directed_msg)) src = FI_ADDR_UNSPEC;
    Engine::RecvArgs args{iov, desc, count, src, context, flags, tag, ignore, tagged};
    if (tagged && (flags & (FI_PEEK | FI_CLAIM))) {
        for (Engine *ep : endpoints_) ep->progress();
        return Engine::peek_or_claim_on(matcher_, report_endpoint(), args);
    }
    return Engine::post_recv_on(matcher_, report_endpoint(), caps_, args);
}

ssize_t SharedRxContext::recv(void *buf, size_t len, void *desc, fi_addr_t src, void *context) {
    iovec iov{buf, len};
    return post(&iov, &desc, 1, src, context, op_flags_, 0, 0, false);
}
ssize_t SharedRxContext::recvv(const iovec *iov, void **desc, size_t count, fi_addr_t src,
                               void *context) {
    return post(iov, desc, count, src, context, op_flags_, 0, 0, false);
}
ssize_t SharedRxContext::recvmsg(const fi_msg *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post(msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags, 0, 0,
                false);
}
ssize_t SharedRxContext::trecv(void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag,
                               uint64_t ignore, void *context) {
    iovec iov{buf, len};
    return post(&iov, &desc, 1, src, context, op_flags_, tag, ignore, true);
}
ssize_t SharedRxContext::trecvv(const iovec *iov, void **desc, size_t count, fi_addr_t src,
                                uint64_t tag, uint64_t ignore, void *context) {
    return post(iov, desc, count, src, context, op_flags_, tag, ignore, true);
}
ssize_t SharedRxContext::trecvmsg(const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post(msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags, msg->tag,
                msg->ignore, true);
}

SharedTxContext::SharedTxContext(Domain *domain, const fi_tx_attr &attr, void *context)
    : domain_(domain) {
    if (attr.iov_limit > kMaxIov) fail(FI_EINVAL, "iov_limit too large");
    init_fid(FI_CLASS_STX_CTX, context, &stx_fi_ops);
    fid()->ops = &stx_ep_ops;
    domain_->hold();
}

SharedTxContext::~SharedTxContext() {
    domain_->release();
}

int SharedTxContext::close() {
    {
        std::lock_guard guard(domain_->lock());
        if (users_) return -FI_EBUSY;
    }
    delete this;
    return 0;
}

}  // namespace tandem

#include "main_prov/owner_face.h"

#include "common/unsupported_ops.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"
#include "main_prov/lock_order.h"
#include "peer/offload_ops.h"

namespace tandem {

namespace {

// peer::OwnerOps: RMA arriving over the node-local path is checked against the owner's
// domain like RMA arriving over a link.
int resolve_key(fid_ep *fid, uint64_t key, uint64_t addr, size_t len, uint64_t access, iovec *iov,
                hmem::MemRef *mem, size_t *count) noexcept {
    if (!fid || !count || (!iov && *count)) return -FI_EINVAL;
    Engine &ep = OwnerFace::of(fid)->endpoint();
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep.domain());
    LocalPieces pieces;
    if (!ep.resolve(key, addr, len, access, pieces)) return -FI_EACCES;
    if (pieces.count > *count) return -FI_ETOOSMALL;
    for (size_t i = 0; i < pieces.count; ++i) {
        iov[i] = pieces.iov[i];
        if (mem) mem[i] = pieces.mem[i];
    }
    *count = pieces.count;
    return 0;
}

void key_access_done(fid_ep *fid, uint64_t key, uint64_t access) noexcept {
    if (!fid) return;
    Engine &ep = OwnerFace::of(fid)->endpoint();
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep.domain());
    ep.remote_access_done(key, access);
}

const std::atomic<uint64_t> *mr_generation(fid_ep *fid) noexcept {
    return OwnerFace::of(fid)->endpoint().domain()->mr_table().generation();
}

const peer::OwnerOps owner_ops_table = {sizeof(peer::OwnerOps), resolve_key, key_access_done,
                                        mr_generation};

// The face belongs to the endpoint's node-local path, which closes it: the twin never does.
int refuse_close(fid *) noexcept {
    return -FI_EBUSY;
}

fi_ops face_fi_ops = fid_ops(&refuse_close, enosys<decltype(fi_ops::bind)>,
                             enosys<decltype(fi_ops::control)>, enosys<decltype(fi_ops::ops_open)>);

fi_ops_ep face_ep_ops = fid_ep_ops(&Trampoline<&OwnerFace::cancel>::call<fid>);

fi_ops_cm face_cm_ops = [] {
    fi_ops_cm ops = kNoCmOps;
    ops.getname = &Trampoline<&OwnerFace::getname>::call<fid>;
    return ops;
}();

fi_ops_msg face_msg_ops = [] {
    fi_ops_msg ops = kNoMsgOps;
    ops.sendmsg = &Trampoline<&OwnerFace::sendmsg>::call<fid_ep>;
    ops.recvmsg = &Trampoline<&OwnerFace::recvmsg>::call<fid_ep>;
    return ops;
}();

fi_ops_tagged face_tagged_ops = [] {
    fi_ops_tagged ops = kNoTaggedOps;
    ops.sendmsg = &Trampoline<&OwnerFace::tsendmsg>::call<fid_ep>;
    ops.recvmsg = &Trampoline<&OwnerFace::trecvmsg>::call<fid_ep>;
    return ops;
}();

}  // namespace

OwnerFace::OwnerFace(Engine &ep) : ep_(ep) {
    init_fid(FI_CLASS_EP, nullptr, &face_fi_ops);
    fid()->ops = &face_ep_ops;
    fid()->cm = &face_cm_ops;
    fid()->msg = &face_msg_ops;
    fid()->tagged = &face_tagged_ops;
    complete_ep_tables(*fid());
}

const peer::OwnerOps &OwnerFace::owner_ops() {
    return owner_ops_table;
}

ssize_t OwnerFace::cancel(void *context) {
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep_.domain());
    return ep_.cancel_locked(context);
}

int OwnerFace::getname(void *addr, size_t *addrlen) {
    if (!addrlen) return -FI_EINVAL;
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep_.domain());
    return ep_.getname_locked(addr, addrlen);
}

// Only the twin's own traffic comes this way: a transfer without FI_PEER_TRANSFER would be
// the application's, which has its own endpoint.
ssize_t OwnerFace::sendmsg(const fi_msg *msg, uint64_t flags) {
    if (!msg || !(flags & FI_PEER_TRANSFER)) return -FI_EINVAL;
    return send({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags, 0,
                 msg->data, false});
}

ssize_t OwnerFace::recvmsg(const fi_msg *msg, uint64_t flags) {
    if (!msg || !(flags & FI_PEER_TRANSFER)) return -FI_EINVAL;
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep_.domain());
    return ep_.post_recv_locked(
        {msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags, 0, 0, false});
}

ssize_t OwnerFace::tsendmsg(const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg || !(flags & FI_PEER_TRANSFER)) return -FI_EINVAL;
    return send({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context, flags, msg->tag,
                 msg->data, true});
}

ssize_t OwnerFace::trecvmsg(const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg || !(flags & FI_PEER_TRANSFER)) return -FI_EINVAL;
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep_.domain());
    return ep_.post_recv_locked({msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->context,
                                 flags, msg->tag, msg->ignore, true});
}

ssize_t OwnerFace::send(const Engine::SendArgs &a) {
    SendRequest r;
    if (int ret = ep_.prepare_send(a, r)) return ret;
    TANDEM_ASSERT_DOMAIN_LOCK_HELD(ep_.domain());
    return ep_.post_send_locked(a, r);
}

}  // namespace tandem

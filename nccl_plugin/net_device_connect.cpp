// NetDevice's connection set-up (listen, connect, accept): the Connect and Accept handshake
// under the numbers of the comms it joins, and one address table entry per peer process. What
// a Connect or an Accept receive completes with is handled with the other completions
// (net_device_data.cpp).
#include "nccl_plugin/net_device.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <cstring>
#include <memory>
#include <random>

namespace tandem::nccl {

namespace {

using wire::NcclTagKind;

constexpr int kCtsReceives = 8;  // standing clear-to-send receives per send comm

uint64_t random_nonce() {
    static std::mt19937_64 gen{std::random_device{}()};
    uint64_t n;
    do n = gen();
    while (n == 0);
    return n;
}

// Whether a handle NCCL passes to connect is one of tandem's listen handles, whole.
bool valid_handle(const wire::NcclHandle &in) {
    return in.magic == wire::kNcclHandleMagic && in.version == wire::kNcclVersion &&
           in.addr_len != 0 && in.addr_len <= wire::kNcclMaxAddr && in.listen_comm != 0 &&
           in.listen_comm <= wire::kNcclMaxComms && in.nonce != 0;
}

// A Connect or an Accept naming our comm and the listen comm's nonce (a Connect adds our
// address).
wire::NcclConnect handshake(uint32_t comm, uint64_t nonce) {
    wire::NcclConnect c{};
    c.magic = wire::kNcclHandleMagic;
    c.version = wire::kNcclVersion;
    c.comm = comm;
    c.nonce = nonce;
    return c;
}

}  // namespace

// One table entry per peer process: its connections in both directions share it, since
// directed receives match the entry tandem resolves a message's source to, which is the first.
fi_addr_t NetDevice::peer_address(const uint8_t *addr, size_t len) {
    std::string key(reinterpret_cast<const char *>(addr), len);
    if (auto it = peers_.find(key); it != peers_.end()) return it->second;
    fi_addr_t peer = FI_ADDR_NOTAVAIL;
    int ret = fi_av_insert(av_, addr, 1, &peer, 0, nullptr);
    if (ret != 1) {
        NCCL_TANDEM_WARN("NET/tandem: fi_av_insert: %s", fi_strerror(ret < 0 ? -ret : FI_EINVAL));
        return FI_ADDR_NOTAVAIL;
    }
    peers_.emplace(std::move(key), peer);
    return peer;
}

Result NetDevice::listen(void *handle, void **listen_comm) {
    if (!handle || !listen_comm) WARN_RETURN(kInternalError, "NET/tandem: listen without a handle");
    std::lock_guard lk(mu_);
    if (Result r = open_locked()) return r;
    auto l = std::make_unique<ListenComm>();
    l->number = take_number();
    if (!l->number) WARN_RETURN(kSystemError, "NET/tandem: out of comm numbers");
    l->nonce = random_nonce();
    uint32_t number = l->number;
    uint64_t h = listens_.add(std::move(l));
    ListenComm *lc = listens_.find(h);
    Op *op = new_op(int(OpKind::ConnectRecv));
    op->comm = h;
    if (Result r = post_receive(op, &op->connect, sizeof op->connect, nullptr, FI_ADDR_UNSPEC,
                                wire::nccl_tag(NcclTagKind::Connect, number, 0, 0),
                                wire::kNcclCommIgnore)) {
        numbers_.erase(number);
        listens_.remove(h);
        return r;
    }
    lc->posted = op;
    wire::NcclHandle out{};
    out.magic = wire::kNcclHandleMagic;
    out.version = wire::kNcclVersion;
    out.addr_len = uint8_t(name_len_);
    out.listen_comm = number;
    out.nonce = lc->nonce;
    std::memcpy(out.addr, name_.data(), name_len_);
    std::memset(handle, 0, kHandleMaxSize);
    std::memcpy(handle, &out, sizeof out);
    *listen_comm = reinterpret_cast<void *>(h);
    return kSuccess;
}

// A Connect or Accept (op->connect) sent with that tag, tried again while tandem has no room
// (progress makes some). When it cannot be sent the operation is freed; its error returned.
ssize_t NetDevice::send_handshake(Op *op, fi_addr_t peer, uint64_t tag) {
    ssize_t ret;
    for (int attempt = 0; (ret = fi_tsend(ep_, &op->connect, sizeof op->connect, nullptr, peer, tag,
                                          &op->ctx)) == -FI_EAGAIN &&
                          attempt < 1000;
         ++attempt)
        progress_locked();
    if (ret) {
        ops_.erase(op);
        delete op;
    }
    return ret;
}

// connect again on a handle whose connection is under way: connected (send_comm set), still
// waiting for the Accept, or failed (the handle is reset, so that a later connect starts anew).
Result NetDevice::connect_again(wire::NcclHandle &in, void *handle, void **send_comm) {
    SendComm *s = sends_.find(in.connecting);
    if (!s)
        WARN_RETURN(kInvalidUsage,
                    "NET/tandem: connect: the handle names a connection that "
                    "is not under way");
    progress_locked();
    if (s->failed) {
        numbers_.erase(s->number);
        cancel_posted(s->posted);
        sends_.remove(in.connecting);
        in.connecting = 0;
        std::memcpy(handle, &in, sizeof in);
        WARN_RETURN(kSystemError, "NET/tandem: connect: connection failed");
    }
    if (s->ready) *send_comm = reinterpret_cast<void *>(in.connecting);
    return kSuccess;
}

// A new send comm's receives: the Accept, and standing clear-to-send receives (more messages
// wait in tandem's unexpected queue). Those posted are in comm.posted.
Result NetDevice::post_send_comm_receives(uint64_t h, SendComm &comm) {
    Op *acc = new_op(int(OpKind::AcceptRecv));
    acc->comm = h;
    if (Result r = post_receive(acc, &acc->connect, sizeof acc->connect, nullptr, comm.peer,
                                wire::nccl_tag(NcclTagKind::Accept, comm.number, 0, 0),
                                wire::kNcclCommIgnore))
        return r;
    comm.posted.push_back(acc);
    for (int i = 0; i < kCtsReceives; ++i) {
        Op *op = new_op(int(OpKind::CtsRecv));
        op->comm = h;
        op->batch.resize(wire::kNcclCtsBatch);
        if (Result r = post_receive(
                op, op->batch.data(), op->batch.size() * sizeof(wire::NcclCts), nullptr, comm.peer,
                wire::nccl_tag(NcclTagKind::Cts, comm.number, 0, 0), wire::kNcclCommIgnore))
            return r;
        comm.posted.push_back(op);
    }
    return kSuccess;
}

Result NetDevice::connect(void *handle, void **send_comm) {
    if (!handle || !send_comm) WARN_RETURN(kInternalError, "NET/tandem: connect without a handle");
    *send_comm = nullptr;
    wire::NcclHandle in;
    std::memcpy(&in, handle, sizeof in);
    if (!valid_handle(in))
        WARN_RETURN(kInvalidUsage,
                    "NET/tandem: connect: the handle is not one of tandem's (magic %#x, version "
                    "%u): was it made by another plugin, or corrupted on the way?",
                    in.magic, in.version);
    std::lock_guard lk(mu_);
    if (Result r = open_locked()) return r;
    if (in.connecting) return connect_again(in, handle, send_comm);
    fi_addr_t peer = peer_address(in.addr, in.addr_len);
    if (peer == FI_ADDR_NOTAVAIL)
        WARN_RETURN(kInvalidUsage, "NET/tandem: connect: the handle's address is not usable");
    auto s = std::make_unique<SendComm>();
    s->number = take_number();
    if (!s->number) WARN_RETURN(kSystemError, "NET/tandem: out of comm numbers");
    s->peer = peer;
    s->nonce = in.nonce;
    uint32_t number = s->number;
    uint64_t h = sends_.add(std::move(s));
    SendComm *sc = sends_.find(h);
    auto undo = [&](Result r) {
        cancel_posted(sc->posted);
        numbers_.erase(number);
        sends_.remove(h);
        return r;
    };
    if (Result r = post_send_comm_receives(h, *sc)) return undo(r);
    Op *hello = new_op(int(OpKind::Handshake));
    hello->comm = h;
    hello->connect = handshake(number, in.nonce);
    hello->connect.addr_len = uint8_t(name_len_);
    std::memcpy(hello->connect.addr, name_.data(), name_len_);
    if (ssize_t ret =
            send_handshake(hello, peer, wire::nccl_tag(NcclTagKind::Connect, in.listen_comm, 0, 0)))
        return undo(fabric_error("fi_tsend (connect)", int(ret)));
    in.connecting = h;
    std::memcpy(handle, &in, sizeof in);
    progress_locked();
    return kSuccess;
}

Result NetDevice::accept(void *listen_comm, void **recv_comm) {
    if (!recv_comm) WARN_RETURN(kInternalError, "NET/tandem: accept without an output");
    *recv_comm = nullptr;
    std::lock_guard lk(mu_);
    ListenComm *l = listens_.find(listen_comm);
    if (!l) WARN_RETURN(kInvalidUsage, "NET/tandem: accept: %p is no listen comm", listen_comm);
    if (l->accepted)
        WARN_RETURN(kInvalidUsage,
                    "NET/tandem: accept: this listen comm already accepted its "
                    "connection (one per listen)");
    progress_locked();
    if (!l->arrived) {
        if (!l->posted)
            WARN_RETURN(kSystemError, "NET/tandem: accept: the listen comm lost its receive");
        return kSuccess;
    }
    fi_addr_t peer = peer_address(l->peer.addr, l->peer.addr_len);
    if (peer == FI_ADDR_NOTAVAIL)
        WARN_RETURN(kSystemError, "NET/tandem: accept: the sender's address is not usable");
    auto r = std::make_unique<RecvComm>();
    r->number = take_number();
    if (!r->number) WARN_RETURN(kSystemError, "NET/tandem: out of comm numbers");
    r->peer = peer;
    r->remote = l->peer.comm;
    uint32_t number = r->number;
    uint64_t h = recvs_.add(std::move(r));
    Op *op = new_op(int(OpKind::Handshake));
    op->connect = handshake(number, l->nonce);
    if (ssize_t ret =
            send_handshake(op, peer, wire::nccl_tag(NcclTagKind::Accept, l->peer.comm, 0, 0))) {
        numbers_.erase(number);
        recvs_.remove(h);
        return fabric_error("fi_tsend (accept)", int(ret));
    }
    l->accepted = true;
    *recv_comm = reinterpret_cast<void *>(h);
    return kSuccess;
}

}  // namespace tandem::nccl

#include "nccl_plugin/net_device.h"

#include "hmem/hmem.h"
#include "nccl_plugin/plugin.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/stat.h>

#include <cstring>
#include <random>

namespace tandem::nccl {

namespace {

using wire::NcclTagKind;

uint64_t seq_key(int tag, uint32_t seq) {
    return uint64_t(uint32_t(tag)) << 32 | seq;
}
uint16_t tag_seq(uint32_t seq) {
    return uint16_t(seq & wire::kNcclSeqMask);
}
constexpr int kCtsReceives = 8;  // standing clear-to-send receives per send comm
constexpr size_t kSpareOps = 1024;

uint64_t random_nonce() {
    static std::mt19937_64 gen{std::random_device{}()};
    uint64_t n;
    do n = gen();
    while (n == 0);
    return n;
}

Result result_of(int err) {
    return err == FI_ETRUNC ? kInvalidUsage : kSystemError;
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

NetDevice::NetDevice(uint8_t index, const fi_info *info, DeviceDescription description,
                     const Options &options)
    : index_(index),
      info_(fi_dupinfo(info)),
      description_(std::move(description)),
      options_(options),
      listens_(HandleKind::Listen, index),
      sends_(HandleKind::Send, index),
      recvs_(HandleKind::Recv, index),
      requests_(HandleKind::Request, index),
      memory_(HandleKind::Memory, index) {}

NetDevice::~NetDevice() {
    close_locked();
    fi_freeinfo(info_);
}

Result NetDevice::fabric_error(const char *call, int ret) {
    WARN_RETURN(kSystemError, "NET/tandem %s: %s failed: %s (%d)", description_.name.c_str(), call,
                fi_strerror(-ret), ret);
}

Result NetDevice::open_locked() {
    if (ep_) return kSuccess;
    if (!info_) WARN_RETURN(kSystemError, "NET/tandem: no fi_info for device %d", index_);
    int ret = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
    if (ret) return fabric_error("fi_fabric", ret);
    if ((ret = fi_domain(fabric_, info_, &domain_, nullptr))) {
        close_locked();
        return fabric_error("fi_domain", ret);
    }
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.size = 16384;
    if ((ret = fi_av_open(domain_, &av_attr, &av_, nullptr)) ||
        (ret = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) ||
        (ret = fi_endpoint(domain_, info_, &ep_, nullptr)) ||
        (ret = fi_ep_bind(ep_, &av_->fid, 0)) ||
        (ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV))) {
        close_locked();
        return fabric_error("opening the endpoint", ret);
    }
    if (options_.p2p >= 0) {
        int mode = options_.p2p;
        if ((ret = fi_setopt(&ep_->fid, FI_OPT_ENDPOINT, FI_OPT_FI_HMEM_P2P, &mode, sizeof mode))) {
            close_locked();
            return fabric_error("fi_setopt(FI_OPT_FI_HMEM_P2P)", ret);
        }
    }
    size_t len = name_.size();
    if ((ret = fi_enable(ep_)) || (ret = fi_getname(&ep_->fid, name_.data(), &len))) {
        close_locked();
        return fabric_error("enabling the endpoint", ret);
    }
    name_len_ = len;
    virt_addr_ = (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    NCCL_TANDEM_INFO("NET/tandem %s: endpoint open (%s, eager limit %zu B)",
                     description_.name.c_str(), info_->fabric_attr->name, options_.eager_max);
    return kSuccess;
}

// Endpoint first: nothing completes after it, so the operations still posted can be freed.
void NetDevice::close_locked() {
    if (ep_) fi_close(&ep_->fid);
    ep_ = nullptr;
    for (Op *op : ops_) delete op;
    ops_.clear();
    for (Op *op : spare_ops_) delete op;
    spare_ops_.clear();
    cts_pending_.clear();
    memory_.for_each([](MemHandle &m) {
        if (m.mr) fi_close(&m.mr->fid);
        m.mr = nullptr;
    });
    if (cq_) fi_close(&cq_->fid);
    if (av_) fi_close(&av_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    cq_ = nullptr;
    av_ = nullptr;
    domain_ = nullptr;
    fabric_ = nullptr;
    control_.clear();
    writes_.clear();
    peers_.clear();
}

void NetDevice::shut_down() {
    std::lock_guard lk(mu_);
    close_locked();
    listens_.clear();
    sends_.clear();
    recvs_.clear();
    requests_.clear();
    memory_.clear();
    numbers_.clear();
}

size_t NetDevice::open_comms() {
    std::lock_guard lk(mu_);
    return listens_.live() + sends_.live() + recvs_.live();
}

// Comm numbers go round before one is reused, so that a message late for a closed comm finds
// no comm rather than its successor.
uint32_t NetDevice::take_number() {
    for (uint32_t tries = 0; tries < wire::kNcclMaxComms; ++tries) {
        uint32_t n = next_number_;
        next_number_ = next_number_ == wire::kNcclMaxComms ? 1 : next_number_ + 1;
        if (numbers_.insert(n).second) return n;
    }
    return 0;
}

// Operations are reused: one per message otherwise costs an allocation.
NetDevice::Op *NetDevice::new_op(int kind) {
    Op *op;
    if (!spare_ops_.empty()) {
        op = spare_ops_.back();
        spare_ops_.pop_back();
        op->sub = 0;
        op->request = op->comm = op->mr = 0;
    } else {
        op = new Op{};
    }
    op->kind = OpKind(kind);
    ops_.insert(op);
    return op;
}

void NetDevice::finish_op(Op *op) {
    if (op->mr) release_mr(op->mr);
    auto drop = [op](std::vector<Op *> &posted) {
        for (auto it = posted.begin(); it != posted.end(); ++it)
            if (*it == op) {
                posted.erase(it);
                return;
            }
    };
    if (op->kind == OpKind::RecvData)
        if (RecvComm *c = recvs_.find(op->comm)) drop(c->posted);
    if (op->kind == OpKind::CtsRecv || op->kind == OpKind::AcceptRecv)
        if (SendComm *c = sends_.find(op->comm)) drop(c->posted);
    ops_.erase(op);
    if (spare_ops_.size() < kSpareOps && op->batch.empty())
        spare_ops_.push_back(op);
    else
        delete op;
}

void NetDevice::release_mr(uint64_t mr) {
    if (MemHandle *m = memory_.find(mr)) --m->users;
}

Result NetDevice::post_receive(Op *op, void *buf, size_t len, void *desc, fi_addr_t from,
                               uint64_t tag, uint64_t ignore) {
    for (int attempt = 0;; ++attempt) {
        ssize_t ret = fi_trecv(ep_, buf, len, desc, from, tag, ignore, &op->ctx);
        if (ret == 0) return kSuccess;
        if (ret != -FI_EAGAIN || attempt == 1000) {
            ops_.erase(op);
            delete op;
            return fabric_error("fi_trecv", int(ret));
        }
        progress_locked();
    }
}

void NetDevice::send_control(fi_addr_t to, uint64_t tag, const void *buf, size_t len, uint64_t data,
                             bool with_data) {
    if (control_.empty()) {
        ssize_t ret = with_data ? fi_tinjectdata(ep_, buf, len, data, to, tag)
                                : fi_tinject(ep_, buf, len, to, tag);
        if (ret != -FI_EAGAIN) {
            if (ret) NCCL_TANDEM_WARN("NET/tandem: fi_tinject failed: %s", fi_strerror(int(-ret)));
            return;
        }
    }
    auto *bytes = static_cast<const uint8_t *>(buf);
    control_.push_back({to, tag, data, with_data, std::vector<uint8_t>(bytes, bytes + len)});
}

// Control messages are injected (no completion): the clear-to-sends, the 0-byte messages that
// announce writes, and their order is kept behind any that found no room.
void NetDevice::flush_control() {
    while (!control_.empty()) {
        const ControlMessage &m = control_.front();
        ssize_t ret = m.with_data
                          ? fi_tinjectdata(ep_, m.bytes.data(), m.bytes.size(), m.data, m.to, m.tag)
                          : fi_tinject(ep_, m.bytes.data(), m.bytes.size(), m.to, m.tag);
        if (ret == -FI_EAGAIN) return;
        if (ret) NCCL_TANDEM_WARN("NET/tandem: fi_tinject failed: %s", fi_strerror(int(-ret)));
        control_.pop_front();
    }
}

// The clear-to-sends of the buffers posted since the last pass, one message per comm: NCCL posts
// its receives in bursts, and the sender then handles one completion for the burst.
void NetDevice::send_cts(RecvComm &comm) {
    for (size_t at = 0; at < comm.cts_out.size(); at += wire::kNcclCtsBatch) {
        size_t n = std::min(wire::kNcclCtsBatch, comm.cts_out.size() - at);
        send_control(comm.peer, wire::nccl_tag(NcclTagKind::Cts, comm.remote, 0, 0),
                     comm.cts_out.data() + at, n * sizeof(wire::NcclCts), 0, false);
    }
    comm.cts_out.clear();
}

void NetDevice::flush_cts() {
    for (uint64_t h : cts_pending_)
        if (RecvComm *c = recvs_.find(h)) send_cts(*c);
    cts_pending_.clear();
}

// ---- progress ----------------------------------------------------------------------------------

void NetDevice::progress_locked() {
    if (!cq_) return;
    flush_cts();
    fi_cq_tagged_entry entries[32];
    for (;;) {
        ssize_t n = fi_cq_read(cq_, entries, 32);
        if (n > 0) {
            for (ssize_t i = 0; i < n; ++i)
                complete(static_cast<Op *>(entries[i].op_context), entries[i].flags, entries[i].len,
                         entries[i].data);
            if (n == 32) continue;
            break;
        }
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(cq_, &err, 0) == 1) {
                const char *cause = fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0);
                fail(static_cast<Op *>(err.op_context), err.err, cause);
            }
            continue;
        }
        if (n != -FI_EAGAIN) NCCL_TANDEM_WARN("NET/tandem: fi_cq_read: %s", fi_strerror(int(-n)));
        break;
    }
    flush_writes();
    flush_control();
}

void NetDevice::sub_done(uint64_t request, Result error) {
    Request *r = requests_.find(request);
    if (!r) return;
    if (error != kSuccess && r->error == kSuccess) r->error = error;
    if (--r->pending > 0) return;
    if (r->send) {
        if (SendComm *s = sends_.find(r->comm)) --s->inflight;
    } else if (RecvComm *c = recvs_.find(r->comm)) {
        --c->inflight;
    }
}

// A buffer of a grouped receive is filled: with a message of len bytes, or by a write whose
// announcement (remote CQ data) gives its size, or says that the write failed or was refused.
void NetDevice::recv_data_done(const Op &op, uint64_t flags, size_t len, uint64_t data) {
    Result error = kSuccess;
    if (Request *r = requests_.find(op.request)) {
        if (flags & FI_REMOTE_CQ_DATA) {
            // The announcement of a write.
            if (data & wire::kNcclFinFailed) {
                NCCL_TANDEM_WARN(
                    "NET/tandem: the sender's write of %llu B into a "
                    "receive buffer failed (its log has the cause)",
                    (unsigned long long)(data & ~wire::kNcclFinFailed));
                error = kSystemError;
            } else if (data & wire::kNcclFinTruncated) {
                NCCL_TANDEM_WARN(
                    "NET/tandem: a send of %llu B was refused by a receive buffer of its "
                    "tag of smaller size (NCCL sizes mismatch)",
                    (unsigned long long)(data & ~wire::kNcclFinTruncated));
                error = kInvalidUsage;
            } else {
                r->sizes[op.sub] = int(data);
            }
        } else {
            r->sizes[op.sub] = int(len);
        }
    }
    sub_done(op.request, error);
}

// A message of clear-to-sends for a send comm, each met with its send. True when the receive
// is posted again (the operation goes on), false when it is over.
bool NetDevice::cts_batch_arrived(Op *op, size_t len) {
    SendComm *comm = sends_.find(op->comm);
    if (!comm) return false;
    if (len % sizeof(wire::NcclCts) || len == 0)
        NCCL_TANDEM_WARN("NET/tandem: dropped a malformed clear-to-send (%zu B)", len);
    else
        for (size_t i = 0; i < len / sizeof(wire::NcclCts); ++i)
            cts_arrived(op->comm, *comm, op->batch[i]);
    // The same buffer goes back for the next one.
    ssize_t ret = fi_trecv(ep_, op->batch.data(), op->batch.size() * sizeof(wire::NcclCts), nullptr,
                           comm->peer, wire::nccl_tag(NcclTagKind::Cts, comm->number, 0, 0),
                           wire::kNcclCommIgnore, &op->ctx);
    if (ret == 0) return true;
    NCCL_TANDEM_WARN("NET/tandem: reposting a CTS receive: %s", fi_strerror(int(-ret)));
    comm->failed = true;
    return false;
}

// A Connect reached a listen comm (accept takes it from there). A malformed one is dropped and
// the receive posted again: true then, the operation goes on.
bool NetDevice::connect_arrived(Op *op, size_t len) {
    ListenComm *l = listens_.find(op->comm);
    if (!l) return false;
    const wire::NcclConnect &c = op->connect;
    if (c.magic != wire::kNcclHandleMagic || c.version != wire::kNcclVersion ||
        c.nonce != l->nonce || c.addr_len == 0 || c.addr_len > wire::kNcclMaxAddr ||
        len != sizeof c) {
        NCCL_TANDEM_WARN("NET/tandem: dropped a malformed connection request (%zu B)", len);
        ssize_t ret = fi_trecv(ep_, &op->connect, sizeof op->connect, nullptr, FI_ADDR_UNSPEC,
                               wire::nccl_tag(NcclTagKind::Connect, l->number, 0, 0),
                               wire::kNcclCommIgnore, &op->ctx);
        if (ret == 0) return true;
        l->posted = nullptr;
        return false;
    }
    l->peer = c;
    l->arrived = true;
    l->posted = nullptr;
    return false;
}

// The Accept reached a connecting send comm: it is connected, or failed when malformed.
void NetDevice::accept_arrived(const Op &op, size_t len) {
    SendComm *s = sends_.find(op.comm);
    if (!s) return;
    const wire::NcclConnect &c = op.connect;
    if (c.magic != wire::kNcclHandleMagic || c.version != wire::kNcclVersion ||
        c.nonce != s->nonce || c.comm == 0 || len != sizeof c) {
        NCCL_TANDEM_WARN("NET/tandem: a malformed connection accept; connection failed");
        s->failed = true;
        return;
    }
    s->remote = c.comm;
    s->ready = true;
}

void NetDevice::complete(Op *op, uint64_t flags, size_t len, uint64_t data) {
    switch (op->kind) {
        case OpKind::SendData:
            sub_done(op->request, kSuccess);
            break;
        case OpKind::Write:
            if (SendComm *c = sends_.find(op->comm))
                send_control(c->peer, op->fin_tag, nullptr, 0, op->fin_size, true);
            sub_done(op->request, kSuccess);
            break;
        case OpKind::RecvData:
            recv_data_done(*op, flags, len, data);
            break;
        case OpKind::CtsRecv:
            if (cts_batch_arrived(op, len)) return;  // posted again
            break;
        case OpKind::ConnectRecv:
            if (connect_arrived(op, len)) return;  // posted again
            break;
        case OpKind::AcceptRecv:
            accept_arrived(*op, len);
            break;
        case OpKind::Handshake:
            break;
    }
    finish_op(op);
}

void NetDevice::fail(Op *op, int err, const char *cause) {
    if (!op) return;
    if (err == FI_ECANCELED) {  // a comm closed with this posted
        finish_op(op);
        return;
    }
    switch (op->kind) {
        case OpKind::SendData:
        case OpKind::Write:
        case OpKind::RecvData:
            // A failed write still ends the receive it was for, failed: it waits for nothing.
            if (op->kind == OpKind::Write)
                if (SendComm *c = sends_.find(op->comm))
                    send_control(c->peer, op->fin_tag, nullptr, 0,
                                 wire::kNcclFinFailed | op->fin_size, true);
            if (requests_.find(op->request))
                NCCL_TANDEM_WARN("NET/tandem: %s failed: %s (%s)",
                                 op->kind == OpKind::RecvData ? "a receive"
                                 : op->kind == OpKind::Write  ? "an RDMA write"
                                                              : "a send",
                                 fi_strerror(err), cause ? cause : "");
            sub_done(op->request, result_of(err));
            break;
        case OpKind::CtsRecv:
        case OpKind::AcceptRecv:
        case OpKind::Handshake:
            if (SendComm *s = sends_.find(op->comm)) {
                NCCL_TANDEM_WARN("NET/tandem: connection failed: %s (%s)", fi_strerror(err),
                                 cause ? cause : "");
                s->failed = true;
            }
            break;
        case OpKind::ConnectRecv:
            if (ListenComm *l = listens_.find(op->comm)) {
                NCCL_TANDEM_WARN("NET/tandem: listen failed: %s (%s)", fi_strerror(err),
                                 cause ? cause : "");
                l->posted = nullptr;
            }
            break;
    }
    finish_op(op);
}

// A clear-to-send meets its send, or waits for it.
void NetDevice::cts_arrived(uint64_t comm_handle, SendComm &comm, const wire::NcclCts &cts) {
    uint64_t key = seq_key(cts.tag, cts.seq);
    auto it = comm.waiting.find(key);
    if (it == comm.waiting.end()) {
        // Not a large send's: kept for the send still to come, or dropped when that send was
        // issued already (it went eagerly into the buffer).
        auto issued = comm.seq.find(cts.tag);
        if (issued == comm.seq.end() || cts.seq >= issued->second) comm.cts[key] = cts;
        return;
    }
    PendingSend send = it->second;
    comm.waiting.erase(it);
    writes_.push_back({comm_handle, send, cts});
    flush_writes();
}

bool NetDevice::flush_writes() {
    while (!writes_.empty()) {
        if (!start_write(writes_.front())) return false;
        writes_.pop_front();
    }
    return true;
}

// A large send with its clear-to-send: the write (announced when it completes, or fails); or,
// into a buffer too small, only the announcement that it was refused, and both ends fail it.
bool NetDevice::start_write(const QueuedWrite &w) {
    SendComm *comm = sends_.find(w.comm);
    if (!comm) {  // closed meanwhile
        release_mr(w.send.mr);
        return true;
    }
    uint64_t fin_tag =
        wire::nccl_tag(NcclTagKind::Data, comm->remote, w.cts.tag, tag_seq(w.cts.seq));
    if (w.send.offset > w.cts.size || w.send.size > w.cts.size - w.send.offset) {
        NCCL_TANDEM_WARN(
            "NET/tandem: a send of %zu B at offset %zu with tag %d went to a receive buffer of "
            "%llu B (NCCL sizes mismatch)",
            w.send.size, w.send.offset, w.cts.tag, (unsigned long long)w.cts.size);
        send_control(comm->peer, fin_tag, nullptr, 0, wire::kNcclFinTruncated | w.send.size, true);
        release_mr(w.send.mr);
        sub_done(w.send.request, kInvalidUsage);  // the CTS
        sub_done(w.send.request, kInvalidUsage);  // the data
        return true;
    }
    MemHandle *m = memory_.find(w.send.mr);
    Op *op = new_op(int(OpKind::Write));
    op->request = w.send.request;
    op->comm = w.comm;
    op->mr = w.send.mr;
    ssize_t ret = fi_write(ep_, w.send.data, w.send.size, m ? m->desc : nullptr, comm->peer,
                           w.cts.addr + w.send.offset, w.cts.key, &op->ctx);
    if (ret == -FI_EAGAIN) {
        ops_.erase(op);
        delete op;
        return false;
    }
    sub_done(w.send.request, kSuccess);  // the CTS
    if (ret) {
        NCCL_TANDEM_WARN("NET/tandem: fi_write of %zu B failed: %s", w.send.size,
                         fi_strerror(int(-ret)));
        op->request = 0;
        finish_op(op);
        sub_done(w.send.request, kSystemError);
        send_control(comm->peer, fin_tag, nullptr, 0, wire::kNcclFinFailed | w.send.size, true);
        return true;
    }
    op->fin_tag = fin_tag;
    op->fin_size = w.send.size;
    return true;
}

// ---- connection set-up -------------------------------------------------------------------------

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

// ---- memory ------------------------------------------------------------------------------------

Result NetDevice::reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    if (!mhandle) WARN_RETURN(kInternalError, "NET/tandem: regMr without an output");
    std::lock_guard lk(mu_);
    if (!sends_.find(comm) && !recvs_.find(comm))
        WARN_RETURN(kInvalidUsage, "NET/tandem: regMr: %p is no send or receive comm", comm);
    if (type != kPtrHost && type != kPtrCuda)
        WARN_RETURN(kInternalError, "NET/tandem: regMr: unknown pointer type %d", type);
    fi_hmem_iface iface = FI_HMEM_SYSTEM;
    uint64_t device = 0;
    if (type == kPtrCuda) {
        if (!description_.hmem)
            WARN_RETURN(kInvalidUsage,
                        "NET/tandem %s: regMr of CUDA memory, but tandem offers no "
                        "FI_HMEM here (%s)",
                        description_.name.c_str(),
                        hmem::Registry::instance().missing_reason(FI_HMEM_CUDA));
        const hmem::IfaceOps *cuda = hmem::Registry::instance().ops(FI_HMEM_CUDA);
        hmem::AddrInfo where;
        if (!cuda || cuda->query(data, &where) != 1)
            WARN_RETURN(kInvalidUsage, "NET/tandem: regMr: %p is no CUDA memory", data);
        if (uintptr_t(data) + size > where.base + where.length)
            WARN_RETURN(kInvalidUsage,
                        "NET/tandem: regMr: %zu B at %p run past their CUDA allocation", size,
                        data);
        iface = FI_HMEM_CUDA;
        device = where.mem.device;
    }
    auto m = std::make_unique<MemHandle>();
    m->base = uintptr_t(data);
    m->size = size;
    if (size) {
        iovec iov{data, size};
        fi_mr_attr attr{};
        attr.mr_iov = &iov;
        attr.iov_count = 1;
        attr.access = FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ;
        attr.iface = iface;
        attr.device.cuda = int(device);
        int ret = fi_mr_regattr(domain_, &attr, 0, &m->mr);
        if (ret) return fabric_error("fi_mr_regattr", ret);
        m->desc = fi_mr_desc(m->mr);
        m->key = fi_mr_key(m->mr);
    }
    *mhandle = reinterpret_cast<void *>(memory_.add(std::move(m)));
    return kSuccess;
}

// libfabric 1.17 registers by address only (FI_MR_DMABUF came in 1.20). The buffer's address
// names the same memory as the dma-buf, and tandem's links move device memory with CUDA copies
// and IPC: the fd is checked and the range registered by address.
Result NetDevice::reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle) {
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        WARN_RETURN(kInvalidUsage, "NET/tandem: regMrDmaBuf: fd %d is not open", fd);
    (void)offset;
    return reg_mr(comm, data, size, type, mhandle);
}

Result NetDevice::dereg_mr(void *comm, void *mhandle) {
    std::lock_guard lk(mu_);
    (void)comm;  // registrations are the domain's; any comm of the device may release them
    MemHandle *m = memory_.find(mhandle);
    if (!m) WARN_RETURN(kInvalidUsage, "NET/tandem: deregMr: %p is no memory handle", mhandle);
    if (m->users > 0)
        WARN_RETURN(kInvalidUsage,
                    "NET/tandem: deregMr: %d operations still use the region at %#lx (%zu B)",
                    m->users, (unsigned long)m->base, m->size);
    if (m->mr) {
        int ret = fi_close(&m->mr->fid);
        if (ret) return fabric_error("fi_close (memory region)", ret);
    }
    memory_.remove(uint64_t(reinterpret_cast<uintptr_t>(mhandle)));
    return kSuccess;
}

// ---- data --------------------------------------------------------------------------------------

Result NetDevice::isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                        void **request) {
    return isend_at(send_comm, data, size, 0, tag, mhandle, request);
}

Result NetDevice::isend_at(void *send_comm, void *data, size_t size, size_t offset, int tag,
                           void *mhandle, void **request) {
    if (!request) WARN_RETURN(kInternalError, "NET/tandem: isend without an output");
    *request = nullptr;
    std::lock_guard lk(mu_);
    SendComm *comm = sends_.find(send_comm);
    if (!comm || !comm->ready)
        WARN_RETURN(kInvalidUsage, "NET/tandem: isend: %p is no connected send comm", send_comm);
    if (comm->failed) WARN_RETURN(kSystemError, "NET/tandem: isend: the connection failed");
    MemHandle *m = mhandle ? memory_.find(mhandle) : nullptr;
    if (mhandle && !m)
        WARN_RETURN(kInvalidUsage, "NET/tandem: isend: %p is no memory handle", mhandle);
    if (size && (!m || uintptr_t(data) < m->base || uintptr_t(data) + size > m->base + m->size))
        WARN_RETURN(kInvalidUsage, "NET/tandem: isend: %zu B at %p lie outside their registration",
                    size, data);
    if (size > description_.max_msg_size)
        WARN_RETURN(kInternalError, "NET/tandem: isend of %zu B: more than maxP2pBytes", size);
    // No progress pass here (test makes them); only what waits to leave goes first: the
    // clear-to-sends of receives posted since (they must not fall behind this message).
    flush_cts();
    if (comm->inflight >= kMaxRequests * kMaxRecvs) {
        progress_locked();
        if (comm->inflight >= kMaxRequests * kMaxRecvs) return kSuccess;  // NCCL asks again
    }

    uint32_t &next = comm->seq[tag];
    const uint32_t seq = next;
    const uint64_t key = seq_key(tag, seq);
    const bool eager = size <= options_.eager_max;
    if (eager && offset)
        WARN_RETURN(kInternalError, "NET/tandem: isend: an eager send (%zu B) at offset %zu", size,
                    offset);
    uint64_t rh;
    Request *r = requests_.emplace(&rh);
    r->comm = reinterpret_cast<uintptr_t>(send_comm);
    r->send = true;
    r->pending = eager ? 1 : 2;  // the data left; a large send first needs its clear-to-send
    r->sizes[0] = int(size);
    const uint64_t mh = m ? uint64_t(reinterpret_cast<uintptr_t>(mhandle)) : 0;
    if (eager) {
        Op *op = new_op(int(OpKind::SendData));
        op->request = rh;
        op->comm = reinterpret_cast<uintptr_t>(send_comm);
        ssize_t ret =
            fi_tsend(ep_, data, size, m ? m->desc : nullptr, comm->peer,
                     wire::nccl_tag(NcclTagKind::Data, comm->remote, tag, tag_seq(seq)), &op->ctx);
        if (ret) {
            finish_op(op);
            requests_.remove(rh, true);
            if (ret == -FI_EAGAIN) return kSuccess;  // no room: NCCL asks again
            return fabric_error("fi_tsend", int(ret));
        }
        if (m) {
            op->mr = mh;
            ++m->users;
        }
        // Its buffer's clear-to-send is of no use now, whether here already or still to come.
        comm->cts.erase(key);
    } else {
        if (m) ++m->users;  // released when the write completes or is refused
        PendingSend send{rh, data, size, mh, offset};
        if (auto it = comm->cts.find(key); it != comm->cts.end()) {
            writes_.push_back({reinterpret_cast<uintptr_t>(send_comm), send, it->second});
            comm->cts.erase(it);
        } else {
            comm->waiting[key] = send;
        }
    }
    ++next;
    ++comm->inflight;
    flush_writes();
    *request = reinterpret_cast<void *>(rh);
    return kSuccess;
}

Result NetDevice::irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
                        void **mhandles, void **request) {
    if (!request) WARN_RETURN(kInternalError, "NET/tandem: irecv without an output");
    *request = nullptr;
    if (n < 1 || n > kMaxRecvs)
        WARN_RETURN(kInternalError, "NET/tandem: irecv of %d buffers (maxRecvs is %d)", n,
                    kMaxRecvs);
    if (!data || !sizes || !tags || !mhandles)
        WARN_RETURN(kInternalError, "NET/tandem: irecv without its arrays");
    std::lock_guard lk(mu_);
    RecvComm *comm = recvs_.find(recv_comm);
    if (!comm) WARN_RETURN(kInvalidUsage, "NET/tandem: irecv: %p is no receive comm", recv_comm);
    MemHandle *mems[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        mems[i] = mhandles[i] ? memory_.find(mhandles[i]) : nullptr;
        if (mhandles[i] && !mems[i])
            WARN_RETURN(kInvalidUsage, "NET/tandem: irecv: %p is no memory handle", mhandles[i]);
        if (sizes[i] && (!mems[i] || uintptr_t(data[i]) < mems[i]->base ||
                         uintptr_t(data[i]) + sizes[i] > mems[i]->base + mems[i]->size))
            WARN_RETURN(kInvalidUsage,
                        "NET/tandem: irecv: buffer %d (%zu B at %p) lies outside its registration",
                        i, sizes[i], data[i]);
    }
    // No progress here: the clear-to-sends of a burst of receives leave together, at the next
    // call that progresses (test, for NCCL), or when a message is full.
    if (comm->inflight >= kMaxRequests) return kSuccess;
    uint64_t rh;
    Request *r = requests_.emplace(&rh);
    r->comm = reinterpret_cast<uintptr_t>(recv_comm);
    r->n = n;
    r->pending = n;
    uint64_t comm_handle = reinterpret_cast<uintptr_t>(recv_comm);
    for (int i = 0; i < n; ++i) {
        uint32_t seq = comm->seq[tags[i]]++;
        Op *op = new_op(int(OpKind::RecvData));
        op->request = rh;
        op->sub = i;
        op->comm = comm_handle;
        if (Result res = post_receive(
                op, data[i], sizes[i], mems[i] ? mems[i]->desc : nullptr, comm->peer,
                wire::nccl_tag(NcclTagKind::Data, comm->number, tags[i], tag_seq(seq)), 0)) {
            // Buffers before this one are posted and announced: the request fails as a whole.
            Request *req = requests_.find(rh);
            req->pending -= n - i;
            req->error = res;
            ++comm->inflight;
            *request = reinterpret_cast<void *>(rh);
            return kSuccess;
        }
        comm = recvs_.find(recv_comm);  // progress inside post_receive may not close it, but
        comm->posted.push_back(op);     // keep to the handle rather than a cached reference
        if (mems[i]) {
            op->mr = reinterpret_cast<uintptr_t>(mhandles[i]);
            ++mems[i]->users;
        }
        wire::NcclCts cts{};
        cts.tag = tags[i];
        cts.seq = seq;
        cts.size = sizes[i];
        if (mems[i]) {
            cts.key = mems[i]->key;
            cts.addr = virt_addr_ ? uintptr_t(data[i]) : uintptr_t(data[i]) - mems[i]->base;
        }
        if (comm->cts_out.empty()) cts_pending_.push_back(comm_handle);
        comm->cts_out.push_back(cts);
        if (comm->cts_out.size() == wire::kNcclCtsBatch) send_cts(*comm);
    }
    ++comm->inflight;
    *request = reinterpret_cast<void *>(rh);
    return kSuccess;
}

Result NetDevice::iflush(void *recv_comm, int n, void **mhandles, void **request) {
    return flush_nothing(mu_, recvs_, memory_, recv_comm, n, mhandles, request);
}

Result NetDevice::test(void *request, int *done, int *sizes) {
    if (!done) WARN_RETURN(kInternalError, "NET/tandem: test without an output");
    *done = 0;
    std::lock_guard lk(mu_);
    Request *r = requests_.find(request);
    if (!r)
        WARN_RETURN(kInvalidUsage,
                    "NET/tandem: test: %p is no request under way (already completed, or its "
                    "comm was closed)",
                    request);
    if (r->pending > 0) {
        progress_locked();
        r = requests_.find(request);
        if (r->pending > 0) return kSuccess;
    }
    Result error = r->error;
    if (error == kSuccess && sizes)
        for (int i = 0; i < r->n; ++i) sizes[i] = r->sizes[i];
    requests_.remove(reinterpret_cast<uintptr_t>(request), true);
    *done = 1;
    return error;
}

// ---- closing -----------------------------------------------------------------------------------

// Receives still posted are cancelled; their completions (FI_ECANCELED) free them later.
void NetDevice::cancel_posted(std::vector<Op *> &posted) {
    for (Op *op : posted) fi_cancel(&ep_->fid, &op->ctx);
    posted.clear();
}

// The requests of a closed comm: their handles go stale (test refuses them); their operations
// still under way find no request when they end.
void NetDevice::drop_requests(uint64_t comm) {
    std::vector<uint64_t> orphans;
    requests_.for_each_handle([&](uint64_t rh, Request &r) {
        if (r.comm == comm) orphans.push_back(rh);
    });
    for (uint64_t rh : orphans) requests_.remove(rh, true);
}

Result NetDevice::close_send(void *send_comm) {
    std::lock_guard lk(mu_);
    SendComm *s = sends_.find(send_comm);
    if (!s) WARN_RETURN(kInvalidUsage, "NET/tandem: closeSend: %p is no send comm", send_comm);
    uint64_t h = reinterpret_cast<uintptr_t>(send_comm);
    for (auto &[key, send] : s->waiting) release_mr(send.mr);
    cancel_posted(s->posted);
    numbers_.erase(s->number);
    drop_requests(h);
    sends_.remove(h);
    progress_locked();
    return kSuccess;
}

Result NetDevice::close_recv(void *recv_comm) {
    std::lock_guard lk(mu_);
    RecvComm *c = recvs_.find(recv_comm);
    if (!c) WARN_RETURN(kInvalidUsage, "NET/tandem: closeRecv: %p is no receive comm", recv_comm);
    uint64_t h = reinterpret_cast<uintptr_t>(recv_comm);
    cancel_posted(c->posted);
    numbers_.erase(c->number);
    drop_requests(h);
    recvs_.remove(h);
    progress_locked();
    return kSuccess;
}

Result NetDevice::close_listen(void *listen_comm) {
    std::lock_guard lk(mu_);
    ListenComm *l = listens_.find(listen_comm);
    if (!l)
        WARN_RETURN(kInvalidUsage, "NET/tandem: closeListen: %p is no listen comm", listen_comm);
    if (l->posted) fi_cancel(&ep_->fid, &l->posted->ctx);
    numbers_.erase(l->number);
    listens_.remove(reinterpret_cast<uintptr_t>(listen_comm));
    progress_locked();
    return kSuccess;
}

}  // namespace tandem::nccl

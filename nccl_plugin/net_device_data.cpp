// NetDevice's data path: the operations posted to libfabric and reused, the control messages
// (clear-to-sends, write announcements), progress and what each completion means, the writes
// of large sends, and isend, irecv and test. Kept in one file so that the per-message calls
// stay within reach of the compiler's inlining.
#include "nccl_plugin/net_device.h"

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>

namespace tandem::nccl {

namespace {

using wire::NcclTagKind;

uint64_t seq_key(int tag, uint32_t seq) {
    return uint64_t(uint32_t(tag)) << 32 | seq;
}
uint16_t tag_seq(uint32_t seq) {
    return uint16_t(seq & wire::kNcclSeqMask);
}
constexpr size_t kSpareOps = 1024;

Result result_of(int err) {
    return err == FI_ETRUNC ? kInvalidUsage : kSystemError;
}

}  // namespace

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
}  // namespace tandem::nccl

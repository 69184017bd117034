// Atomics on the node-local path, as libfabric's shm provider does them: the initiator's twin
// puts the request (wire::AtomicBody and the operands, hmem/atomic_target.h) in an Atomic
// cell of the target's inbox; the target's twin checks the key through its owner, executes
// the operation in its progress (atomic against every other execution in its process, link
// or local) and answers with an AtomicResp cell carrying the status and, for the fetch and
// compare kinds, the previous values, which the initiator's twin writes into the result
// buffers before it completes the operation. Device memory on either side is copied by its
// device: the operands into the cell, the values out of it, the target through the host.
#include "common/iov.h"
#include "common/log.h"
#include "hmem/atomic_target.h"
#include "offload_prov/endpoint.h"

#include <cstring>

namespace tandem::off {

using wire::LocalOp;

namespace {

// An fi_ioc list as byte ranges, and where each lives (false: all host memory).
bool ioc_bytes(const fi_ioc *ioc, void **desc, size_t n, size_t elem, iovec *out,
               hmem::MemRef *mem) {
    atomic::byte_ranges(ioc, n, elem, out);
    if (desc) return peer::mems_of(desc, n, mem);
    std::fill(mem, mem + n, hmem::kHost);
    return false;
}

// The *valid queries answer what the twin carries: what the owner's do.
template <atomic::Kind K>
int valid_query(fid_ep *, enum fi_datatype datatype, enum fi_op op, size_t *count) noexcept {
    return atomic::query(K, datatype, op, count);
}

fi_ops_atomic twin_atomic_ops = {
    .size = sizeof(fi_ops_atomic),
    .write = enosys<decltype(fi_ops_atomic::write)>,
    .writev = enosys<decltype(fi_ops_atomic::writev)>,
    .writemsg = &Trampoline<&Endpoint::atomicmsg>::call<fid_ep>,
    .inject = enosys<decltype(fi_ops_atomic::inject)>,
    .readwrite = enosys<decltype(fi_ops_atomic::readwrite)>,
    .readwritev = enosys<decltype(fi_ops_atomic::readwritev)>,
    .readwritemsg = &Trampoline<&Endpoint::fetch_atomicmsg>::call<fid_ep>,
    .compwrite = enosys<decltype(fi_ops_atomic::compwrite)>,
    .compwritev = enosys<decltype(fi_ops_atomic::compwritev)>,
    .compwritemsg = &Trampoline<&Endpoint::compare_atomicmsg>::call<fid_ep>,
    .writevalid = valid_query<atomic::Kind::Base>,
    .readwritevalid = valid_query<atomic::Kind::Fetch>,
    .compwritevalid = valid_query<atomic::Kind::Compare>,
};

}  // namespace

fi_ops_atomic *Endpoint::atomic_ops() {
    return &twin_atomic_ops;
}

ssize_t Endpoint::atomicmsg(const fi_msg_atomic *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post_atomic(atomic::Kind::Base, *msg, nullptr, nullptr, 0, nullptr, nullptr, 0, flags);
}

ssize_t Endpoint::fetch_atomicmsg(const fi_msg_atomic *msg, fi_ioc *resultv, void **result_desc,
                                  size_t result_count, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post_atomic(atomic::Kind::Fetch, *msg, nullptr, nullptr, 0, resultv, result_desc,
                       result_count, flags);
}

ssize_t Endpoint::compare_atomicmsg(const fi_msg_atomic *msg, const fi_ioc *comparev,
                                    void **compare_desc, size_t compare_count, fi_ioc *resultv,
                                    void **result_desc, size_t result_count, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post_atomic(atomic::Kind::Compare, *msg, comparev, compare_desc, compare_count, resultv,
                       result_desc, result_count, flags);
}

ssize_t Endpoint::post_atomic(atomic::Kind kind, const fi_msg_atomic &m, const fi_ioc *compare,
                              void **compare_desc, size_t ncompare, const fi_ioc *result,
                              void **result_desc, size_t nresult, uint64_t flags) {
    note_work();
    if (!enabled_) return -FI_EOPBADSTATE;
    const bool fetches = kind != atomic::Kind::Base;
    const bool compares = kind == atomic::Kind::Compare;
    constexpr size_t kMax = wire::kLocalMaxIov;
    size_t count = 0;
    if (int ret = atomic::check_call(kind, m, compare, ncompare, result, nresult, kMax, &count))
        return ret;
    const size_t elem = atomic::datatype_size(m.datatype);
    PeerLink *link = link_for(m.addr);
    if (!link) return -FI_EHOSTUNREACH;
    const size_t bytes = count * elem;
    const uint64_t cq_flags = FI_ATOMIC | (fetches ? FI_READ : FI_WRITE);
    if (link->dead) {
        complete_tx(m.context, cq_flags, bytes, FI_ECONNRESET);
        return 0;
    }
    if (!link->out.admits()) return -FI_EAGAIN;

    iovec operand[kMax], cmp[kMax], res[kMax];
    hmem::MemRef operand_mem[kMax], cmp_mem[kMax], res_mem[kMax];
    bool device = ioc_bytes(m.msg_iov, m.desc, m.iov_count, elem, operand, operand_mem);
    if (compares) device |= ioc_bytes(compare, compare_desc, ncompare, elem, cmp, cmp_mem);
    bool device_result = fetches && ioc_bytes(result, result_desc, nresult, elem, res, res_mem);
    if (device || device_result) {
        // Node-local atomics on device memory are staged by its device (copied into and out of
        // the cells): FI_HMEM_P2P_REQUIRED refuses them, as it refuses node-local RMA.
        if (p2p_.decide(false, bytes, 0) == hmem::P2pDecision::Fail) {
            hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
            complete_tx(m.context, cq_flags, bytes, FI_EOPNOTSUPP);
            return 0;
        }
        hmem::counters().staged_transfers.fetch_add(1, std::memory_order_relaxed);
    }
    // The operands are copied into the cell now: the application's buffers (an inject's
    // included) are free when this returns.
    uint8_t cell[wire::kLocalCellSize];
    const size_t at = wire::local_short_body_offset(proto_.name_len);
    const size_t len = atomic::request_size(kind, m.op, m.datatype, count);
    if (int ret = atomic::build_request(kind, m.op, m.datatype, count, m.rma_iov[0].addr,
                                        m.rma_iov[0].key, operand, operand_mem, m.iov_count, cmp,
                                        cmp_mem, compares ? ncompare : 0, cell + at))
        return ret;
    uint32_t index;
    if (free_atomics_.empty()) {
        index = static_cast<uint32_t>(atomics_.size());
        atomics_.emplace_back();
    } else {
        index = free_atomics_.back();
        free_atomics_.pop_back();
    }
    AtomicSlot &slot = atomics_[index];
    slot.context = m.context;
    slot.flags = cq_flags;
    slot.len = bytes;
    slot.link = link;
    slot.nresult = fetches ? static_cast<uint32_t>(nresult) : 0;
    slot.device = device_result;
    std::copy(res, res + slot.nresult, slot.result);
    std::copy(res_mem, res_mem + slot.nresult, slot.mem);
    ++atomics_pending_;
    wire::LocalShortHeader h{};
    h.op = static_cast<uint8_t>(LocalOp::Atomic);
    h.flags = (flags & FI_REMOTE_CQ_DATA) ? wire::kLocalCqData : 0;
    h.name_len = proto_.name_len;
    h.size = static_cast<uint32_t>(len);
    h.tag = slot.id(index);
    h.cq_data = m.data;
    memcpy(cell, &h, sizeof h);
    memcpy(cell + sizeof h, name_, at - sizeof h);  // name_ is zero-padded
    TANDEM_DEBUG(FI_LOG_EP_DATA, "atomic op %d type %d x%zu to %s\n", m.op, m.datatype, count,
                 link->key.c_str());
    link->out.push_cell(*sender_, cell, at + len);
    return 0;
}

void Endpoint::serve_atomic(const uint8_t *cell) {
    wire::LocalShortHeader h;
    memcpy(&h, cell, sizeof h);
    if (h.name_len > wire::kLocalNameRoom || h.size > wire::kLocalBodyRoom) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed atomic cell\n");
        return;
    }
    std::string_view sender(reinterpret_cast<const char *>(cell + sizeof h), h.name_len);
    const uint8_t *body = cell + wire::local_short_body_offset(h.name_len);
    atomic::Request r;
    int status = 0;
    uint8_t fetched[atomic::kMaxBytes];
    if (!atomic::parse(body, h.size, r)) {
        TANDEM_WARN(FI_LOG_EP_DATA, "refusing a malformed atomic request\n");
        status = FI_EINVAL;
    } else {
        iovec pieces[kMaxRmaPieces];
        hmem::MemRef pmem[kMaxRmaPieces];
        size_t npieces = kMaxRmaPieces;
        const uint64_t access = atomic::access_needed(r.kind, r.op);
        // (Read before asking the owner: a region closed meanwhile leaves a stale answer.)
        const uint64_t generation =
            mr_generation_ ? mr_generation_->load(std::memory_order_acquire) : 0;
        ResolvedTarget &c = resolved_;
        int ret = 0;
        if (mr_generation_ && c.valid && c.generation == generation && c.key == r.key &&
            c.addr == r.addr && c.len == r.bytes() && c.access == access) {
            pieces[0] = c.piece;
            pmem[0] = c.mem;
            npieces = 1;
        } else {
            ret = resolve(r.key, r.addr, r.bytes(), access, pieces, pmem, &npieces);
            c.valid = mr_generation_ && !ret && npieces == 1;
            if (c.valid)
                c = {generation, r.key, r.addr, access, r.bytes(), pieces[0], pmem[0], true};
        }
        if (ret)
            status = ret == -FI_ENOSYS ? FI_EOPNOTSUPP : FI_EACCES;
        else
            status = atomic::execute(r, pieces, pmem, npieces, fetched);
    }
    TANDEM_DEBUG(FI_LOG_EP_DATA, "atomic %lu from a local peer: status %d\n",
                 static_cast<unsigned long>(h.tag), status);
    if (!status) {
        uint64_t event = atomic::access_event(r.kind);
        if (owner_ep_ops_) owner_ep_ops_->access_done(owner_ep_, r.key, event);
        if (h.flags & wire::kLocalCqData) {
            CqWrite w{.kind = CqWrite::Kind::Entry, .src = source_of(sender)};
            w.e.flags = FI_ATOMIC | event | FI_REMOTE_CQ_DATA;
            w.e.len = r.bytes();
            w.e.data = h.cq_data;
            write_cq(w);
        }
    }
    PeerLink *link = link_to(sender);
    if (!link) return;  // the initiator is gone: nobody waits for the answer
    const size_t len = (!status && r.kind != atomic::Kind::Base) ? r.bytes() : 0;
    wire::LocalShortHeader out{};
    out.op = static_cast<uint8_t>(LocalOp::AtomicResp);
    out.name_len = proto_.name_len;  // (the initiator takes the answer only from us)
    out.size = static_cast<uint32_t>(len);
    out.tag = h.tag;
    out.cq_data = static_cast<uint32_t>(status);
    link->out.push_compact(*sender_, out, fetched, len);
}

// The slot an AtomicResp names, if it still waits (it was failed already when its peer was
// found dead, and may hold a newer operation since: the generation tells).
Endpoint::AtomicSlot *Endpoint::atomic_slot(uint64_t id) {
    uint32_t index = static_cast<uint32_t>(id);
    if (index >= atomics_.size()) return nullptr;
    AtomicSlot &slot = atomics_[index];
    if (!slot.link || slot.id(index) != id) return nullptr;
    return &slot;
}

// Called from progress only (an answer, or a peer found dead), never from inside a call of
// the owner's: the completion goes to the owner's CQ at once, not through tx_done_.
void Endpoint::finish_atomic_slot(AtomicSlot &slot, int status) {
    CqWrite w{.kind = status ? CqWrite::Kind::Error : CqWrite::Kind::Entry};
    w.e.op_context = slot.context;
    w.e.flags = slot.flags;
    w.e.len = slot.len;
    w.e.err = status;
    w.e.prov_errno = status;
    slot.link = nullptr;
    ++slot.generation;
    free_atomics_.push_back(static_cast<uint32_t>(&slot - atomics_.data()));
    --atomics_pending_;
    write_cq(w);
}

// An atomic's answer. Only the target it went to answers it (any local process of the user
// can write our inbox under a live endpoint's name): another's would complete it with values
// of its choosing while the target may still answer.
void Endpoint::finish_atomic(const uint8_t *cell) {
    wire::LocalShortHeader h;
    memcpy(&h, cell, sizeof h);
    if (h.name_len > wire::kLocalNameRoom) [[unlikely]] {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed atomic answer\n");
        return;
    }
    AtomicSlot *slot = atomic_slot(h.tag);
    if (!slot) return;
    const std::string_view sender(reinterpret_cast<const char *>(cell + sizeof h), h.name_len);
    if (!shm::same_address(slot->link, link_to(sender))) [[unlikely]] {
        TANDEM_WARN(FI_LOG_EP_DATA, "ignoring an atomic's answer from another than its target\n");
        return;
    }
    const uint8_t *values = cell + wire::local_short_body_offset(h.name_len);
    int status = static_cast<int>(h.cq_data);
    if (!status && slot->nresult) {
        if (h.size != slot->len)
            status = FI_EIO;
        else if (!slot->device)
            iov_scatter(slot->result, slot->nresult, 0, values, h.size);
        else if (hmem::scatter(slot->result, slot->mem, slot->nresult, 0, values, h.size) !=
                 ssize_t(h.size))
            status = FI_EIO;
    }
    finish_atomic_slot(*slot, status);
}

}  // namespace tandem::off

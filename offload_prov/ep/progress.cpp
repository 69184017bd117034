// The owner's progress call: our inbox drained and each cell dispatched by its op, the links'
// backlogs flushed, the peers' liveness checked now and then, and completions written to the
// owner's CQ, kept in order for the next call when it has no room.
#include "offload_prov/endpoint.h"

#include "common/coarse_clock.h"
#include "common/iov.h"
#include "common/log.h"
#include "offload_prov/cq.h"
#include "offload_prov/srx.h"

#include <sched.h>

#include <chrono>
#include <cstring>
#include <utility>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalIov;
using wire::LocalOp;

namespace {

const uint8_t *body_of(const uint8_t *cell) {
    return cell + sizeof(LocalHeader) + wire::kLocalNameRoom;
}

}  // namespace

void Endpoint::progress() {
    if (!enabled_) return;  // (no channel yet when the owner lent none)
    if (channel_->twin_quiet) {
        // Nothing of ours waits for a pass (see note_work): only the inbox to look at (unless
        // our owner reads it), and every 4th time our heartbeat, then a whole pass when the peers'
        // liveness check is due. (tandem, which reads our inbox, calls us every 16th of its
        // empty passes while we are quiet: the clock is read once in its 64, as it is in a
        // busy pass's 64 below.) Short cells are taken here, and the pass stays quiet unless
        // one left a completion waiting for room in the owner's CQ.
        const bool owner_reads = this->owner_reads();
        for (int i = 0; i < 64; ++i) {
            const auto *cell =
                owner_reads ? nullptr : static_cast<const uint8_t *>(channel_->inbox()->peek());
            if (!cell) {
                if ((++passes_ & (owner_reads ? 3 : 63)) != 0 || !beat()) return;
                progress_all(true, true);
                return;
            }
            if (cell[0] != static_cast<uint8_t>(LocalOp::Short) || channel_->holds().active())
                break;
            handle_short(cell);
            channel_->inbox()->release();
            if (!cq_backlog_.empty()) break;
        }
        channel_->twin_quiet = false;
    }
    progress_all(false);
}

// A whole pass: everything that may wait for one, then the inbox. `counted`: progress()
// counted this pass already; `check_due`: and found the liveness check due.
void Endpoint::progress_all(bool counted, bool check_due) {
    if (!counted && (++passes_ & 63) == 0) check_due = beat();
    if (!enabled_) return;
    if (!coll_.idle()) coll_.progress();
    // A bounded batch: a sender that never stops must not starve the rest of the owner. (When
    // the owner reads the inbox, the cells it handed us since the last pass.)
    const bool owner_reads = this->owner_reads();
    int handled = owner_reads ? std::exchange(cells_from_owner_, 0) : 0;
    shm::SenderHold &holds = channel_->holds();
    for (; !owner_reads && handled < 64; ++handled) {
        // Cells released from a hold go first: they are older than their sender's in the ring.
        if (holds.has_released()) holds.replay([this](const uint8_t *c) { handle_cell(c); });
        const void *cell = channel_->inbox()->peek();
        if (!cell) break;
        auto *c = static_cast<const uint8_t *>(cell);
        // (The commonest cell first, without the dispatch's other checks.)
        if (!holds.active()) {
            if (c[0] == static_cast<uint8_t>(LocalOp::Short))
                handle_short(c);
            else
                handle_cell(c);
        } else if (!holds.keep_if_held(c)) {
            handle_cell(c);
        }
        channel_->inbox()->release();
    }
    channel_->flush();
    // Completions the owner's CQ refused earlier go first, in order.
    while (!cq_backlog_.empty() && try_write_cq(cq_backlog_.front())) cq_backlog_.pop_front();
    while (!tx_done_.empty()) {
        TxCompletion c = tx_done_.front();
        tx_done_.pop_front();
        CqWrite w{.kind = c.err ? CqWrite::Kind::Error : CqWrite::Kind::Entry};
        w.e.op_context = c.context;
        w.e.flags = c.flags;
        w.e.len = c.len;
        w.e.err = c.err;
        w.e.prov_errno = c.err;
        write_cq(w);
    }
    // Peers' liveness every 200 ms; the clock itself read with the heartbeat, every 64 passes
    // (reading it on every poll showed up as a tenth of a ping-pong's time), every 32 while
    // atomics wait for answers (a small atomic's round trip is a few passes: a clock read each
    // would be a tenth of it), and on every pass while other operations wait on a peer. (Once
    // in 1024 passes was too seldom: a process sharing its core with others, whose passes each
    // give the core away, took seconds to notice a dead peer, and meanwhile staged a large
    // send into the dead peer's ring and completed it.)
    const bool waiting = waiting_on_peers();
    if (check_due || (atomics_pending_ && passes_ % 32 == 0) || !pending_.empty() ||
        !splits_.empty() || !restaging_.empty() || channel_->owner_waits) {
        int64_t now = coarse_now_ms();
        if (now >= next_check_ms_)
            // (Again at the next tick while a dead peer's verdict waits for our inbox.)
            next_check_ms_ = now + (check_peers() ? 1 : 200);
    }
    // Operations that wait on a peer (its answer, or room in its ring), and pass after pass
    // brings nothing: the peer may have no core (more processes than cores), and our busy
    // poll would keep it off ours until the scheduler's time slice ends. Every kYieldAfter
    // fruitless passes we give the core away.
    if ((waiting || sender_->backlogged) && handled == 0) {
        if (++fruitless_passes_ >= kYieldAfter) {
            fruitless_passes_ = 0;
            sched_yield();
        }
    } else {
        fruitless_passes_ = 0;
    }
    // Quiet when nothing but a cell can give this endpoint work: then the next passes only
    // look at the inbox until a cell comes or a call of the owner's brings work (note_work).
    channel_->twin_quiet = coll_.idle() && !sender_->backlogged && cq_backlog_.empty() &&
                           tx_done_.empty() && !waiting && !holds.active();
}

void Endpoint::complete_tx(void *context, uint64_t flags, size_t len, int err) {
    tx_done_.push_back({context, flags, len, err});
}

void Endpoint::take_cell(const uint8_t *cell) {
    ++cells_from_owner_;
    note_work();  // the owner calls our progress next (the cell may have left work)
    handle_cell(cell);
}

void Endpoint::handle_cell(const uint8_t *cell) {
    switch (static_cast<LocalOp>(cell[0])) {
        case LocalOp::Short:
            handle_short(cell);
            return;
        case LocalOp::Atomic:
            serve_atomic(cell);
            return;
        case LocalOp::AtomicResp:
            finish_atomic(cell);
            return;
        default:
            break;
    }
    LocalHeader hdr;
    memcpy(&hdr, cell, sizeof hdr);
    if (hdr.name_len > wire::kLocalNameRoom) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed cell\n");
        return;
    }
    // The sender's address bytes: mapped to an fi_addr_t (cached), and to the key of its
    // inbox only when we answer it.
    std::string_view sender(reinterpret_cast<const char *>(cell + sizeof hdr), hdr.name_len);
    const uint8_t *body = body_of(cell);
    if (hdr.size > wire::kLocalBodyRoom || hdr.iov_count > wire::kLocalMaxIov) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed cell (op %u)\n", hdr.op);
        return;
    }
    if (shm::Channel::names_process(hdr) && !channel_->vouch_for_process(hdr, sender)) return;
    handle_long_cell(hdr, sender, body);
}

// A cell under the long header (checked, and its pid vouched for), by its op. Eager, the
// commonest, first and inline.
void Endpoint::handle_long_cell(const LocalHeader &hdr, std::string_view sender,
                                const uint8_t *body) {
    switch (static_cast<LocalOp>(hdr.op)) {
        case LocalOp::Eager:
            if (hdr.total != hdr.size) {  // the whole message is in the cell, or it is no Eager
                TANDEM_WARN(FI_LOG_EP_DATA, "dropping an eager cell of %u bytes claiming %llu\n",
                            hdr.size, (unsigned long long)hdr.total);
                return;
            }
            handle_message(hdr, sender, source_of(sender), body, nullptr, nullptr);
            return;
        case LocalOp::Rts:
            handle_message(hdr, sender, source_of(sender), nullptr,
                           reinterpret_cast<const LocalIov *>(body), nullptr);
            return;
        case LocalOp::IpcRts: {
            wire::LocalIpc ipc[wire::kLocalMaxIov];  // (copied: the cell body is unaligned)
            memcpy(ipc, body, hdr.iov_count * sizeof(wire::LocalIpc));
            handle_message(hdr, sender, source_of(sender), nullptr, nullptr, nullptr, ipc);
            return;
        }
        case LocalOp::Frag:
            handle_frag(hdr, sender, body);
            return;
        case LocalOp::Fin:
            if (auto it = answered_by(hdr, sender); it != pending_.end())
                finish_pending(it, hdr.status);
            return;
        case LocalOp::ReadData:
            if (auto it = answered_by(hdr, sender); it != pending_.end())
                handle_read_data(it, hdr, body);
            return;
        case LocalOp::Write:
        case LocalOp::Read:
        case LocalOp::WriteFrag:
        case LocalOp::IpcWrite:
            handle_rma(hdr, sender, body);
            return;
        case LocalOp::Cts:
            handle_cts(hdr, sender, body);
            return;
        case LocalOp::WriteDone:
            handle_write_done(hdr, sender);
            return;
        case LocalOp::Short:
        case LocalOp::Atomic:
        case LocalOp::AtomicResp:
            return;  // handled by handle_cell, before the long header is read
    }
    TANDEM_WARN(FI_LOG_EP_DATA, "dropping a cell with unknown op %u\n", hdr.op);
}

// A fragment of a staged message (Frag), after those before it; the whole message delivered
// once its last fragment came. A Frag with a status ends its message instead.
void Endpoint::handle_frag(const LocalHeader &hdr, std::string_view sender, const uint8_t *body) {
    std::pair<std::string, uint64_t> id{std::string(sender), hdr.msg_id};
    if (hdr.status) {
        abandon_staged(id, hdr, sender);
        return;
    }
    // A message of 0 bytes goes whole (Eager), and none is larger than an endpoint
    // takes: the first fragment's total is what we allocate, so it is checked first.
    if (hdr.total == 0 || hdr.total > kMaxMessage) {
        staged_.erase(id);
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a fragment of a %llu-byte message\n",
                    (unsigned long long)hdr.total);
        return;
    }
    // The fragments of a message come in order (one sender, one ring): each goes at
    // the end of what came before, so the memory held is what was sent, not what the
    // first fragment claims. A first fragment for an id under way is a new process's at
    // the sender's address (see Engine::receive_frag): the dead one's part gives way.
    auto &st = staged_[id];
    if (hdr.offset == 0) st.data.clear();
    if (st.data.empty()) {
        st.hdr = hdr;
        // One allocation for messages up to 64 MiB (untouched pages cost nothing).
        st.data.reserve(std::min<uint64_t>(hdr.total, 64u << 20));
    }
    if (hdr.total != st.hdr.total || hdr.offset != st.data.size() ||
        hdr.size > hdr.total - hdr.offset) {
        staged_.erase(id);
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a fragment out of its message\n");
        return;
    }
    st.data.insert(st.data.end(), body, body + hdr.size);
    if (st.data.size() < hdr.total) return;
    Staged whole = std::move(st);
    staged_.erase(id);
    // The staged copy of an IpcRts we could not map already has its receive.
    if (auto r = restaging_.find(id); r != restaging_.end()) {
        fi_peer_rx_entry *entry = r->second;
        restaging_.erase(r);
        deliver(entry, whole.hdr, sender, whole.data.data(), nullptr, source_of(sender));
        return;
    }
    handle_message(whole.hdr, sender, source_of(sender), whole.data.data(), nullptr, &whole.data);
}

// The sender gave up on a staged message (a Frag with a status): the receive we hold for it
// (see finish_pending) completes with that status, and what came of it is dropped.
void Endpoint::abandon_staged(const std::pair<std::string, uint64_t> &id, const LocalHeader &hdr,
                              std::string_view sender) {
    if (auto r = restaging_.find(id); r != restaging_.end()) {
        fi_peer_rx_entry *entry = r->second;
        restaging_.erase(r);
        complete_rx(entry, hdr, 0, hdr.status, source_of(sender));
    }
    staged_.erase(id);
}

// Any local process of the user can write our inbox under a live endpoint's name: an answer
// from another than the peer an operation went to would end it (its buffers back to the
// application) or write into it while that peer may still read or write them. An answer for
// an operation that ended already (a death, a failed stream) is no one's, quietly.
Endpoint::PendingMap::iterator Endpoint::answered_by(const LocalHeader &hdr,
                                                     std::string_view sender) {
    auto it = pending_.find(hdr.msg_id);
    if (it == pending_.end() || shm::same_address(it->second.link, link_to(sender))) [[likely]]
        return it;
    TANDEM_WARN(FI_LOG_EP_DATA,
                "ignoring an answer (op %u) for an operation sent to another peer\n", hdr.op);
    return pending_.end();
}

// A part of what a Read we issued asked for (ReadData), scattered into the operation's
// buffers; the operation finished with the last part, or at the first error.
void Endpoint::handle_read_data(PendingMap::iterator it, const LocalHeader &hdr,
                                const uint8_t *body) {
    Pending &p = it->second;
    if (hdr.status) {  // the target could not copy its memory
        finish_pending(it, hdr.status);
        return;
    }
    if (p.mem.empty())
        iov_scatter(p.iov.data(), p.iov.size(), hdr.offset, body, hdr.size);
    else if (hmem::scatter(p.iov.data(), p.mem.data(), p.iov.size(), hdr.offset, body, hdr.size) <
             0)
        p.received = SIZE_MAX / 2;  // reported as an error when the last one came
    p.received += hdr.size;
    if (hdr.flags & wire::kLocalLast) finish_pending(it, p.received > p.len ? FI_EIO : 0);
}

// A Short cell is an Eager message with the fields it leaves out implied. When our owner reads
// our inbox, its decoder takes every Short cell (one route for them on its receive side), and
// none comes here; otherwise the owner's SRX gives the receive (place_short, out of this line).
void Endpoint::handle_short(const uint8_t *cell) {
    ShortView s;
    if (!read_short(cell, s)) [[unlikely]] {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed cell\n");
        return;
    }
    const fi_addr_t src = source_of(s.sender);
    const peer::ImportedSrx &srx = srx_->owner();
    fi_peer_rx_entry *entry = nullptr;
    int ret = (s.flags & wire::kLocalTagged) ? srx.get_tag(src, s.tag, &entry)
                                             : srx.get_msg(src, s.size, &entry);
    place_short(cell, src, ret, entry);
}

// A Short cell's message once the owner answered (ret, entry: as its get_tag / get_msg).
void Endpoint::place_short(const uint8_t *cell, fi_addr_t src, int ret, fi_peer_rx_entry *entry) {
    ShortView s;
    // (handle_short checked the cell before asking the owner: a false here cannot happen, and
    // drops the message rather than read fields read_short left unset.)
    if (!read_short(cell, s)) return;
    LocalHeader hdr{};
    hdr.op = static_cast<uint8_t>(LocalOp::Eager);
    hdr.flags = s.flags;
    hdr.name_len = static_cast<uint8_t>(s.sender.size());
    hdr.size = s.size;
    hdr.total = s.size;
    hdr.tag = s.tag;
    hdr.cq_data = s.cq_data;
    place_message(ret, entry, hdr, s.sender, src, s.data, nullptr, nullptr, nullptr);
}

// A completion to the owner's CQ, behind those it refused before (kept, in order, and
// written again at the next progress: the owner handles its CQ's overflow, fi_peer(3)).
void Endpoint::write_cq(const CqWrite &w) {
    if (cq_backlog_.empty() && try_write_cq(w)) return;
    if (cq_backlog_.empty())
        TANDEM_DEBUG(FI_LOG_CQ, "the owner's CQ is full: completions wait for room\n");
    cq_backlog_.push_back(w);
}

// False when the owner's CQ has no room now (-FI_EAGAIN); the entry of a receive goes back
// to the owner once its completion is written. Any other refusal is final for that
// completion: reported in the log, not retried for ever ahead of all the others.
bool Endpoint::try_write_cq(const CqWrite &w) {
    ssize_t ret = 0;
    if (w.kind == CqWrite::Kind::Error)
        ret = cq_->owner().writeerr(w.e);
    else if (w.kind == CqWrite::Kind::Entry)
        ret = cq_->owner().write(w.e.op_context, w.e.flags, w.e.len, w.e.buf, w.e.data, w.e.tag,
                                 w.src);
    if (ret == -FI_EAGAIN) return false;
    if (ret)
        TANDEM_WARN(FI_LOG_CQ, "the owner's CQ refused a completion (context %p, flags %#lx): %s\n",
                    w.e.op_context, (unsigned long)w.e.flags, fi_strerror(int(-ret)));
    if (w.entry) srx_->owner().free_entry(w.entry);
    return true;
}

}  // namespace tandem::off

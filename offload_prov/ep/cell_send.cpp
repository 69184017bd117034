// The cell send path: every cell we send goes into a peer's inbox ring through here, or into
// the link's backlog while the ring is full (built cells, and streams cut into cells as room
// appears), drained in order at progress. And the wake-up handshake with a peer that sleeps.
#include "offload_prov/endpoint.h"

#include "common/iov.h"
#include "common/log.h"
#include "offload_prov/ep/endpoint_internal.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalOp;

void Endpoint::push(PeerLink &link, const LocalHeader &hdr, const void *body, size_t len) {
    iovec iov{const_cast<void *>(body), len};
    push_gather(link, hdr, &iov, len ? 1 : 0, 0, len);
}

// False when device memory could not be copied (nothing was pushed then): device bytes go
// through a bounce first, so that a failed copy never reaches the receiver as data.
bool Endpoint::push_gather(PeerLink &link, const LocalHeader &hdr, const iovec *iov, size_t count,
                           size_t offset, size_t len, const hmem::MemRef *mem) {
    const uint8_t *staged = nullptr;
    if (mem) {
        thread_local std::vector<uint8_t> bounce;
        bounce.resize(len);
        if (hmem::gather(bounce.data(), iov, mem, count, offset, len) != ssize_t(len)) {
            TANDEM_WARN(FI_LOG_EP_DATA, "device memory could not be copied for sending\n");
            return false;
        }
        staged = bounce.data();
    }
    if (try_push(link, hdr, iov, count, offset, len, staged)) return true;
    // The inbox is full: keep the cell, in order, for the next progress call.
    std::vector<uint8_t> cell(sizeof hdr + wire::kLocalNameRoom + len);
    fill_cell(cell.data(), hdr, iov, count, offset, len, staged);
    if (link.backlog.empty()) ++backlogged_;
    link.backlog.push_back(Outgoing{std::move(cell), nullptr});
    link.blocked |= peer::kLaneBacklog;
    return true;
}

// An Eager message nobody waits a Fin for goes as a Short cell (see wire::LocalShortHeader).
void Endpoint::fill_cell(uint8_t *cell, const LocalHeader &hdr, const iovec *iov, size_t count,
                         size_t offset, size_t len, const uint8_t *staged) const {
    if (hdr.op == static_cast<uint8_t>(LocalOp::Eager) && !(hdr.flags & wire::kLocalAckReq)) {
        fill_short(cell,
                   {.op = static_cast<uint8_t>(LocalOp::Short),
                    .flags = hdr.flags,
                    .name_len = hdr.name_len,
                    .reserved = 0,
                    .size = hdr.size,
                    .tag = hdr.tag,
                    .cq_data = hdr.cq_data},
                   iov, count, offset, len, staged);
        return;
    }
    memcpy(cell, &hdr, sizeof hdr);
    memcpy(cell + sizeof hdr, name_, wire::kLocalNameRoom);
    uint8_t *body = cell + sizeof hdr + wire::kLocalNameRoom;
    if (staged)
        memcpy(body, staged, len);
    else
        iov_gather(body, iov, count, offset, len);
}

void Endpoint::fill_short(uint8_t *cell, const wire::LocalShortHeader &s, const iovec *iov,
                          size_t count, size_t offset, size_t len, const uint8_t *staged) const {
    const void *from = staged;
    if (!from && count == 1 && offset <= iov[0].iov_len && len <= iov[0].iov_len - offset)
        from = static_cast<const uint8_t *>(iov[0].iov_base) + offset;
    if (!from && len) {
        thread_local std::vector<uint8_t> gathered;
        gathered.resize(len);
        iov_gather(gathered.data(), iov, count, offset, len);
        from = gathered.data();
    }
    write_short(cell, short_line_, s.flags, from, len, s.tag, s.cq_data);
}

// A payload in as many cells as it takes (Frag, WriteFrag, ReadData): each carries its
// offset, the last one kLocalLast (an empty payload still sends that one cell). The cells
// that fit go now; the rest follow from the payload's own buffers as the ring makes room
// (flush), behind whatever waited before. `end` says what happens once it is all sent.
void Endpoint::push_staged(PeerLink &link, LocalHeader hdr, const iovec *iov, size_t count,
                           size_t len, const hmem::MemRef *mem, StreamEnd end) {
    auto stream = std::make_unique<Stream>();
    stream->hdr = hdr;
    stream->hdr.offset = 0;
    stream->iov.assign(iov, iov + count);
    if (mem) stream->mem.assign(mem, mem + count);
    stream->len = len;
    stream->end = end;
    int status = 0;
    if (link.backlog.empty() && pump(link, *stream, &status)) {
        finish_stream(*stream, status);
        return;
    }
    if (link.backlog.empty()) ++backlogged_;
    link.backlog.push_back(Outgoing{{}, std::move(stream)});
    link.blocked |= peer::kLaneBacklog;
}

// The stream's next cells into the ring while it has room: true when the stream ended, with
// *status 0 (its last cell went) or FI_EIO (a device copy failed: an empty last cell with
// that status ends the payload instead, and the receiver drops what it assembled).
bool Endpoint::pump(PeerLink &link, Stream &stream, int *status) {
    LocalHeader &hdr = stream.hdr;
    for (;;) {
        void *reserved = link.ring->try_reserve(producer_id_, link.view);
        if (!reserved) return false;
        auto *cell = static_cast<uint8_t *>(reserved);
        const size_t off = hdr.offset;
        hdr.size = static_cast<uint32_t>(std::min(wire::kLocalBodyRoom, stream.len - off));
        if (off + hdr.size == stream.len) hdr.flags |= wire::kLocalLast;
        uint8_t *body = cell + sizeof hdr + wire::kLocalNameRoom;
        bool copied = true;
        if (stream.mem.empty())
            iov_gather(body, stream.iov.data(), stream.iov.size(), off, hdr.size);
        else
            copied = hmem::gather(body, stream.iov.data(), stream.mem.data(), stream.iov.size(),
                                  off, hdr.size) == ssize_t(hdr.size);
        LocalHeader out = hdr;
        if (!copied) {
            TANDEM_WARN(FI_LOG_EP_DATA, "device memory could not be copied for sending\n");
            out.flags |= wire::kLocalLast;
            out.size = 0;
            out.status = FI_EIO;
        }
        memcpy(cell, &out, sizeof out);
        memcpy(cell + sizeof out, name_, wire::kLocalNameRoom);
        link.ring->publish(cell);
        notify(link);
        if (out.flags & wire::kLocalLast) {
            *status = out.status;
            return true;
        }
        hdr.offset = off + hdr.size;
    }
}

void Endpoint::finish_stream(const Stream &stream, int status) {
    switch (stream.end.kind) {
        case StreamEnd::Kind::None:
            return;
        case StreamEnd::Kind::CompleteTx:
            complete_tx(stream.end.context, stream.end.flags, stream.len, status);
            return;
        case StreamEnd::Kind::FailPending:
            if (status) finish_pending(stream.hdr.msg_id, status);
            return;
        case StreamEnd::Kind::ReadAccess:
            if (!status && owner_ep_ops_)
                owner_ep_ops_->access_done(owner_ep_, stream.end.rma_key, FI_REMOTE_READ);
            return;
    }
}

bool Endpoint::flush(PeerLink &link) {
    while (!link.backlog.empty()) {
        Outgoing &next = link.backlog.front();
        if (next.stream) {
            int status = 0;
            if (!pump(link, *next.stream, &status)) return false;
            std::unique_ptr<Stream> done = std::move(next.stream);
            link.backlog.pop_front();
            if (link.backlog.empty()) {
                --backlogged_;
                link.blocked &= uint8_t(~peer::kLaneBacklog);
            }
            finish_stream(*done, status);
            continue;
        }
        void *cell = link.ring->try_reserve(producer_id_, link.view);
        if (!cell) return false;
        memcpy(cell, next.cell.data(), next.cell.size());
        link.ring->publish(cell);
        link.backlog.pop_front();
        if (link.backlog.empty()) {
            --backlogged_;
            link.blocked &= uint8_t(~peer::kLaneBacklog);
        }
        notify(link);
    }
    return true;
}

// The receiver armed its ring before sleeping and our last claim saw it (ShmRing's sleep
// protocol): after publishing, the producer that takes the flag writes the wake FIFO.
void Endpoint::wake(PeerLink &link) {
    link.view.wake = false;
    if (link.ring->take_wake()) link.wake.wake();
}

int Endpoint::arm() {
    if (!enabled_) return 0;
    if (wake_) wake_->drain();
    bool pending =
        (inbox_ && !inbox_->arm()) || !tx_done_.empty() || !cq_backlog_.empty() || backlogged_;
    if (!wake_) return pending ? 1 : 0;
    if (pending)
        wake_->wake_self();
    else
        arm_liveness_timer();
    return pending ? 1 : 0;
}

// While operations wait on peers (an answer, a split copy's other half, an atomic's result),
// the sleep ends when their next liveness check is due; otherwise no timer runs.
void Endpoint::arm_liveness_timer() {
    if (waiting_on_peers())
        wake_->set_timer(next_check_ms_ - coarse_now_ms());
    else if (wake_->timer_set())
        wake_->stop_timer();
}

void Endpoint::answer(std::string_view sender, uint64_t msg_id, int status) {
    PeerLink *link = link_to(sender);
    if (!link) return;  // the sender is gone: nobody waits for the answer
    LocalHeader hdr = proto_;
    hdr.op = static_cast<uint8_t>(LocalOp::Fin);
    hdr.msg_id = msg_id;
    hdr.status = status;
    push(*link, hdr, nullptr, 0);
}

void Endpoint::push_compact(PeerLink &link, const wire::LocalShortHeader &h, const void *body,
                            size_t len) {
    const size_t at = wire::local_short_body_offset(h.name_len);
    uint8_t cell[wire::kLocalCellSize];
    memcpy(cell, &h, sizeof h);
    memcpy(cell + sizeof h, name_, at - sizeof h);  // name_ is zero-padded
    memcpy(cell + at, body, len);
    push_cell(link, cell, at + len);
}

void Endpoint::push_cell(PeerLink &link, const uint8_t *cell, size_t n) {
    if (link.backlog.empty()) {
        if (void *slot = link.ring->try_reserve(producer_id_, link.view)) {
            // (A small cell is the one line the receiver polls: one copy, one burst.)
            memcpy(slot, cell, n);
            link.ring->publish(slot);
            notify(link);
            return;
        }
    }
    if (link.backlog.empty()) ++backlogged_;
    link.backlog.push_back(Outgoing{std::vector<uint8_t>(cell, cell + n), nullptr});
    link.blocked |= peer::kLaneBacklog;
}

}  // namespace tandem::off

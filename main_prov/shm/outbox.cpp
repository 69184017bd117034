#include "main_prov/shm/outbox.h"

#include "common/iov.h"
#include "common/log.h"
#include "common/test_hook.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

namespace tandem::shm {

using wire::LocalHeader;
using wire::LocalOp;

void Sender::stream_ended(const Stream &stream, int status) {
    if (stream.end.to)
        stream.end.to->stream_ended(stream, status);
    else if (streams)
        streams->stream_ended(stream, status);
    else
        TANDEM_WARN(FI_LOG_EP_DATA, "a stream (operation %llu) ended with nobody to tell\n",
                    static_cast<unsigned long long>(stream.hdr.msg_id));
}

void Outbox::push(Sender &s, const LocalHeader &hdr, const void *body, size_t len) {
    iovec iov{const_cast<void *>(body), len};
    push_gather(s, hdr, &iov, len ? 1 : 0, 0, len);
}

bool Outbox::push_gather(Sender &s, const LocalHeader &hdr, const iovec *iov, size_t count,
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
    if (try_push(s, hdr, iov, count, offset, len, staged)) return true;
    // The ring is full: keep the cell, in order, for the next flush.
    std::vector<uint8_t> cell(sizeof hdr + wire::kLocalNameRoom + len);
    fill_cell(s, cell.data(), hdr, iov, count, offset, len, staged);
    keep(s, Outgoing{std::move(cell), nullptr});
    return true;
}

bool Outbox::try_push(Sender &s, const LocalHeader &hdr, const iovec *iov, size_t count,
                      size_t offset, size_t len, const uint8_t *staged) {
    if (!backlog_.empty()) return false;
    void *cell = ring_->try_reserve(s.producer, view);
    if (!cell) return false;
    stop_at("local.ring_reserved");
    fill_cell(s, static_cast<uint8_t *>(cell), hdr, iov, count, offset, len, staged);
    ring_->publish(cell);
    notify();
    return true;
}

void Outbox::fill_cell(const Sender &s, uint8_t *cell, const LocalHeader &hdr, const iovec *iov,
                       size_t count, size_t offset, size_t len, const uint8_t *staged) const {
    if (hdr.op == static_cast<uint8_t>(LocalOp::Eager) && !(hdr.flags & wire::kLocalAckReq)) {
        const void *from = staged;
        if (!from && count == 1 && offset <= iov[0].iov_len && len <= iov[0].iov_len - offset)
            from = static_cast<const uint8_t *>(iov[0].iov_base) + offset;
        if (!from && len) {
            thread_local std::vector<uint8_t> gathered;
            gathered.resize(len);
            iov_gather(gathered.data(), iov, count, offset, len);
            from = gathered.data();
        }
        write_short(cell, *s.short_line, hdr.flags, from, len, hdr.tag, hdr.cq_data);
        return;
    }
    memcpy(cell, &hdr, sizeof hdr);
    memcpy(cell + sizeof hdr, s.name, wire::kLocalNameRoom);
    uint8_t *body = cell + sizeof hdr + wire::kLocalNameRoom;
    if (staged)
        memcpy(body, staged, len);
    else
        iov_gather(body, iov, count, offset, len);
}

void Outbox::push_compact(Sender &s, const wire::LocalShortHeader &h, const void *body,
                          size_t len) {
    const size_t at = wire::local_short_body_offset(h.name_len);
    uint8_t cell[wire::kLocalCellSize];
    memcpy(cell, &h, sizeof h);
    memcpy(cell + sizeof h, s.name, at - sizeof h);  // (the name is zero-padded)
    memcpy(cell + at, body, len);
    push_cell(s, cell, at + len);
}

void Outbox::push_cell(Sender &s, const uint8_t *cell, size_t n) {
    if (backlog_.empty() && write_now(s, cell, n)) return;
    keep(s, Outgoing{std::vector<uint8_t>(cell, cell + n), nullptr});
}

bool Outbox::write_now(Sender &s, const uint8_t *cell, size_t n) {
    void *slot = ring_->try_reserve(s.producer, view);
    if (!slot) return false;
    // (A small cell is the one line the receiver polls: one copy, one burst.)
    memcpy(slot, cell, n);
    ring_->publish(slot);
    notify();
    return true;
}

void Outbox::push_stream(Sender &s, LocalHeader hdr, const iovec *iov, size_t count, size_t len,
                         const hmem::MemRef *mem, StreamEnd end) {
    auto stream = std::make_unique<Stream>();
    stream->hdr = hdr;
    stream->hdr.offset = 0;
    stream->iov.assign(iov, iov + count);
    if (mem) stream->mem.assign(mem, mem + count);
    stream->len = len;
    stream->end = end;
    int status = 0;
    if (backlog_.empty() && pump(s, *stream, &status)) {
        s.stream_ended(*stream, status);
        return;
    }
    keep(s, Outgoing{{}, std::move(stream)});
    stop_at("local.stream_backlogged");
}

bool Outbox::pump(Sender &s, Stream &stream, int *status) {
    LocalHeader &hdr = stream.hdr;
    for (;;) {
        void *reserved = ring_->try_reserve(s.producer, view);
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
        memcpy(cell + sizeof out, s.name, wire::kLocalNameRoom);
        ring_->publish(cell);
        notify();
        if (out.flags & wire::kLocalLast) {
            *status = out.status;
            return true;
        }
        hdr.offset = off + hdr.size;
    }
}

void Outbox::keep(Sender &s, Outgoing outgoing) {
    if (backlog_.empty()) ++s.backlogged;
    backlog_.push_back(std::move(outgoing));
    blocked |= kBacklog;
}

void Outbox::pop(Sender &s) {
    backlog_.pop_front();
    if (backlog_.empty()) {
        --s.backlogged;
        blocked &= uint8_t(~kBacklog);
    }
}

bool Outbox::flush(Sender &s) {
    while (!backlog_.empty()) {
        Outgoing &next = backlog_.front();
        if (next.stream) {
            int status = 0;
            if (!pump(s, *next.stream, &status)) return false;
            std::unique_ptr<Stream> done = std::move(next.stream);
            pop(s);
            s.stream_ended(*done, status);
            continue;
        }
        if (!write_now(s, next.cell.data(), next.cell.size())) return false;
        pop(s);
    }
    return true;
}

void Outbox::close_dead(Sender &s) {
    blocked = kDead;
    if (!backlog_.empty()) --s.backlogged;
    std::deque<Outgoing> unsent = std::move(backlog_);
    backlog_.clear();
    for (const Outgoing &o : unsent)
        if (o.stream) s.stream_ended(*o.stream, FI_ECONNRESET);
}

}  // namespace tandem::shm

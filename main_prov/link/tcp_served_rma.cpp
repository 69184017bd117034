// RMA served at the target of the TCP link (tcp_link.h): an incoming write is checked against
// the region its key names and placed there, or refused (Nak); a read request is answered
// from its region, in frames of one bounce chunk when the region is device memory.
#include "main_prov/link/tcp_link.h"
#include "main_prov/link/tcp_link_internal.h"

#include "common/log.h"
#include "common/test_hook.h"

#include <rdma/fabric.h>

namespace tandem {

// A write's frame: checked whole, then its payload goes to the region its key names (or is
// discarded, refused). False: no receive buffer for its immediate data yet (stall), or the
// connection failed.
bool TcpConnection::begin_write() {
    // ext.length is the rest of the write from ext.addr: this frame's payload, or
    // more when further frames (kTcpMore) follow.
    const bool fault = cur_.status == static_cast<uint8_t>(wire::TcpStatus::SourceFault);
    const bool more = cur_.flags & wire::kTcpMore;
    bool well_formed =
        fault ? !cur_.length && !cur_ext_.length &&
                    !(cur_.flags & (wire::kTcpMore | wire::kTcpHasImm))
              : cur_.status == 0 && (more ? cur_.length && cur_.length < cur_ext_.length &&
                                                !(cur_.flags & wire::kTcpHasImm)
                                          : cur_.length == cur_ext_.length);
    if (!well_formed) {
        fail_connection("malformed write", EPROTO);
        return false;
    }
    stop_at("link.write_received");
    if (fault) {
        cur_status_ = wire::TcpStatus::SourceFault;
        dst_discard_ = true;
        return true;
    }
    if (cur_.flags & wire::kTcpHasImm) {
        TcpTransport::PostedRecv posted;
        if (!transport_->take_posted(posted)) return false;
        posted_buf_ = posted.buf;
        posted_len_ = posted.len;
        posted_wr_id_ = posted.wr_id;
    }
    // The whole rest of the write is checked, so that a write refused anywhere
    // writes nothing, and once a frame of it is refused the rest is discarded.
    LocalPieces pieces;
    if (write_status_ != wire::TcpStatus::Ok) {
        cur_status_ = write_status_;
        dst_discard_ = true;
    } else if (!transport_->resolver()->resolve(cur_ext_.key, cur_ext_.addr, cur_ext_.length,
                                                FI_REMOTE_WRITE, pieces)) {
        cur_status_ = wire::TcpStatus::RemoteAccess;
        dst_discard_ = true;
    } else {
        bool host = hmem::all_host(pieces.mem, pieces.count);
        slice_pieces(pieces.iov, host ? nullptr : pieces.mem, pieces.count, 0, cur_.length,
                     dst_iov_, dst_mem_);
    }
    return true;
}

// A write's frame has arrived whole. A write in several frames (from device memory) is one
// work request: its earlier frames only place bytes (or note that the target refused them),
// and this returns false for them; its last frame ends it (true): answered with a Nak if it
// was refused, completed with its immediate data if it carries some.
bool TcpConnection::finish_write() {
    write_bytes_ += cur_.length;
    if (cur_status_ != wire::TcpStatus::Ok && write_status_ == wire::TcpStatus::Ok)
        write_status_ = cur_status_;
    if (cur_.flags & wire::kTcpMore) return false;
    cur_status_ = write_status_;
    write_status_ = wire::TcpStatus::Ok;
    last_write_ok_ = cur_status_ == wire::TcpStatus::Ok;
    write_ended_ = true;
    if (cur_status_ == wire::TcpStatus::SourceFault) {
        // The initiator could not copy the rest of its source and knows it failed:
        // nothing to answer, nothing to report here.
        TANDEM_INFO(FI_LOG_EP_DATA, "a peer's write ended early: its source faulted\n");
    } else if (cur_status_ != wire::TcpStatus::Ok) {
        FramePtr nak = make_frame(wire::TcpOp::Nak, nullptr, nullptr, 0, false);
        nak->hdr.status = static_cast<uint8_t>(cur_status_);
        nak->hdr.imm = rx_count_;
        queue_frame(std::move(nak));
        if (posted_buf_) transport_->post_recv(posted_buf_, posted_len_, posted_wr_id_);
        posted_buf_ = nullptr;
        TANDEM_WARN(FI_LOG_EP_DATA, "remote write rejected: key 0x%lx addr 0x%lx len %lu\n",
                    (unsigned long)cur_ext_.key, (unsigned long)cur_ext_.addr,
                    (unsigned long)cur_.length);
    } else {
        transport_->resolver()->remote_access_done(cur_ext_.key, FI_REMOTE_WRITE);
        if (cur_.flags & wire::kTcpHasImm) {
            WorkCompletion wc{posted_wr_id_,     this, WcOpcode::RecvWriteImm,
                              WcStatus::Success, true, cur_.imm,
                              write_bytes_};
            posted_buf_ = nullptr;
            transport_->push_completion(wc);
        }
    }
    write_bytes_ = 0;
    return true;
}

// A read request has arrived: its response is queued, from the region its key names, or
// refused with RemoteAccess.
void TcpConnection::serve_read_request() {
    stop_at("link.read_requested");
    LocalPieces pieces;
    bool ok = transport_->resolver()->resolve(cur_ext_.key, cur_ext_.addr, cur_ext_.length,
                                              FI_REMOTE_READ, pieces);
    if (ok && !hmem::all_host(pieces.mem, pieces.count)) {
        queue_device_read_response(pieces, cur_ext_.key, cur_ext_.length);
        return;
    }
    FramePtr frame = new_frame();
    OutFrame &resp = *frame;
    resp.hdr.op = static_cast<uint8_t>(wire::TcpOp::ReadResp);
    if (!ok) {
        resp.hdr.status = static_cast<uint8_t>(wire::TcpStatus::RemoteAccess);
        TANDEM_WARN(FI_LOG_EP_DATA, "remote read rejected: key 0x%lx addr 0x%lx len %lu\n",
                    (unsigned long)cur_ext_.key, (unsigned long)cur_ext_.addr,
                    (unsigned long)cur_ext_.length);
    } else {
        resp.hdr.length = cur_ext_.length;
        for (size_t k = 0; k < pieces.count; ++k) {
            if (!pieces.iov[k].iov_len) continue;
            resp.mem[resp.iov_count] = pieces.mem[k];
            resp.iov[resp.iov_count++] = pieces.iov[k];
        }
        if (pieces.application) {
            // The target's FI_REMOTE_READ counter moves once the bytes have left (see
            // retire_sent), and they leave copied, not spliced: an application that
            // sees the counter may change its memory, which must not alter what is
            // in flight. (A rendezvous source stays the sender's until the reader's
            // Fin, so it may be spliced.)
            resp.counts_remote_read = true;
            resp.read_key = cur_ext_.key;
            resp.no_splice = true;
        }
    }
    queue_frame(std::move(frame));
}

// A read response from device memory goes in frames of at most one bounce chunk, each copied
// to the host before its header leaves: should a copy fail, the frames sent so far are whole
// and the next one can still say so (end_with_fault), where a single frame would
// have announced bytes it cannot deliver and left only failing the connection.
void TcpConnection::queue_device_read_response(const LocalPieces &pieces, uint64_t key,
                                               size_t length) {
    std::vector<FramePtr> frames =
        device_chunks(wire::TcpOp::ReadResp, pieces.iov, pieces.mem, pieces.count, length);
    // The remote read is over, for the counter, when its last frame has left.
    if (pieces.application) {
        frames.back()->counts_remote_read = true;
        frames.back()->read_key = key;
    }
    for (auto &f : frames) queue_frame(std::move(f));
}

}  // namespace tandem

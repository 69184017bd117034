// RMA that the target's protocol serves (wire::RmaReq), for a domain whose link has keys of its
// own (a NIC's rkeys) but whose regions cannot be the NIC's: the application counts remote
// accesses (FI_RMA_EVENT), which a NIC does not report, or names its keys or offsets (mr_mode
// without FI_MR_PROV_KEY | FI_MR_VIRT_ADDR), which a NIC cannot honour (Domain::rma_served).
//
// The initiator exposes its buffers under the link's keys, as a rendezvous source, and sends
// the request. The target resolves the application's key through its MR table (bounds and
// access, as for the TCP link), moves the data with the NIC all the same (RDMA reads of the
// initiator's buffers for fi_write, RDMA writes into them for fi_read), counts the access and
// answers with a Fin. While it serves a connection's request, that connection's later
// messages wait (held_behind_served_), so that what follows an RMA, a message, an atomic or
// another RMA, finds it done, as when the NIC applies RMA in order.
#include "common/iov.h"
#include "common/log.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"
#include "main_prov/engine_wr.h"

#include <cstring>

namespace tandem {

struct Engine::ServedRma {
    LinkConnection *conn;  // null once the connection is gone: nobody to answer
    uint64_t msg_id;       // the initiator's operation
    uint64_t key;
    uint64_t access;  // FI_REMOTE_WRITE (an fi_write) or FI_REMOTE_READ
    uint64_t len;
    bool cq_data;
    uint64_t data;
    fi_addr_t src;
    int pending = 0;  // reads or writes at the link
    bool failed = false;
};

ssize_t Engine::issue_served_rma(TxOp *op, const RmaRequest &r, const hmem::MemRef *mem,
                                 bool stage) {
    const iovec *iov = r.local.iov;
    const size_t count = r.local.count;
    const size_t len = r.local.len;
    // The buffers the target reaches: the application's, or a host copy where device memory
    // is staged (and a small write's copy, which frees the application's buffer at once).
    int ret = 0;
    if (r.write) {
        ret = take_payload(op, iov, mem, count, len,
                           stage || (r.flags & FI_INJECT) || len <= inject_size_);
    } else {
        ret = take_payload(op, iov, mem, count, len, false);
        if (!ret && stage) {
            op->inject_copy.resize(len);
            op->stage_back = true;
        }
    }
    if (ret) {
        free_tx(op);
        return ret;
    }
    const uint64_t access = r.write ? FI_REMOTE_READ : FI_REMOTE_WRITE;
    const iovec staged{op->inject_copy.data(), len};
    ret = op->stage_back ? expose(op, &staged, nullptr, 1, access)
                         : expose(op, op->iov.data(), op->mem.empty() ? nullptr : op->mem.data(),
                                  op->iov.size(), access);
    if (ret) {
        free_tx(op);
        return ret;
    }
    op->served = true;
    op->await_remote = true;
    op->hdr.op = static_cast<uint8_t>(wire::ProtoOp::RmaReq);
    op->hdr.size = len;
    op->hdr.msg_id = op->id;
    if (r.write && (r.flags & FI_REMOTE_CQ_DATA)) {
        op->hdr.flags = wire::kProtoCqData;
        op->hdr.cq_data = r.data;
    }
    op->served_target = {r.addr, r.key, r.write ? 1u : 0u, 0};
    ++tx_outstanding_;
    submit(op);
    return 0;
}

bool Engine::serve_rma(LinkConnection *conn, const wire::ProtoHeader &hdr, const uint8_t *body,
                       size_t len) {
    wire::RmaReqBody req;
    if (len != sizeof req) return false;
    memcpy(&req, body, sizeof req);
    const wire::RtsBody &buf = req.buf;
    if (buf.iov_count > wire::kMaxRtsIov || req.target.write > 1) return false;
    uint64_t total = 0;
    for (uint32_t i = 0; i < buf.iov_count; ++i) {
        if (buf.iov[i].length > hdr.size - total) return false;
        total += buf.iov[i].length;
    }
    if (total != hdr.size) return false;

    const uint64_t access = req.target.write ? uint64_t(FI_REMOTE_WRITE) : uint64_t(FI_REMOTE_READ);
    LocalPieces mine;
    if (!(caps_ & FI_RMA) || !resolve(req.target.key, req.target.addr, hdr.size, access, mine)) {
        TANDEM_INFO(
            FI_LOG_EP_DATA, "served %s refused: key 0x%llx, [0x%llx, +%llu) not accessible\n",
            req.target.write ? "write" : "read", static_cast<unsigned long long>(req.target.key),
            static_cast<unsigned long long>(req.target.addr),
            static_cast<unsigned long long>(hdr.size));
        wire::FinBody fin{hdr.msg_id, uint32_t(wire::FinStatus::AccessDenied), 0};
        send_control(conn, wire::ProtoOp::Fin, &fin, sizeof fin, hdr.msg_id);
        return true;
    }
    auto *job = new ServedRma{conn,        hdr.msg_id,     req.target.key,
                              access,      hdr.size,       (hdr.flags & wire::kProtoCqData) != 0,
                              hdr.cq_data, source_of(conn)};
    served_.insert(job);
    // Walk their buffers and our pieces together: one read or write per overlap.
    iovec theirs[wire::kMaxRtsIov];
    for (uint32_t j = 0; j < buf.iov_count; ++j)
        theirs[j] = {reinterpret_cast<void *>(buf.iov[j].addr), buf.iov[j].length};
    iov_walk2(mine.iov, mine.count, theirs, buf.iov_count, hdr.size,
              [&](size_t i, uint8_t *at_mine, size_t j, uint8_t *at_theirs, size_t n) {
                  iovec local{at_mine, n};
                  RemoteRegion remote{reinterpret_cast<uint64_t>(at_theirs), buf.iov[j].key};
                  int ret = req.target.write ? conn->post_read(&local, &mine.mem[i], 1, remote,
                                                               wr_id(job, kWrServed))
                                             : conn->post_write(&local, &mine.mem[i], 1, remote,
                                                                nullptr, wr_id(job, kWrServed));
                  if (ret) {
                      job->failed = true;
                      return false;
                  }
                  ++job->pending;
                  return true;
              });
    if (job->pending == 0)
        finish_served(job);
    else
        held_behind_served_.try_emplace(conn);  // what the connection sends next waits
    return true;
}

void Engine::served_done(ServedRma *job, WcStatus status) {
    if (status != WcStatus::Success) job->failed = true;
    if (--job->pending == 0) finish_served(job);
}

void Engine::finish_served(ServedRma *job) {
    if (!job->failed) {
        remote_access_done(job->key, job->access);
        if (job->cq_data && job->access == FI_REMOTE_WRITE)
            write_rx_cq({nullptr, FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA, job->len, nullptr,
                         job->data, 0, job->src},
                        job->src);
    }
    LinkConnection *conn = job->conn;
    if (conn) {
        wire::FinBody fin{job->msg_id,
                          uint32_t(job->failed ? wire::FinStatus::ReadFailed : wire::FinStatus::Ok),
                          0};
        send_control(conn, wire::ProtoOp::Fin, &fin, sizeof fin, job->msg_id);
    }
    served_.erase(job);
    delete job;
    if (conn) resume_connection(conn);
}

bool Engine::hold_behind_served(LinkConnection *conn, const uint8_t *buf, size_t len) {
    if (held_behind_served_.empty()) return false;
    auto it = held_behind_served_.find(conn);
    if (it == held_behind_served_.end()) return false;
    it->second.emplace_back(buf, buf + len);
    return true;
}

// The connection's served request is done: what it sent meanwhile is handled now, in order,
// until another request makes the rest wait again.
void Engine::resume_connection(LinkConnection *conn) {
    auto it = held_behind_served_.find(conn);
    if (it == held_behind_served_.end()) return;
    std::deque<std::vector<uint8_t>> waiting = std::move(it->second);
    held_behind_served_.erase(it);
    while (!waiting.empty()) {
        auto again = held_behind_served_.find(conn);
        if (again != held_behind_served_.end()) {
            again->second.insert(again->second.begin(), std::make_move_iterator(waiting.begin()),
                                 std::make_move_iterator(waiting.end()));
            return;
        }
        std::vector<uint8_t> msg = std::move(waiting.front());
        waiting.pop_front();
        handle_message(conn, msg.data(), msg.size());
    }
}

void Engine::forget_served(LinkConnection *conn) {
    held_behind_served_.erase(conn);
    for (ServedRma *job : served_)
        if (job->conn == conn) job->conn = nullptr;
}

// At close, after the link flushed everything: the jobs left answer nobody.
void Engine::discard_served() {
    for (ServedRma *job : served_) delete job;
    served_.clear();
    held_behind_served_.clear();
}

}  // namespace tandem

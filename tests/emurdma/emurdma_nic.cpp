// The NIC of a context: one thread that serves the sockets of its connections (and rdma_cm's
// listeners) and executes work requests, as an RNIC would, asynchronously to the app.
//
// Who does the work: the NIC thread, and the app's data-path calls. ibv_poll_cq does a
// non-blocking pass (app_pass: read what the connections' sockets hold, execute it, answer, send
// what is queued), ibv_post_send transmits its requests itself (app_sent), posting a receive lets
// a message that waited for one go on (app_recv_posted). All of it under State::mu, as the NIC
// thread's passes, so one pass runs at a time and nothing is done twice (what one pass read is
// gone from the socket for the next). While the app polls, the NIC thread leaves the connections
// to it (it would only take a CPU from the polling threads for work already done) and comes back
// when the app has been quiet for kAppActive, or is about to sleep in a blocking call; it always
// keeps the listeners, the wake-up and the timers.
//
// Requester: a QP's send queue is transmitted in posting order (the data gathered from the MRs at
// that moment, inline data from the copy made at post time); each request gets exactly one
// response (ACK, READ response or NAK) and the responses come back in request order, so the
// oldest transmitted work request is always the one a response completes. Completions are made
// from the head of the queue only, which keeps them in order whatever fails where.
// Responder: requests are executed strictly in arrival order. One that needs a receive WQE and
// finds none waits at the head (RNR) with everything behind it, until a receive is posted or the
// requester's RNR retries have run out; the latter is decided here, where the receive would be
// posted, so a message is never both delivered and failed.
// A large READ response goes out of the responder's MR as the socket takes it, and lands in the
// requester's memory part by part as it arrives, as a NIC's DMA would: the emulator never holds
// a whole one (CmId::tx_from_mr, CmId::rx_resp).
#include "tests/emurdma/emurdma.h"

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace emurdma {

namespace {

// IB's min_rnr_timer encoding, in microseconds.
constexpr std::uint32_t kRnrTimerUs[32] = {
    655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
    480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

constexpr std::size_t kReadChunk = 64 * 1024;
constexpr std::size_t kReadBudget = 4 * 1024 * 1024;  // per pass, so one peer cannot starve others
// READ responses from this size on are sent from the responder's MR (CmId::tx_from_mr); smaller
// ones are copied, which costs less than keeping track of them.
constexpr std::size_t kSendFromMrMin = 64 * 1024;

struct Span {
    std::uint8_t *p;
    std::size_t n;
};

// The memory behind the first `len` bytes of a scatter/gather list: each entry used must lie in an
// MR of pd with the access asked for. LOC_LEN_ERR when the list holds fewer than len bytes.
ibv_wc_status map_sges(Pd *pd, const std::vector<ibv_sge> &sges, std::uint64_t len, int need,
                       std::vector<Span> &out) {
    out.clear();
    std::uint64_t left = len;
    for (const ibv_sge &g : sges) {
        if (left == 0) break;
        std::uint64_t n = std::min<std::uint64_t>(g.length, left);
        if (n == 0) continue;
        Mr *mr = find_mr(pd, g.lkey);
        if (!mr || (mr->access & need) != need) return IBV_WC_LOC_PROT_ERR;
        std::uint8_t *p = mr_span(mr, g.addr, n);
        if (!p) return IBV_WC_LOC_PROT_ERR;
        out.push_back({p, static_cast<std::size_t>(n)});
        left -= n;
    }
    return left ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
}

// The remote side of a WRITE or READ: key known in the QP's PD, range inside, access granted.
std::uint8_t *resolve_rkey(Qp *qp, std::uint32_t rkey, std::uint64_t addr, std::uint64_t len,
                           int need, Mr **mr = nullptr) {
    auto &m = S().rkeys;
    auto it = m.find(rkey);
    if (it == m.end() || it->second->pd != qp->pd || !(it->second->access & need)) return nullptr;
    if (mr) *mr = it->second;
    return mr_span(it->second, addr, len);
}

void append(CmId *id, const void *p, std::size_t n) {
    auto *b = static_cast<const std::uint8_t *>(p);
    id->tx.insert(id->tx.end(), b, b + n);
}

void respond(CmId *id, FrameType type, std::uint8_t code = 0) {
    Hdr h{};
    h.type = type;
    h.code = code;
    send_frame(id, h, nullptr, 0);
}

void recv_cqe(Qp *qp, std::uint64_t wr_id, ibv_wc_status st, ibv_wc_opcode op, std::uint32_t len,
              const Hdr *imm_from) {
    ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = wr_id;
    wc.status = st;
    wc.opcode = op;
    wc.byte_len = len;
    wc.qp_num = qp->pub.qp_num;
    wc.src_qp = qp->peer_qpn;
    if (imm_from && (imm_from->code & kHasImm)) {
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = imm_from->imm;
    }
    push_cqe(qp->rcq, wc);
}

std::deque<RecvWqe> &recv_queue(Qp *qp) {
    return qp->srq ? qp->srq->q : qp->rq;
}

// Completes the head of the send queue while it is done, in order.
void reap(Qp *qp) {
    State &s = S();
    while (!qp->sq.empty() && qp->sq.front().st == SendWqe::kDone) {
        SendWqe w = std::move(qp->sq.front());
        qp->sq.pop_front();
        qp->next_tx--;
        if (w.signaled || w.status != IBV_WC_SUCCESS) {
            ibv_wc wc;
            memset(&wc, 0, sizeof(wc));
            wc.wr_id = w.wr_id;
            wc.status = w.status;
            wc.opcode = wc_opcode(w.op);
            wc.byte_len = static_cast<std::uint32_t>(w.len);
            wc.qp_num = qp->pub.qp_num;
            wc.src_qp = qp->peer_qpn;
            push_cqe(qp->scq, wc);
            if (w.status == IBV_WC_REM_ACCESS_ERR) s.stats.remote_access_errors++;
        }
        if (w.status != IBV_WC_SUCCESS) {
            qp_to_error(qp, true);
            return;
        }
        if (w.fault) {
            inject_error(qp);
            return;
        }
    }
}

// Transmits what the send queue holds beyond what went out already.
void tx_pump(Qp *qp) {
    State &s = S();
    CmId *id = qp->id;
    if (!id || id->sock < 0 || qp->pub.state != IBV_QPS_RTS) return;
    std::vector<Span> spans;
    while (qp->next_tx < qp->sq.size()) {
        SendWqe &w = qp->sq[qp->next_tx];
        qp->next_tx++;
        ibv_wc_status fail = IBV_WC_SUCCESS;
        if (!s.port_up || qp->peer_gone || id->ctx->dead) {
            fail = IBV_WC_RETRY_EXC_ERR;  // nobody answers: the transport retries run out
        } else if (w.op == IBV_WR_RDMA_READ) {
            fail = map_sges(qp->pd, w.sge, w.len, IBV_ACCESS_LOCAL_WRITE, spans);
            if (fail == IBV_WC_SUCCESS) {
                Hdr h{};
                h.type = kRead;
                h.raddr = w.raddr;
                h.rkey = w.rkey;
                h.rlen = static_cast<std::uint32_t>(w.len);
                send_frame(id, h, nullptr, 0);
                s.stats.reads++;
            }
        } else {
            if (!w.inl) fail = map_sges(qp->pd, w.sge, w.len, 0, spans);
            if (fail == IBV_WC_SUCCESS) {
                bool send = w.op == IBV_WR_SEND || w.op == IBV_WR_SEND_WITH_IMM;
                Hdr h{};
                h.type = send ? kSend : kWrite;
                if (w.op == IBV_WR_SEND_WITH_IMM || w.op == IBV_WR_RDMA_WRITE_WITH_IMM) {
                    h.code = kHasImm;
                    h.imm = w.imm;
                }
                h.raddr = w.raddr;
                h.rkey = w.rkey;
                h.len = w.len;
                append(id, &h, sizeof(h));
                if (w.inl) {
                    append(id, w.data.data(), w.data.size());
                } else {
                    for (const Span &sp : spans) append(id, sp.p, sp.n);
                }
                (send ? s.stats.sends : s.stats.writes)++;
            }
        }
        if (fail != IBV_WC_SUCCESS) {
            // Completes with its error once what went out before it has; nothing after it goes.
            w.st = SendWqe::kDone;
            w.status = fail;
            break;
        }
        w.st = SendWqe::kSent;
    }
    reap(qp);
}

// Executes one request of the peer (its header and h.len bytes of payload). False: it needs a
// receive WQE and none is posted (RNR); nothing happened then.
bool execute_request(CmId *id, const Hdr &h, const std::uint8_t *data) {
    Qp *qp = id->qp;
    std::vector<Span> spans;
    switch (h.type) {
        case kSend: {
            auto &rq = recv_queue(qp);
            if (rq.empty()) return false;
            RecvWqe r = std::move(rq.front());
            rq.pop_front();
            ibv_wc_status st = map_sges(qp->pd, r.sge, h.len, IBV_ACCESS_LOCAL_WRITE, spans);
            if (st != IBV_WC_SUCCESS) {
                // Too small a buffer: the requester sees an invalid request; a bad receive
                // buffer: a remote operational error. The responder's QP fails either way.
                recv_cqe(qp, r.wr_id, st, IBV_WC_RECV, 0, nullptr);
                respond(id, kNak, st == IBV_WC_LOC_LEN_ERR ? kNakInvReq : kNakRemOp);
                qp_to_error(qp, true);
                return true;
            }
            std::size_t off = 0;
            for (const Span &sp : spans) {
                memcpy(sp.p, data + off, sp.n);
                off += sp.n;
            }
            recv_cqe(qp, r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, static_cast<std::uint32_t>(h.len),
                     &h);
            respond(id, kAck);
            return true;
        }
        case kWrite: {
            bool imm = h.code & kHasImm;
            auto &rq = recv_queue(qp);
            if (imm && rq.empty()) return false;
            std::uint64_t len = h.len;
            if (len > 0) {
                std::uint8_t *p = resolve_rkey(qp, h.rkey, h.raddr, len, IBV_ACCESS_REMOTE_WRITE);
                if (!p) {
                    respond(id, kNak, kNakAccess);
                    qp_to_error(qp, true);
                    return true;
                }
                memcpy(p, data, len);
            }
            if (imm) {
                RecvWqe r = std::move(rq.front());
                rq.pop_front();
                recv_cqe(qp, r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
                         static_cast<std::uint32_t>(len), &h);
            }
            respond(id, kAck);
            return true;
        }
        case kRead: {
            std::uint64_t len = h.rlen;
            const std::uint8_t *p = nullptr;
            Mr *mr = nullptr;
            if (len > 0) {
                p = resolve_rkey(qp, h.rkey, h.raddr, len, IBV_ACCESS_REMOTE_READ, &mr);
                if (!p) {
                    respond(id, kNak, kNakAccess);
                    qp_to_error(qp, true);
                    return true;
                }
            }
            S().stats.read_responses++;
            Hdr rh{};
            rh.type = kReadResp;
            if (len < kSendFromMrMin) {
                send_frame(id, rh, p, len);
            } else if (id->sock >= 0) {
                rh.len = len;
                append(id, &rh, sizeof(rh));
                id->tx_from_mr.push_back({id->tx.size(), mr, p, static_cast<std::size_t>(len)});
            }
            return true;
        }
        default:
            return true;
    }
}

void drain_requests(CmId *id) {
    while (!id->rx_reqs.empty()) {
        Qp *qp = id->qp;
        if (!qp || qp->pub.state == IBV_QPS_ERR) {
            id->rx_reqs.clear();
            id->rnr_armed = false;
            return;
        }
        Frame f = std::move(id->rx_reqs.front());
        id->rx_reqs.pop_front();
        if (execute_request(id, f.h, f.data.data())) {
            id->rnr_armed = false;
            continue;
        }
        id->rx_reqs.push_front(std::move(f));
        auto now = Clock::now();
        if (!id->rnr_armed) {
            id->rnr_armed = true;
            S().stats.rnr_waits++;
            // rnr_retry 7 retries for ever; otherwise the requester gives up after its retries,
            // each one the responder's min_rnr_timer later.
            id->rnr_deadline = qp->peer_rnr_retry >= 7
                                   ? Clock::time_point::max()
                                   : now + std::chrono::microseconds(
                                               std::uint64_t{kRnrTimerUs[qp->min_rnr_timer & 31]} *
                                               (qp->peer_rnr_retry + 1U));
        } else if (now >= id->rnr_deadline) {
            respond(id, kNak, kNakRnr);
            // The requester's QP fails: what it sent after this message is never executed.
            id->rx_reqs.clear();
            id->rx_drop = true;
            id->rnr_armed = false;
        }
        return;
    }
}

// The work request a response answers: the oldest transmitted one not answered yet.
SendWqe *answered_wqe(Qp *qp) {
    for (std::size_t i = 0; i < qp->next_tx; ++i)
        if (qp->sq[i].st == SendWqe::kSent) return &qp->sq[i];
    return nullptr;
}

// Bytes [at, at + n) of the payload of a READ response (h.len in all) into the memory of w, the
// READ it answers. Its MRs are looked up again for each part, as one may have gone since the
// request went out or since the last part: a part that cannot be placed fails the READ, and the
// parts after it are dropped.
void place_read_part(Qp *qp, SendWqe *w, const Hdr &h, std::uint64_t at, const std::uint8_t *p,
                     std::size_t n) {
    if (!w || w->status != IBV_WC_SUCCESS) return;
    std::vector<Span> spans;
    w->status = map_sges(qp->pd, w->sge, h.len, IBV_ACCESS_LOCAL_WRITE, spans);
    if (w->status == IBV_WC_LOC_LEN_ERR) w->status = IBV_WC_BAD_RESP_ERR;
    if (w->status != IBV_WC_SUCCESS) return;
    std::uint64_t span_at = 0;  // where in the payload the span starts
    for (const Span &sp : spans) {
        if (n == 0) break;
        if (at < span_at + sp.n) {
            std::size_t k =
                static_cast<std::size_t>(std::min<std::uint64_t>(span_at + sp.n - at, n));
            memcpy(sp.p + (at - span_at), p, k);
            p += k;
            at += k;
            n -= k;
        }
        span_at += sp.n;
    }
}

// payload: the whole of the response's; nullptr for a READ response read_sock placed as it came.
void on_response(CmId *id, const Hdr &h, const std::uint8_t *payload) {
    Qp *qp = id->qp;
    if (!qp || qp->pub.state == IBV_QPS_ERR) return;
    SendWqe *w = answered_wqe(qp);
    if (!w) return;
    if (h.type == kReadResp && payload) place_read_part(qp, w, h, 0, payload, h.len);
    w->st = SendWqe::kDone;
    switch (h.type) {
        case kAck:
            w->status = IBV_WC_SUCCESS;
            break;
        case kReadResp:
            break;  // its status is what placing its payload made it
        default:
            switch (h.code) {
                case kNakAccess:
                    w->status = IBV_WC_REM_ACCESS_ERR;
                    break;
                case kNakRnr:
                    w->status = IBV_WC_RNR_RETRY_EXC_ERR;
                    break;
                case kNakInvReq:
                    w->status = IBV_WC_REM_INV_REQ_ERR;
                    break;
                default:
                    w->status = IBV_WC_REM_OP_ERR;
                    break;
            }
            break;
    }
    reap(qp);
}

// The peer's QP failed: our oldest unanswered request times out (its retries run out), which
// fails our QP; with nothing outstanding, the next request will.
void on_peer_qp_error(CmId *id) {
    Qp *qp = id->qp;
    id->rx_reqs.clear();
    id->rnr_armed = false;
    if (!qp || qp->pub.state == IBV_QPS_ERR) return;
    for (std::size_t i = 0; i < qp->sq.size(); ++i) {
        SendWqe &w = qp->sq[i];
        if (w.st != SendWqe::kDone) {
            w.st = SendWqe::kDone;
            w.status = IBV_WC_RETRY_EXC_ERR;
            qp->next_tx = std::max(qp->next_tx, i + 1);
            reap(qp);
            return;
        }
    }
    qp->peer_gone = true;
}

void dispatch(CmId *id, const Hdr &h, const std::uint8_t *p) {
    switch (h.type) {
        case kSend:
        case kWrite:
        case kRead:
            if (id->rx_drop || !id->qp || id->qp->pub.state == IBV_QPS_ERR) return;
            // In order: at once when nothing waits before it (no copy), else behind the others.
            if (id->rx_reqs.empty() && execute_request(id, h, p)) return;
            id->rx_reqs.push_back(Frame{h, std::vector<std::uint8_t>(p, p + h.len)});
            return;
        case kAck:
        case kReadResp:
        case kNak:
            on_response(id, h, p);
            return;
        case kQpErr:
            on_peer_qp_error(id);
            return;
        default:
            cm_on_frame(id, h, p);
    }
}

void flush_tx(CmId *id) {
    while (id->sock >= 0 && tx_pending(id)) {
        // tx up to the next payload sent from an MR, then that payload.
        bool from_mr = !id->tx_from_mr.empty() && id->tx_from_mr.front().at == id->tx_off;
        const std::uint8_t *p = id->tx.data() + id->tx_off;
        std::size_t len =
            (id->tx_from_mr.empty() ? id->tx.size() : id->tx_from_mr.front().at) - id->tx_off;
        if (from_mr) {
            p = id->tx_from_mr.front().p;
            len = id->tx_from_mr.front().len;
        }
        ssize_t n = send(id->sock, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            if (!from_mr) {
                id->tx_off += static_cast<std::size_t>(n);
                continue;
            }
            CmId::TxFromMr &r = id->tx_from_mr.front();
            r.p += n;
            r.len -= static_cast<std::size_t>(n);
            if (r.len == 0) id->tx_from_mr.pop_front();
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        // The peer is gone: nothing more goes out; reading reports its end.
        tx_clear(id);
        return;
    }
    if (!tx_pending(id)) {
        id->tx.clear();
        id->tx_off = 0;
    } else if (id->tx_off > (1U << 20) && id->tx_off >= id->tx.size() / 2) {
        // Only once half of it went, so the move costs at most what was sent.
        id->tx.erase(id->tx.begin(), id->tx.begin() + static_cast<std::ptrdiff_t>(id->tx_off));
        for (CmId::TxFromMr &r : id->tx_from_mr) r.at -= id->tx_off;
        id->tx_off = 0;
    }
}

void read_sock(CmId *id) {
    bool eof = false;
    std::size_t total = 0;
    while (total < kReadBudget) {
        std::uint8_t *room = id->rx.room(kReadChunk);
        ssize_t n = recv(id->sock, room, kReadChunk, MSG_DONTWAIT);
        if (n > 0) {
            id->rx.len += static_cast<std::size_t>(n);
            total += static_cast<std::size_t>(n);
            // A short read emptied the socket: another would only say EAGAIN (what came since,
            // or the end, makes it readable again for the next pass).
            if (static_cast<std::size_t>(n) < kReadChunk) break;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        eof = true;  // closed, or reset (ECONNRESET): the peer is gone either way
        break;
    }
    // Handlers may close the socket (and clear rx): parse from a buffer of our own.
    ByteBuf buf = std::move(id->rx);
    std::size_t off = 0;
    while (id->sock >= 0) {
        if (id->rx_resp_left) {
            // More of a READ response's payload: into the READ's memory.
            auto n =
                static_cast<std::size_t>(std::min<std::uint64_t>(buf.len - off, id->rx_resp_left));
            if (n == 0) break;
            if (id->qp && id->qp->pub.state != IBV_QPS_ERR)
                place_read_part(id->qp, answered_wqe(id->qp), id->rx_resp, id->rx_resp_at,
                                buf.p.get() + off, n);
            off += n;
            id->rx_resp_at += n;
            id->rx_resp_left -= n;
            if (id->rx_resp_left == 0) on_response(id, id->rx_resp, nullptr);
            continue;
        }
        if (buf.len - off < sizeof(Hdr)) break;
        Hdr h;
        memcpy(&h, buf.p.get() + off, sizeof(h));
        if (buf.len - off - sizeof(h) < h.len) {
            if (h.type != kReadResp) break;
            // A READ response not all here: its payload is placed part by part as it comes.
            id->rx_resp = h;
            id->rx_resp_at = 0;
            id->rx_resp_left = h.len;
            off += sizeof(h);
            continue;
        }
        dispatch(id, h, buf.p.get() + off + sizeof(h));
        off += sizeof(h) + h.len;
    }
    if (id->sock < 0) return;
    if (eof) {
        cm_on_eof(id);
        return;
    }
    buf.drop_front(off);
    id->rx = std::move(buf);
}

// The work of one connection that needs no reading: responder work (a receive may have been
// posted), requester work (new work requests), then whatever can be written.
void serve_id(CmId *id) {
    if (id->qp) {
        drain_requests(id);
        if (id->qp) tx_pump(id->qp);
    }
    if (id->sock >= 0) {
        flush_tx(id);
        if (id->close_after_flush && !tx_pending(id)) close_sock(id);
    }
}

// One pass over the connections, without reading.
void progress(Context *ctx) {
    std::vector<std::uint64_t> serials;
    serials.reserve(ctx->ids.size());
    for (auto &[serial, id] : ctx->ids) serials.push_back(serial);
    for (std::uint64_t serial : serials) {
        auto it = ctx->ids.find(serial);
        if (it != ctx->ids.end()) serve_id(it->second);
    }
}

// Reads the connections' sockets that have something (data, or their end).
void read_ready(Context *ctx) {
    epoll_event evs[64];
    int n = epoll_wait(ctx->ep, evs, 64, 0);
    for (int i = 0; i < n; ++i) {
        auto it = ctx->ids.find(evs[i].data.u64);
        if (it == ctx->ids.end()) continue;  // closed by a handler of this pass
        if (it->second->sock >= 0) read_sock(it->second);
    }
}

void free_graveyard() {
    State &s = S();
    for (CmId *dead : s.graveyard) delete dead;
    s.graveyard.clear();
}

// The TX backlog of a connection goes out when the socket has room: on the NIC's next pass, or
// on the app's while the NIC leaves the sockets to it.
void need_flush(CmId *id) {
    if (id->sock >= 0 && tx_pending(id) && !id->ctx->nic_backoff) wake(id->ctx);
}

// How long a pass of the app keeps the NIC thread off the connections: its next ibv_poll_cq is
// expected sooner. Shorter when the CQ is armed: the app may be about to sleep on the
// completion channel (whose event the NIC then makes at most this late).
constexpr auto kAppActive = std::chrono::microseconds(1000);
constexpr auto kAppActiveArmed = std::chrono::microseconds(100);

}  // namespace

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
    switch (op) {
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            return IBV_WC_RDMA_WRITE;
        case IBV_WR_RDMA_READ:
            return IBV_WC_RDMA_READ;
        default:
            return IBV_WC_SEND;
    }
}

void flush_cqe(Qp *qp, Cq *cq, std::uint64_t wr_id, ibv_wc_opcode op) {
    ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = op;
    wc.qp_num = qp->pub.qp_num;
    wc.src_qp = qp->peer_qpn;
    push_cqe(cq, wc);
    S().stats.flushes++;
}

void wake(Context *ctx) {
    if (!ctx || ctx->wake_pending) return;
    ctx->wake_pending = true;
    std::uint64_t one = 1;
    if (write(ctx->wake_fd, &one, sizeof(one)) < 0) {
        // Cannot fail short of a broken fd: the NIC looks at everything on its next pass anyway.
    }
}

bool tx_pending(const CmId *id) {
    return id->tx_off < id->tx.size() || !id->tx_from_mr.empty();
}

void tx_clear(CmId *id) {
    id->tx.clear();
    id->tx_off = 0;
    id->tx_from_mr.clear();
}

void tx_copy_from_mr(Mr *mr) {
    for (Context *ctx : S().contexts) {
        for (auto &[serial, id] : ctx->ids) {
            auto &refs = id->tx_from_mr;
            for (std::size_t i = 0; i < refs.size();) {
                if (refs[i].mr != mr) {
                    ++i;
                    continue;
                }
                // What the NIC has not read of the MR yet, read now: it goes into tx where the
                // payload was to go out, and the payloads after it move along.
                CmId::TxFromMr r = refs[i];
                id->tx.insert(id->tx.begin() + static_cast<std::ptrdiff_t>(r.at), r.p, r.p + r.len);
                refs.erase(refs.begin() + static_cast<std::ptrdiff_t>(i));
                for (std::size_t j = i; j < refs.size(); ++j) refs[j].at += r.len;
            }
        }
    }
}

void send_frame(CmId *id, const Hdr &h, const void *payload, std::size_t len) {
    if (id->sock < 0) return;
    Hdr hh = h;
    hh.len = len;
    append(id, &hh, sizeof(hh));
    if (len) append(id, payload, len);
}

void qp_to_error(Qp *qp, bool notify_peer) {
    if (qp->pub.state == IBV_QPS_ERR) return;
    qp->pub.state = IBV_QPS_ERR;
    for (SendWqe &w : qp->sq) flush_cqe(qp, qp->scq, w.wr_id, wc_opcode(w.op));
    qp->sq.clear();
    qp->next_tx = 0;
    // The QP's own receives flush; an SRQ's belong to the SRQ and stay.
    for (RecvWqe &r : qp->rq) flush_cqe(qp, qp->rcq, r.wr_id, IBV_WC_RECV);
    qp->rq.clear();
    CmId *id = qp->id;
    if (!id) return;
    id->rx_reqs.clear();
    id->rnr_armed = false;
    if (notify_peer && id->sock >= 0 &&
        (id->state == CmState::kEstablished || id->state == CmState::kAccepted)) {
        Hdr h{};
        h.type = kQpErr;
        send_frame(id, h, nullptr, 0);
        wake(id->ctx);
    }
}

void inject_error(Qp *qp) {
    qp_to_error(qp, true);
    CmId *id = qp->id;
    if (id && id->sock >= 0 &&
        (id->state == CmState::kEstablished || id->state == CmState::kAccepted)) {
        // As if the device gave the connection up: both sides see it disconnected.
        Hdr h{};
        h.type = kCmDreq;
        send_frame(id, h, nullptr, 0);
        id->state = CmState::kDisconnecting;
        wake(id->ctx);
    }
}

void close_sock(CmId *id) {
    if (id->sock < 0) return;
    flush_tx(id);  // what fits goes (a last REJ or DREP): the peer reads it before the end
    // The NIC's poll() may hold the socket open past close(): shut it down first, so the peer
    // sees the end now, and wake the NIC so that it lets go.
    shutdown(id->sock, SHUT_RDWR);
    if (id->in_ep) epoll_ctl(id->ctx->ep, EPOLL_CTL_DEL, id->sock, nullptr);
    id->in_ep = false;
    close(id->sock);
    wake(id->ctx);
    id->sock = -1;
    tx_clear(id);
    id->rx = ByteBuf{};
    id->rx_resp_left = 0;
    id->rx_reqs.clear();
    id->rnr_armed = false;
    if (id->listen_fd < 0 && id->ctx) id->ctx->ids.erase(id->serial);
}

void cm_serve(CmId *id) {
    id->ctx->ids[id->serial] = id;
    if (id->sock >= 0 && !id->in_ep && !id->reads_held) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = id->serial;
        id->in_ep = epoll_ctl(id->ctx->ep, EPOLL_CTL_ADD, id->sock, &ev) == 0;
    }
    wake(id->ctx);
}

void hold_reads(CmId *id, bool hold) {
    id->reads_held = hold;
    if (hold && id->in_ep) {
        epoll_ctl(id->ctx->ep, EPOLL_CTL_DEL, id->sock, nullptr);
        id->in_ep = false;
    } else if (!hold) {
        cm_serve(id);  // back in the epoll set: what waited is read on the next pass
    }
}

void app_pass(Context *ctx, bool armed) {
    ctx->app_until = Clock::now() + (armed ? kAppActiveArmed : kAppActive);
    read_ready(ctx);
    progress(ctx);
    free_graveyard();
}

void app_sent(Qp *qp) {
    CmId *id = qp->id;
    if (!id || !id->ctx) return;
    if (id->sock < 0 || qp->pub.state != IBV_QPS_RTS) {
        wake(id->ctx);  // not connected yet (or any more): the NIC sees to them in time
        return;
    }
    // Transmitted from here, after whatever is queued on the socket already (in order).
    tx_pump(qp);
    flush_tx(id);
    need_flush(id);
}

void app_recv_posted(Qp *qp) {
    CmId *id = qp->id;
    if (!id || !id->ctx || id->rx_reqs.empty()) return;
    // A message waited for a receive (RNR): it goes on now, answered from here.
    drain_requests(id);
    flush_tx(id);
    need_flush(id);
}

void app_srq_posted(Srq *srq) {
    Context *ctx = srq->pd->ctx;
    std::vector<CmId *> waiting;
    for (auto &[serial, id] : ctx->ids)
        if (id->qp && id->qp->srq == srq && !id->rx_reqs.empty()) waiting.push_back(id);
    for (CmId *id : waiting) app_recv_posted(id->qp);  // none of them closes a socket
}

void app_blocks() {
    for (Context *c : S().contexts) {
        c->app_until = Clock::time_point{};
        if (c->nic_backoff) wake(c);
    }
}

// The NIC thread: passes over its connections whenever one of its sockets is ready, it is woken
// or a timer runs out (an RNR wait). While the app drives it (app_pass), it watches only what
// the app's calls do not serve (the wake-up and the listeners) until the app has been quiet for a
// moment (app_until), then takes the connections over again.
void nic_main(Context *ctx) {
    State &s = S();
    std::unique_lock lk(s.mu);
    std::vector<pollfd> pfds;
    std::vector<std::uint64_t> serials;
    while (!ctx->stop) {
        progress(ctx);
        free_graveyard();

        auto now = Clock::now();
        bool backoff = now < ctx->app_until;
        ctx->nic_backoff = backoff;
        pfds.clear();
        serials.clear();
        pfds.push_back({ctx->wake_fd, POLLIN, 0});
        serials.push_back(0);
        if (!backoff) {
            pfds.push_back({ctx->ep, POLLIN, 0});
            serials.push_back(0);
        }
        auto deadline = backoff ? ctx->app_until : Clock::time_point::max();
        for (auto &[serial, id] : ctx->ids) {
            if (id->listen_fd >= 0) {
                pfds.push_back({id->listen_fd, POLLIN, 0});
                serials.push_back(serial);
            }
            if (!backoff && id->sock >= 0 && tx_pending(id)) {
                pfds.push_back({id->sock, POLLOUT, 0});
                serials.push_back(serial);
            }
            if (id->rnr_armed) deadline = std::min(deadline, id->rnr_deadline);
        }
        timespec ts{};
        timespec *timeout = nullptr;
        if (deadline != Clock::time_point::max()) {
            auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
            ns = std::clamp<long long>(ns, 0, 1'000'000'000LL);
            ts.tv_sec = static_cast<time_t>(ns / 1'000'000'000LL);
            ts.tv_nsec = static_cast<long>(ns % 1'000'000'000LL);
            timeout = &ts;
        }
        lk.unlock();
        ppoll(pfds.data(), pfds.size(), timeout, nullptr);
        lk.lock();
        if (ctx->stop) break;
        ctx->nic_backoff = false;
        if (pfds[0].revents & POLLIN) {
            std::uint64_t v;
            if (read(ctx->wake_fd, &v, sizeof(v)) < 0) {
            }
            ctx->wake_pending = false;
        }
        std::size_t first = 1;
        if (!backoff) {
            first = 2;
            if (pfds[1].revents) read_ready(ctx);
        }
        for (std::size_t i = first; i < pfds.size(); ++i) {
            if (!pfds[i].revents) continue;
            auto it = ctx->ids.find(serials[i]);
            if (it == ctx->ids.end()) continue;  // destroyed while we polled
            CmId *id = it->second;
            if (pfds[i].fd == id->listen_fd) {
                cm_on_accept(id);
            } else if (pfds[i].fd == id->sock) {
                flush_tx(id);  // its end (POLLHUP) is read from the epoll set
            }
        }
    }
}

}  // namespace emurdma

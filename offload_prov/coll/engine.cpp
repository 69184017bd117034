#include "offload_prov/coll/engine.h"

#include "common/log.h"
#include "hmem/atomic.h"
#include "offload_prov/config.h"
#include "peer/peer_abi.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstring>

namespace tandem::off::coll {

namespace {

constexpr uint32_t kTransferMagic = 0x636f6c6c;  // "coll"
// The join's exchange runs under this operation number of the join's own tag group.
constexpr uint16_t kJoinSeq = 0xffff;

// A well-mixed 32-bit group id from a key and a join number (both ends compute the same).
uint32_t group_id(uint64_t key, uint64_t salt) {
    uint64_t z = key + 0x9e3779b97f4a7c15ull * (salt + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return uint32_t(z ^ (z >> 32));
}

// What one rank's call reads and writes, in bytes (fi_collective(3) and schedule.h's Args).
struct IoBytes {
    size_t send, recv;
};
IoBytes io_bytes(const Args &a, uint32_t n, bool root) {
    const size_t b = a.bytes();
    switch (a.coll) {
        case FI_BARRIER:
            return {0, 0};
        case FI_BROADCAST:
            return {0, b};
        case FI_ALLREDUCE:
            return {b, b};
        case FI_ALLGATHER:
            return {b, b * n};
        case FI_ALLTOALL:
            return {b * n, b * n};
        case FI_REDUCE_SCATTER:
            return {b * n, b};
        case FI_REDUCE:
            return {b, root ? b : 0};
        case FI_SCATTER:
            return {root ? b * n : 0, b};
        case FI_GATHER:
            return {b, root ? b * n : 0};
    }
    return {0, 0};
}

}  // namespace

Engine::~Engine() {
    // The owner closes this endpoint's groups first (its fi_close refuses while one is open);
    // transfers still posted go with the owner's endpoint.
    for (Running &r : running_)
        if (r.op && r.op->in_flight())
            TANDEM_INFO(FI_LOG_EP_DATA, "collective abandoned with %zu transfers in flight\n",
                        r.op->in_flight());
}

bool Engine::owns(const void *context) {
    uint32_t magic;
    memcpy(&magic, context, sizeof magic);
    return magic == kTransferMagic;
}

// ------------------------------------------------------------------------------------------
// Transfers

int Engine::send(uint32_t peer, uint64_t tag, const void *buf, size_t len, Operation *) {
    auto *t = new Transfer{kTransferMagic, Transfer::Kind::Data, false, peer, current_};
    iovec iov{const_cast<void *>(buf), len};
    fi_msg_tagged msg{&iov, nullptr, 1, current_->group->members[peer], tag, 0, t, 0};
    ssize_t ret = fi_tsendmsg(owner_, &msg, FI_PEER_TRANSFER);
    if (ret) delete t;
    return int(ret);
}

int Engine::recv(uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *) {
    auto *t = new Transfer{kTransferMagic, Transfer::Kind::Data, true, peer, current_};
    iovec iov{buf, len};
    fi_msg_tagged msg{&iov, nullptr, 1, current_->group->members[peer], tag, 0, t, 0};
    ssize_t ret = fi_trecvmsg(owner_, &msg, FI_PEER_TRANSFER);
    if (ret) {
        delete t;
        return int(ret);
    }
    current_->recvs.insert(t);
    return 0;
}

void Engine::transfer_done(void *context, int err) {
    auto *t = static_cast<Transfer *>(context);
    switch (t->kind) {
        case Transfer::Kind::Data:
            if (t->recv) t->run->recvs.erase(t);
            t->run->last_event = std::chrono::steady_clock::now();
            t->run->op->transfer_done(err);
            break;
        case Transfer::Kind::Notice:
            // A probe we sent: undeliverable means the member is gone.
            if (t->run) {
                --t->run->probes;
                if (err && t->run->op) {
                    TANDEM_INFO(FI_LOG_EP_DATA,
                                "collective: member %u of group %#x unreachable (%s)\n", t->peer,
                                t->run->group->id, fi_strerror(err));
                    t->run->op->fail(FI_ECONNRESET);
                }
            }
            break;
        case Transfer::Kind::NoticeReceive: {
            Group *g = t->group;
            g->notice_rx = nullptr;
            if (g->left) {
                drop_group(g);
            } else {
                if (!err) notice_arrived(*g, t->notice);
                repost_notices_ = true;
            }
            break;
        }
    }
    delete t;
}

// ------------------------------------------------------------------------------------------
// Notices

void Engine::post_notice_receive(Group &g) {
    auto *t = new Transfer{kTransferMagic, Transfer::Kind::NoticeReceive, true, 0, nullptr, &g};
    iovec iov{&t->notice, sizeof t->notice};
    fi_msg_tagged msg{&iov, nullptr, 1, FI_ADDR_UNSPEC, wire::coll_notice_tag(g.id), 0, t, 0};
    if (fi_trecvmsg(owner_, &msg, FI_PEER_TRANSFER)) {
        delete t;  // (-FI_EAGAIN: again at the next pass)
        repost_notices_ = true;
        return;
    }
    g.notice_rx = t;
}

void Engine::send_notice(Group &g, uint32_t peer, const wire::CollNotice &n, Running *run) {
    auto *t = new Transfer{kTransferMagic, Transfer::Kind::Notice, false, peer, run};
    t->notice = n;
    iovec iov{&t->notice, sizeof t->notice};
    fi_msg_tagged msg{&iov, nullptr, 1, g.members[peer], wire::coll_notice_tag(g.id), 0, t, 0};
    ssize_t ret = fi_tsendmsg(owner_, &msg, FI_PEER_TRANSFER);
    if (ret) {
        TANDEM_INFO(FI_LOG_EP_DATA, "collective: notice to member %u not sent: %s\n", peer,
                    fi_strerror(int(-ret)));
        delete t;
        return;
    }
    if (run) ++run->probes;
}

void Engine::notice_arrived(Group &g, const wire::CollNotice &n) {
    if (n.magic != wire::kCollNoticeMagic) {
        TANDEM_WARN(FI_LOG_EP_DATA, "collective: dropping a malformed notice\n");
        return;
    }
    if (n.kind != uint16_t(wire::CollNoticeKind::Abort)) return;  // a probe: delivered is all
    const int err = n.err > 0 ? n.err : FI_EIO;
    for (Running &r : running_)
        if (r.group == &g && r.seq == n.seq && r.op) {
            r.abort_from_peer = true;
            r.op->fail(err);
            return;
        }
    // Not started here yet (an operation already over here is behind next_seq: ignored).
    if (n.seq != kJoinSeq && uint16_t(n.seq - g.next_seq) < 0x8000) g.aborted.insert(n.seq);
}

// The operation failed here: the others hear of it (unless they told us), and its receives
// are cancelled so that it can end.
void Engine::abort(Running &r) {
    r.aborted = true;
    const int err = r.op->status();
    Group &g = *r.group;
    // A join whose members disagree on the order has no common channel to tell them on.
    if (!r.abort_from_peer && !(r.join && err == FI_EINVAL)) {
        wire::CollNotice n{wire::kCollNoticeMagic, uint16_t(wire::CollNoticeKind::Abort), r.seq,
                           err, 0};
        for (uint32_t m = 0; m < g.members.size(); ++m)
            if (m != g.rank) send_notice(g, m, n, nullptr);
    }
    std::vector<Transfer *> recvs(r.recvs.begin(), r.recvs.end());
    for (Transfer *t : recvs) fi_cancel(&owner_->fid, t);
}

void Engine::probe(Running &r) {
    std::set<uint32_t> peers;
    for (Transfer *t : r.recvs) peers.insert(t->peer);
    const wire::CollNotice n{wire::kCollNoticeMagic, uint16_t(wire::CollNoticeKind::Probe), r.seq,
                             0, 0};
    for (uint32_t p : peers) send_notice(*r.group, p, n, &r);
}

void Engine::drop_group(Group *g) {
    std::erase_if(leaving_, [g](const std::unique_ptr<Group> &p) { return p.get() == g; });
}

// ------------------------------------------------------------------------------------------
// Groups and operations

int Engine::join(const peer::CollJoin &j, uint64_t *handle) {
    if (!j.members || !j.count || j.rank >= j.count || !handle || !j.joined) return -FI_EINVAL;
    if (j.count > kMaxMembers) return -FI_EINVAL;
    auto g = std::make_unique<Group>();
    g->members.assign(j.members, j.members + j.count);
    g->rank = j.rank;
    // The n-th join over one member set, counted alike by every member (joins are collective,
    // so every member makes them in the same order).
    const uint32_t nth = joins_of_set_[j.set_key]++;
    g->id = group_id(j.ordered_key, nth);
    const uint32_t n = uint32_t(j.count);
    // Shared memory when every member is on this node (each member says so in the exchange;
    // only if all do is it used). Rank 0 makes the segment now, so that it exists once the
    // others hear of it.
    bool local = j.handshake && j.local_path && n > 1 && n <= ShmGroup::kMaxMembers;
    for (uint32_t m = 0; local && m < n; ++m) local = m == j.rank || reachable_(j.members[m]);
    if (local) {
        g->shm_name = ShmGroup::name_for(j.ordered_key, g->id);
        if (j.rank == 0) try {
                g->shm = ShmGroup::create(g->shm_name, n);
            } catch (const FabricError &e) {
                TANDEM_INFO(FI_LOG_EP_CTRL, "collective: no shared segment (%s): messages\n",
                            e.what());
                local = false;
            }
    }
    if (n > 1) post_notice_receive(*g);
    Running &r = running_.emplace_back();
    r.group = g.get();
    r.seq = kJoinSeq;
    r.join = true;
    r.arg = j.arg;
    r.done = j.joined;
    r.last_event = std::chrono::steady_clock::now();
    if (j.handshake && n > 1) {
        r.mine[0] = j.ordered_key;
        r.mine[1] = local;
        r.keys.assign(2 * size_t(n), 0);
        Args a{FI_ALLGATHER, 2, sizeof(uint64_t), FI_UINT64, FI_NOOP, 0};
        const uint64_t tag = wire::coll_tag(group_id(j.set_key, nth) ^ 0x5a5a5a5au, kJoinSeq);
        r.op.emplace(allgather_bruck(Shape{n, j.rank}, a), r.mine, r.keys.data(), FI_UINT64,
                     FI_NOOP, tag);
    }
    ++g->running;
    *handle = next_handle_++;
    groups_.emplace(*handle, std::move(g));
    return 0;
}

// After the join's exchange: the keys must agree; a node-local group then attaches to its
// segment and waits for every member to have done so.
bool Engine::join_after_exchange(Running &r) {
    Group &g = *r.group;
    if (r.op->status()) return true;
    const uint32_t n = uint32_t(g.members.size());
    if (r.join_phase == Running::JoinPhase::Exchange) {
        bool all_local = true;
        for (uint32_t m = 0; m < n; ++m) {
            if (r.keys[2 * m] != r.mine[0]) {
                TANDEM_WARN(FI_LOG_EP_CTRL,
                            "collective join: members list the set in different orders\n");
                r.op->fail(FI_EINVAL);
                return true;
            }
            all_local = all_local && r.keys[2 * m + 1] == 1;
        }
        if (!all_local) {
            g.shm.reset();  // (rank 0's, if it made one)
            return true;
        }
        r.join_phase = Running::JoinPhase::Attach;
    }
    if (r.join_phase == Running::JoinPhase::Attach) {
        if (!g.shm) {
            try {
                g.shm = ShmGroup::open(g.shm_name, n, g.rank);
            } catch (const FabricError &e) {
                TANDEM_WARN(FI_LOG_EP_CTRL, "collective join: shared segment %s: %s\n",
                            g.shm_name.c_str(), e.what());
                r.op->fail(FI_EIO);
                return true;
            }
            if (!g.shm) return false;  // rank 0 is still making it
        }
        r.join_phase = Running::JoinPhase::WaitAttached;
    }
    if (g.shm->all_attached()) {
        TANDEM_INFO(FI_LOG_EP_CTRL, "collective group %#x: %u members, node-local through %s\n",
                    g.id, n, g.shm_name.c_str());
        return true;
    }
    if (g.shm->check_members()) r.op->fail(FI_ECONNRESET);
    return r.op->status() != 0;
}

int Engine::post(uint64_t handle, const peer::CollWork &w) {
    auto it = groups_.find(handle);
    if (it == groups_.end() || !w.done) return -FI_EINVAL;
    Group &g = *it->second;
    const uint32_t n = uint32_t(g.members.size());
    Args a{w.coll, w.count, atomic::datatype_size(w.datatype), w.datatype, w.op, w.root};
    if (w.coll == FI_BARRIER) a.count = a.elem = 0;
    const IoBytes io = io_bytes(a, n, g.rank == w.root);
    const Config &cfg = Config::get();
    const Thresholds t{cfg.coll_allreduce_ring_min, cfg.coll_allgather_ring_min};

    Running &r = running_.emplace_back();
    r.group = &g;
    r.seq = g.next_seq++;
    r.arg = w.arg;
    r.done = w.done;
    r.last_event = std::chrono::steady_clock::now();
    const void *send = w.send;
    void *recv = w.recv;
    // Device memory in, host memory for the schedule (fi_broadcast's one buffer both ways).
    const hmem::MemRef send_mem = peer::mem_of(w.send_desc);
    r.recv_mem = peer::mem_of(w.recv_desc);
    if (send_mem.iface != FI_HMEM_SYSTEM && io.send) {
        r.send_stage.resize(io.send);
        r.status = -hmem::copy(hmem::kHost, r.send_stage.data(), send_mem, send, io.send);
        send = r.send_stage.data();
    }
    if (r.recv_mem.iface != FI_HMEM_SYSTEM && io.recv) {
        r.recv_stage.resize(io.recv);
        if (w.coll == FI_BROADCAST && !r.status)
            r.status = -hmem::copy(hmem::kHost, r.recv_stage.data(), r.recv_mem, recv, io.recv);
        r.recv_user = recv;
        r.recv_bytes = io.recv;
        r.recv_staged = true;
        recv = r.recv_stage.data();
    }
    if (g.shm) {
        r.shm_op.emplace(*g.shm, a, send, recv);
        if (r.status) r.shm_op->fail(r.status);
        ++g.running;
        return 0;
    }
    r.op.emplace(select(Shape{n, g.rank}, a, t), send, recv, w.datatype, w.op,
                 wire::coll_tag(g.id, r.seq));
    if (r.status) r.op->fail(r.status);
    if (g.aborted.erase(r.seq)) {  // a member failed it before we posted it
        r.abort_from_peer = true;
        r.op->fail(FI_ECONNRESET);
    }
    ++g.running;
    return 0;
}

int Engine::leave(uint64_t handle) {
    auto it = groups_.find(handle);
    if (it == groups_.end()) return -FI_EINVAL;
    if (it->second->running) return -FI_EBUSY;
    std::unique_ptr<Group> g = std::move(it->second);
    groups_.erase(it);
    if (g->notice_rx) {  // freed once the cancelled receive ended
        g->left = true;
        fi_cancel(&owner_->fid, g->notice_rx);
        leaving_.push_back(std::move(g));
    }
    return 0;
}

// The operation is over: the staged result goes out.
int Engine::finish(Running &r) {
    int err = r.shm_op ? r.shm_op->status() : r.op ? r.op->status() : 0;
    if (!err && r.recv_staged)
        err = -hmem::copy(r.recv_mem, r.recv_user, hmem::kHost, r.recv_stage.data(), r.recv_bytes);
    return err;
}

void Engine::progress() {
    if (repost_notices_) {
        repost_notices_ = false;
        for (auto &[handle, g] : groups_)
            if (!g->notice_rx && g->members.size() > 1) post_notice_receive(*g);
    }
    if (running_.empty()) return;
    // The clock, for probes, only every 64th pass: operations wait long before they probe.
    const bool timed = (++passes_ & 63) == 0;
    const auto now =
        timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    std::vector<std::pair<Running *, int>> over;
    for (Running &r : running_) {
        bool finished = true;
        if (r.shm_op) {
            finished = r.shm_op->progress();
        } else if (r.op) {
            current_ = &r;
            finished = r.op->progress(*this);
            current_ = nullptr;
            if (r.op->status() && !r.aborted) {
                abort(r);
                finished = r.op->finished();
            } else if (timed && !finished && !r.recvs.empty() && r.probes == 0 &&
                       now - r.last_event > kProbeAfter) {
                probe(r);
                r.last_event = now;
            }
            if (finished && r.join && !r.op->status()) finished = join_after_exchange(r);
        }
        if (finished && r.probes == 0) over.emplace_back(&r, finish(r));
    }
    // Reported after the walk: a report may post more work (a triggered collective).
    for (auto &[r, err] : over) {
        auto done = r->done;
        void *arg = r->arg;
        --r->group->running;
        running_.remove_if([r](const Running &x) { return &x == r; });
        done(arg, err);
    }
}

}  // namespace tandem::off::coll

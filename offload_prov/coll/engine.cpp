#include "offload_prov/coll/engine.h"

#include "common/log.h"
#include "hmem/atomic.h"
#include "offload_prov/config.h"
#include "peer/peer_abi.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

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

// Errors of a transfer that mean the member cannot be reached any more (its process or host
// is gone): the operation then fails with FI_ECONNRESET at every member, whichever of them
// saw which of these first.
bool member_lost(int err) {
    switch (err) {
        case FI_ECONNREFUSED:
        case FI_ECONNRESET:
        case FI_ECONNABORTED:
        case FI_EHOSTUNREACH:
        case FI_ENETUNREACH:
        case FI_ENOTCONN:
        case FI_ETIMEDOUT:
        case EPIPE:
            return true;
        default:
            return false;
    }
}

}  // namespace

Engine::~Engine() {
    // The owner closes this endpoint's groups first (its fi_close refuses while one is open);
    // what is still in flight (a join abandoned, notice receives) was dropped by the owner
    // before it closed us, and never completes: freed here.
    for (Running &r : running_)
        if (r.op && r.op->in_flight())
            TANDEM_INFO(FI_LOG_EP_DATA, "collective abandoned with %zu transfers in flight\n",
                        r.op->in_flight());
    for (Transfer *t : live_) delete t;
}

Engine::Transfer *Engine::new_transfer(const Transfer &t) {
    auto *p = new Transfer(t);
    live_.insert(p);
    return p;
}

void Engine::free_transfer(Transfer *t) {
    live_.erase(t);
    delete t;
}

bool Engine::owns(const void *context) {
    uint32_t magic;
    memcpy(&magic, context, sizeof magic);
    return magic == kTransferMagic;
}

// ------------------------------------------------------------------------------------------
// Transfers

// A schedule's peer (a rank among the operation's participants) as a member of the group.
uint32_t Engine::member_of(uint32_t peer) const {
    return current_->rank_map ? (*current_->rank_map)[peer] : peer;
}

// Posts a transfer (a receive when t->recv, else a send) on the owner's endpoint as a peer
// transfer: 0, or the owner's error, and the transfer is then freed.
int Engine::issue(Transfer *t, fi_addr_t addr, uint64_t tag, void *buf, size_t len) {
    iovec iov{buf, len};
    fi_msg_tagged msg{&iov, nullptr, 1, addr, tag, 0, t, 0};
    ssize_t ret = t->recv ? fi_trecvmsg(owner_, &msg, FI_PEER_TRANSFER)
                          : fi_tsendmsg(owner_, &msg, FI_PEER_TRANSFER);
    if (ret) free_transfer(t);
    return int(ret);
}

int Engine::send(uint32_t peer, uint64_t tag, const void *buf, size_t len, Operation *) {
    const uint32_t member = member_of(peer);
    auto *t = new_transfer(Transfer{kTransferMagic, Transfer::Kind::Data, false, member, current_});
    return issue(t, current_->group->members[member], tag, const_cast<void *>(buf), len);
}

int Engine::recv(uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *) {
    const uint32_t member = member_of(peer);
    auto *t = new_transfer(Transfer{kTransferMagic, Transfer::Kind::Data, true, member, current_});
    int ret = issue(t, current_->group->members[member], tag, buf, len);
    if (!ret) current_->recvs.insert(t);
    return ret;
}

void Engine::transfer_done(void *context, int err) {
    auto *t = static_cast<Transfer *>(context);
    switch (t->kind) {
        case Transfer::Kind::Data:
            if (t->recv) t->run->recvs.erase(t);
            ++t->run->transfers_ended;
            t->run->op->transfer_done(member_lost(err) ? FI_ECONNRESET : err);
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
                if (!g->running) drop_group(g);
            } else {
                if (!err) notice_arrived(*g, t->notice);
                repost_notices_ = true;
            }
            break;
        }
    }
    free_transfer(t);
}

// ------------------------------------------------------------------------------------------
// Notices

void Engine::post_notice_receive(Group &g) {
    auto *t =
        new_transfer(Transfer{kTransferMagic, Transfer::Kind::NoticeReceive, true, 0, nullptr, &g});
    if (issue(t, FI_ADDR_UNSPEC, wire::coll_notice_tag(g.id), &t->notice, sizeof t->notice)) {
        repost_notices_ = true;  // (-FI_EAGAIN: again at the next pass)
        return;
    }
    g.notice_rx = t;
}

void Engine::send_notice(Group &g, uint32_t peer, const wire::CollNotice &n, Running *run) {
    auto *t = new_transfer(Transfer{kTransferMagic, Transfer::Kind::Notice, false, peer, run});
    t->notice = n;
    if (int ret =
            issue(t, g.members[peer], wire::coll_notice_tag(g.id), &t->notice, sizeof t->notice)) {
        TANDEM_INFO(FI_LOG_EP_DATA, "collective: notice to member %u not sent: %s\n", peer,
                    fi_strerror(-ret));
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
    // A leader that failed among the leaders: its node waits on it in shared memory.
    if (r.hier && g.shm) g.shm->abort();
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
    // The members that share this node (the twin's shared memory reaches them), this one
    // included, when the owner allows node-local traffic. The lowest is the node's leader,
    // which makes the node's segment now, so that it exists once the others hear of it.
    std::vector<uint32_t> near;
    for (uint32_t m = 0; m < n; ++m)
        if (m == j.rank || (j.handshake && j.local_path && reachable_(j.members[m])))
            near.push_back(m);
    const uint32_t leader = near.front();
    g->shm_name = ShmGroup::name_for(j.ordered_key, g->id + leader);
    if (near.size() > 1 && near.size() <= ShmGroup::kMaxMembers && leader == j.rank) {
        try {
            g->shm = ShmGroup::create(g->shm_name, uint32_t(near.size()));
        } catch (const FabricError &e) {
            // Saying so (a node of one) makes the members' views disagree: messages for all.
            TANDEM_INFO(FI_LOG_EP_CTRL, "collective: no shared segment (%s)\n", e.what());
            near.assign(1, j.rank);
        }
    }
    if (n > 1) post_notice_receive(*g);
    Running &r = new_running();
    r.group = g.get();
    r.seq = kJoinSeq;
    r.join = true;
    r.arg = j.arg;
    r.done = j.joined;
    if (j.handshake && n > 1) {
        r.mine[0] = j.ordered_key;
        r.mine[1] = near.size();
        r.mine[2] = leader;
        r.keys.assign(3 * size_t(n), 0);
        // In the set's order (by name hash), which does not depend on how the set was listed.
        uint32_t set_rank = j.rank;
        r.set_order.resize(n);
        for (uint32_t i = 0; i < n; ++i) {
            r.set_order[i] = j.set_order ? j.set_order[i] : i;
            if (r.set_order[i] == j.rank) set_rank = i;
        }
        r.rank_map = &r.set_order;
        Args a{FI_ALLGATHER, 3, sizeof(uint64_t), FI_UINT64, FI_NOOP, 0};
        const uint64_t tag = wire::coll_tag(group_id(j.set_key, nth) ^ 0x5a5a5a5au, kJoinSeq);
        r.op.emplace(allgather_bruck(Shape{n, set_rank}, a), r.mine, r.keys.data(), FI_UINT64,
                     FI_NOOP, tag);
    }
    ++g->running;
    *handle = next_handle_++;
    groups_.emplace(*handle, std::move(g));
    return 0;
}

// From what every member said in the exchange (each computes the same): the group's mode.
// The members' views of who shares a node must agree (each node's members name the same
// leader and count the same members), else messages for all.
void Engine::choose_mode(Running &r) {
    Group &g = *r.group;
    const uint32_t n = uint32_t(g.members.size());
    auto near_of = [&](uint32_t m) { return r.keys[3 * m + 1]; };
    auto leader_of = [&](uint32_t m) { return r.keys[3 * m + 2]; };
    bool consistent = true;
    std::set<uint32_t> leaders;
    for (uint32_t m = 0; m < n && consistent; ++m) {
        const uint64_t l = leader_of(m);
        size_t same = 0;
        for (uint32_t k = 0; k < n; ++k) same += leader_of(k) == l;
        consistent = l < n && leader_of(uint32_t(l)) == l && same == near_of(m) &&
                     near_of(m) <= ShmGroup::kMaxMembers;
        leaders.insert(uint32_t(l));
    }
    g.mode = Group::Mode::Messages;
    if (consistent && leaders.size() == 1) {
        g.mode = Group::Mode::Shm;
    } else if (consistent && leaders.size() < n) {
        g.mode = Group::Mode::Hier;
        g.leaders.assign(leaders.begin(), leaders.end());
        for (size_t i = 0; i < g.leaders.size(); ++i)
            if (g.leaders[i] == g.rank) g.leader_index = int(i);
    }
    if (g.mode == Group::Mode::Messages) {
        g.shm.reset();  // (a leader's, if it made one)
        return;
    }
    const uint64_t mine = leader_of(g.rank);
    g.node_size = uint32_t(near_of(g.rank));
    g.node_rank = 0;
    for (uint32_t k = 0; k < g.rank; ++k) g.node_rank += leader_of(k) == mine;
}

// After the join's exchange: the keys must agree; then the mode, and a member with company
// on its node attaches to the node's segment and waits for every member of the node to have.
bool Engine::join_after_exchange(Running &r) {
    Group &g = *r.group;
    if (r.op->status()) return true;
    const uint32_t n = uint32_t(g.members.size());
    if (r.join_phase == Running::JoinPhase::Exchange) {
        for (uint32_t m = 0; m < n; ++m)
            if (r.keys[3 * m] != r.mine[0]) {
                TANDEM_WARN(FI_LOG_EP_CTRL,
                            "collective join: members list the set in different orders\n");
                r.op->fail(FI_EINVAL);
                return true;
            }
        // Every member lists the set alike: what each said, by rank.
        std::vector<uint64_t> by_rank(r.keys.size());
        for (uint32_t i = 0; i < n; ++i)
            for (uint32_t w = 0; w < 3; ++w) by_rank[3 * r.set_order[i] + w] = r.keys[3 * i + w];
        r.keys.swap(by_rank);
        choose_mode(r);
        if (g.mode == Group::Mode::Messages || g.node_size == 1) return true;
        r.join_phase = Running::JoinPhase::Attach;
    }
    if (r.join_phase == Running::JoinPhase::Attach) {
        if (!g.shm) {
            try {
                g.shm = ShmGroup::open(g.shm_name, g.node_size, g.node_rank);
            } catch (const FabricError &e) {
                TANDEM_WARN(FI_LOG_EP_CTRL, "collective join: shared segment %s: %s\n",
                            g.shm_name.c_str(), e.what());
                r.op->fail(FI_EIO);
                return true;
            }
            if (!g.shm) return false;  // the leader is still making it
        }
        r.join_phase = Running::JoinPhase::WaitAttached;
    }
    if (g.shm->all_attached()) {
        TANDEM_INFO(FI_LOG_EP_CTRL,
                    "collective group %#x: %u members, %s, %u of them on this node through %s\n",
                    g.id, n, g.mode == Group::Mode::Shm ? "all node-local" : "hierarchical",
                    g.node_size, g.shm_name.c_str());
        return true;
    }
    if (g.shm->check_members()) r.op->fail(FI_ECONNRESET);
    return r.op->status() != 0;
}

// Device memory in, host memory for the schedule (fi_broadcast's one buffer both ways): send
// and recv become r's host copies where the user's buffers are on a device. A failed copy is
// left in r.status, for the operation to fail with once it exists.
void Engine::stage_buffers(Running &r, const Group &g, const peer::CollWork &w,
                           const peer::CollIo &io, const void **send, void **recv) {
    const hmem::MemRef send_mem = peer::mem_of(w.send_desc);
    r.recv_mem = peer::mem_of(w.recv_desc);
    if (send_mem.iface != FI_HMEM_SYSTEM && io.send) {
        r.send_stage.resize(io.send);
        r.status = -hmem::copy(hmem::kHost, r.send_stage.data(), send_mem, *send, io.send);
        *send = r.send_stage.data();
    }
    if (r.recv_mem.iface != FI_HMEM_SYSTEM && io.recv) {
        // fi_broadcast's one buffer: the root's input (copied in, and left as it is), the
        // others' result (copied out).
        const bool bcast_root = w.coll == FI_BROADCAST && g.rank == w.root;
        r.recv_stage.resize(io.recv);
        if (bcast_root && !r.status)
            r.status = -hmem::copy(hmem::kHost, r.recv_stage.data(), r.recv_mem, *recv, io.recv);
        r.recv_user = *recv;
        r.recv_bytes = io.recv;
        r.recv_staged = !bcast_root;
        *recv = r.recv_stage.data();
    }
}

// An allreduce or barrier of a hierarchical group (Mode::Hier): node-local reduce into the
// leader's partial result, the leaders' allreduce of the partials, node-local broadcast of the
// result (barriers: the same three barriers).
void Engine::start_hier(Running &r, Group &g, const peer::CollWork &w, const Args &a,
                        const Thresholds &t, const void *send, void *recv) {
    r.hier = true;
    const bool leader = g.leader_index >= 0;
    if (leader) r.partial.resize(a.bytes());
    if (g.shm) {
        Args in = a, out = a;
        in.coll = w.coll == FI_BARRIER ? FI_BARRIER : FI_REDUCE;
        out.coll = w.coll == FI_BARRIER ? FI_BARRIER : FI_BROADCAST;
        in.root = out.root = 0;
        r.shm_op.emplace(*g.shm, in, send, leader ? r.partial.data() : nullptr);
        r.node_out.emplace(*g.shm, out, nullptr, recv);
        if (r.status) r.shm_op->fail(r.status);
    } else if (a.bytes()) {
        memcpy(r.partial.data(), send, a.bytes());  // a node of one: its input is the partial
    }
    if (leader) {
        r.rank_map = &g.leaders;
        const Shape leaders{uint32_t(g.leaders.size()), uint32_t(g.leader_index)};
        r.op.emplace(select(leaders, a, t), r.partial.data(), recv, w.datatype, w.op,
                     wire::coll_tag(g.id, r.seq));
        if (r.status) r.op->fail(r.status);
    }
}

int Engine::post(uint64_t handle, const peer::CollWork &w) {
    auto it = groups_.find(handle);
    if (it == groups_.end() || !w.done) return -FI_EINVAL;
    Group &g = *it->second;
    const uint32_t n = uint32_t(g.members.size());
    Args a{w.coll, w.count, atomic::datatype_size(w.datatype), w.datatype, w.op, w.root};
    if (w.coll == FI_BARRIER) a.count = a.elem = 0;
    const peer::CollIo io = peer::coll_io_bytes(w.coll, a.bytes(), n, g.rank == w.root);
    const Config &cfg = Config::get();
    const Thresholds t{cfg.coll_allreduce_ring_min, cfg.coll_allgather_ring_min};

    Running &r = new_running();
    r.group = &g;
    r.seq = g.next_seq++;
    r.arg = w.arg;
    r.done = w.done;

    const void *send = w.send;
    void *recv = w.recv;
    stage_buffers(r, g, w, io, &send, &recv);
    ++g.running;
    if (g.mode == Group::Mode::Shm) {
        r.shm_op.emplace(*g.shm, a, send, recv);
        if (r.status) r.shm_op->fail(r.status);
        // Its first step now (the input into the slot, announced): the others may be waiting.
        r.shm_op->progress();
        return 0;
    }
    if (g.mode == Group::Mode::Hier && (w.coll == FI_ALLREDUCE || w.coll == FI_BARRIER)) {
        start_hier(r, g, w, a, t, send, recv);
        return 0;
    }
    r.op.emplace(select(Shape{n, g.rank}, a, t), send, recv, w.datatype, w.op,
                 wire::coll_tag(g.id, r.seq));
    if (r.status) r.op->fail(r.status);
    if (g.aborted.erase(r.seq)) {  // a member failed it before we posted it
        r.abort_from_peer = true;
        r.op->fail(FI_ECONNRESET);
    }
    return 0;
}

// The owner closes the group: refused while operations run, but a join still running (members
// missing, or gone) is abandoned, unreported: the group is freed once its transfers ended.
int Engine::leave(uint64_t handle) {
    auto it = groups_.find(handle);
    if (it == groups_.end()) return -FI_EINVAL;
    Group *g = it->second.get();
    for (Running &r : running_)
        if (r.group == g && !r.join) return -FI_EBUSY;
    for (Running &r : running_)
        if (r.group == g) {
            r.done = nullptr;
            if (r.op) r.op->fail(FI_ECANCELED);
        }
    std::unique_ptr<Group> owned = std::move(it->second);
    groups_.erase(it);
    owned->left = true;
    if (owned->notice_rx) fi_cancel(&owner_->fid, owned->notice_rx);
    if (owned->notice_rx || owned->running) leaving_.push_back(std::move(owned));
    return 0;
}

// An entry for a new operation at the end of the running list: a spare one, reset, if any.
Engine::Running &Engine::new_running() {
    if (spare_.empty()) return running_.emplace_back();
    running_.splice(running_.end(), spare_, spare_.begin());
    Running &r = running_.back();
    // Reset, keeping the staging buffers' memory.
    std::vector<uint8_t> send_stage = std::move(r.send_stage), recv_stage = std::move(r.recv_stage),
                         partial = std::move(r.partial);
    std::destroy_at(&r);
    std::construct_at(&r);
    send_stage.clear();
    recv_stage.clear();
    partial.clear();
    r.send_stage = std::move(send_stage);
    r.recv_stage = std::move(recv_stage);
    r.partial = std::move(partial);
    return r;
}

// The operation is over: the staged result goes out.
int Engine::finish(Running &r) {
    int err = r.shm_op ? r.shm_op->status() : 0;
    if (!err && r.op) err = r.op->status();
    if (!err && r.node_out) err = r.node_out->status();
    if (!err && r.recv_staged)
        err = -hmem::copy(r.recv_mem, r.recv_user, hmem::kHost, r.recv_stage.data(), r.recv_bytes);
    return err;
}

bool Engine::progress_messages(Running &r, bool timed, Clock::time_point now) {
    current_ = &r;
    bool finished = r.op->progress(*this);
    current_ = nullptr;
    if (r.op->status() && !r.aborted) {
        abort(r);
        finished = r.op->finished();
    } else if (timed && !finished) {
        // Silence is measured from the first timed pass that saw no transfer end since the
        // one before (no clock read per transfer).
        if (r.transfers_ended != r.transfers_seen || r.quiet_since == Clock::time_point{}) {
            r.transfers_seen = r.transfers_ended;
            r.quiet_since = now;
        } else if (!r.recvs.empty() && r.probes == 0 && now - r.quiet_since > kProbeAfter) {
            probe(r);
            r.quiet_since = now;
        }
    }
    return finished;
}

// Stage 0: node-local part in; 1: the leaders' operation (leaders only); 2: node-local out.
// An operation that fails before stage 2 still ends its node_out (failed, at once), so that
// the group's node-local operations behind it get their turn.
bool Engine::progress_hier(Running &r, bool timed, Clock::time_point now) {
    int err = 0;
    if (r.stage == 0) {
        if (r.shm_op && !r.shm_op->progress()) return false;
        err = r.shm_op ? r.shm_op->status() : 0;
        r.stage = 1;
    }
    if (r.stage == 1 && !err) {
        if (r.op && !progress_messages(r, timed, now)) return false;
        err = r.op ? r.op->status() : 0;
    }
    r.stage = 2;
    if (err && r.node_out) r.node_out->fail(err);
    return !r.node_out || r.node_out->progress();
}

void Engine::progress() {
    if (repost_notices_) {
        repost_notices_ = false;
        for (auto &[handle, g] : groups_)
            if (!g->notice_rx && g->members.size() > 1) post_notice_receive(*g);
    }
    if (running_.empty()) return;
    // The clock, for probes, only every 64th pass (operations wait long before they probe), or
    // after a sleep; after a sleep, node-local operations also look at their members at their
    // next wait (an awake process counts its waits for that).
    const bool after_sleep = std::exchange(checks_due_, false);
    const bool timed = (++passes_ & 63) == 0 || after_sleep;
    const auto now = timed ? Clock::now() : Clock::time_point{};
    over_.clear();
    for (auto it = running_.begin(); it != running_.end(); ++it) {
        Running &r = *it;
        if (after_sleep) {
            if (r.shm_op) r.shm_op->check_members_next();
            if (r.node_out) r.node_out->check_members_next();
        }
        bool finished = true;
        if (r.hier)
            finished = progress_hier(r, timed, now);
        else if (r.shm_op)
            finished = r.shm_op->progress();
        else if (r.op)
            finished = progress_messages(r, timed, now);
        if (finished && r.join && r.op && !r.op->status()) finished = join_after_exchange(r);
        if (finished && r.probes == 0) over_.emplace_back(it, finish(r));
    }
    // Reported after the walk: a report may post more work (a triggered collective). The
    // entry goes back to the spare list (its buffers keep their memory for the next one).
    for (auto &[it, err] : over_) {
        auto done = it->done;
        void *arg = it->arg;
        Group *g = it->group;
        --g->running;
        spare_.splice(spare_.end(), running_, it);
        if (g->left && !g->running && !g->notice_rx) drop_group(g);
        if (done) done(arg, err);
    }
}

}  // namespace tandem::off::coll

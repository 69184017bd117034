#include "offload_prov/coll/engine.h"

#include "common/log.h"
#include "common/wire.h"
#include "hmem/atomic.h"
#include "offload_prov/config.h"
#include "peer/peer_abi.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <cstring>

namespace tandem::off::coll {

namespace {

// The context of one peer transfer of ours: the magic tells it from the twin's other peer
// transfers (its hellos) when the owner hands the completion back.
constexpr uint32_t kTransferMagic = 0x636f6c6c;  // "coll"
struct TransferContext {
    uint32_t magic = kTransferMagic;
    Operation *op = nullptr;
};

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
    // The owner closes its endpoint only once no operation runs (leave refuses a busy group);
    // whatever still runs here had its transfers discarded with the endpoint.
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

void Engine::transfer_done(void *context, int err) {
    auto *t = static_cast<TransferContext *>(context);
    t->op->transfer_done(err);
    delete t;
}

int Engine::send(uint32_t peer, uint64_t tag, const void *buf, size_t len, Operation *op) {
    auto *ctx = new TransferContext{kTransferMagic, op};
    iovec iov{const_cast<void *>(buf), len};
    fi_msg_tagged msg{&iov, nullptr, 1, current_->members[peer], tag, 0, ctx, 0};
    ssize_t ret = fi_tsendmsg(owner_, &msg, FI_PEER_TRANSFER);
    if (ret) delete ctx;
    return int(ret);
}

int Engine::recv(uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *op) {
    auto *ctx = new TransferContext{kTransferMagic, op};
    iovec iov{buf, len};
    fi_msg_tagged msg{&iov, nullptr, 1, current_->members[peer], tag, 0, ctx, 0};
    ssize_t ret = fi_trecvmsg(owner_, &msg, FI_PEER_TRANSFER);
    if (ret) delete ctx;
    return int(ret);
}

int Engine::join(const peer::CollJoin &j, uint64_t *handle) {
    if (!j.members || !j.count || j.rank >= j.count || !handle || !j.joined) return -FI_EINVAL;
    if (j.count > kMaxMembers) return -FI_EINVAL;
    auto g = std::make_unique<Group>();
    g->members.assign(j.members, j.members + j.count);
    g->rank = j.rank;
    g->ordered_key = j.ordered_key;
    // The n-th join over one member set, counted alike by every member (joins are collective,
    // so every member makes them in the same order).
    const uint32_t nth = joins_of_set_[j.set_key]++;
    g->id = group_id(j.ordered_key, nth);
    Running &r = running_.emplace_back();
    r.group = g.get();
    r.join = true;
    r.arg = j.arg;
    r.done = j.joined;
    if (j.handshake && j.count > 1) {
        r.key = j.ordered_key;
        r.keys.assign(j.count, 0);
        Args a{FI_ALLGATHER, 1, sizeof(uint64_t), FI_UINT64, FI_NOOP, 0};
        const Shape shape{uint32_t(j.count), j.rank};
        const uint64_t tag = wire::coll_tag(group_id(j.set_key, nth) ^ 0x5a5a5a5au, 0xffff);
        r.op.emplace(allgather_bruck(shape, a), &r.key, r.keys.data(), FI_UINT64, FI_NOOP, tag);
    }
    ++g->running;
    *handle = next_handle_++;
    groups_.emplace(*handle, std::move(g));
    return 0;
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
    r.arg = w.arg;
    r.done = w.done;
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
    const uint64_t tag = wire::coll_tag(g.id, g.next_seq++);
    r.op.emplace(select(Shape{n, g.rank}, a, t), send, recv, w.datatype, w.op, tag);
    ++g.running;
    return 0;
}

int Engine::leave(uint64_t handle) {
    auto it = groups_.find(handle);
    if (it == groups_.end()) return -FI_EINVAL;
    if (it->second->running) return -FI_EBUSY;
    groups_.erase(it);
    return 0;
}

// The operation is over: the staged result goes out, the join's keys are checked.
int Engine::finish(Running &r) {
    int err = r.status ? r.status : r.op ? r.op->status() : 0;
    if (!err && r.join) {
        for (uint64_t k : r.keys)
            if (k != r.key) err = FI_EINVAL;
        if (err)
            TANDEM_WARN(FI_LOG_EP_CTRL,
                        "collective join: members list the set in different orders\n");
    }
    if (!err && r.recv_staged)
        err = -hmem::copy(r.recv_mem, r.recv_user, hmem::kHost, r.recv_stage.data(), r.recv_bytes);
    return err;
}

void Engine::progress() {
    if (running_.empty()) return;
    std::vector<std::pair<Running *, int>> over;
    for (Running &r : running_) {
        bool finished = true;
        if (r.op && !r.status) {
            current_ = r.group;
            finished = r.op->progress(*this);
            current_ = nullptr;
        } else if (r.op && r.op->in_flight()) {
            finished = false;
        }
        if (finished) over.emplace_back(&r, finish(r));
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

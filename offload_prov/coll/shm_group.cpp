#include "offload_prov/coll/shm_group.h"

#include "common/log.h"
#include "main_prov/shm/inbox_segment.h"  // segment_prefix

#include <rdma/fi_errno.h>

#include <cstdio>
#include <unistd.h>

namespace tandem::off::coll {

// At the segment's start; the members' Ctl lines, their slots and the results follow.
struct ShmGroup::Header {
    static constexpr uint64_t kMagic = 0x74636f6c6c736567ull;  // "tcollseg"
    uint64_t magic;
    uint32_t n;
    uint32_t reserved;
    uint64_t chunk;
    std::atomic<uint32_t> attached;
    std::atomic<uint32_t> aborted;
};
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free);

namespace {

size_t layout_bytes(uint32_t n) {
    return 64 + size_t(n) * sizeof(ShmGroup::Ctl) + (size_t(n) * 2 + 2) * ShmGroup::kChunk;
}

}  // namespace

std::string ShmGroup::name_for(uint64_t ordered_key, uint32_t id) {
    char buf[64];
    snprintf(buf, sizeof buf, "coll-%016llx-%08x", (unsigned long long)ordered_key, id);
    return shm::segment_prefix() + buf;
}

ShmGroup::ShmGroup(ShmSegment seg, uint32_t n, uint32_t rank)
    : seg_(std::move(seg)), members_(shm::segment_prefix()), n_(n), rank_(rank) {
    auto *base = static_cast<uint8_t *>(seg_.data());
    ctls_ = reinterpret_cast<Ctl *>(base + 64);
    slots_ = base + 64 + size_t(n) * sizeof(Ctl);
    results_ = slots_ + size_t(n) * 2 * kChunk;
}

ShmGroup::Header *ShmGroup::header() const {
    return static_cast<Header *>(seg_.data());
}

std::unique_ptr<ShmGroup> ShmGroup::create(const std::string &name, uint32_t n) {
    ShmSegment seg = ShmSegment::create(name, layout_bytes(n));
    std::unique_ptr<ShmGroup> g(new ShmGroup(std::move(seg), n, 0));
    Header *h = g->header();
    h->magic = Header::kMagic;
    h->n = n;
    h->chunk = kChunk;
    g->stamp_member(0);
    h->attached.store(1, std::memory_order_release);
    return g;
}

std::unique_ptr<ShmGroup> ShmGroup::open(const std::string &name, uint32_t n, uint32_t rank) {
    std::optional<ShmSegment> seg;
    try {
        seg.emplace(ShmSegment::open(name));
    } catch (const ShmError &e) {
        if (e.err == -EAGAIN || e.err == -ENOENT) return nullptr;
        throw;
    }
    if (seg->data_size() < layout_bytes(n)) throw ShmError(-EPROTO, "collective segment size");
    std::unique_ptr<ShmGroup> g(new ShmGroup(std::move(*seg), n, rank));
    Header *h = g->header();
    if (h->attached.load(std::memory_order_acquire) == 0) return nullptr;  // still being made
    if (h->magic != Header::kMagic || h->n != n || h->chunk != kChunk)
        throw ShmError(-EPROTO, "collective segment layout");
    g->stamp_member(rank);
    h->attached.fetch_add(1, std::memory_order_acq_rel);
    return g;
}

bool ShmGroup::all_attached() const {
    return header()->attached.load(std::memory_order_acquire) >= n_;
}

bool ShmGroup::aborted() const {
    return header()->aborted.load(std::memory_order_acquire) != 0;
}

void ShmGroup::abort() {
    header()->aborted.store(1, std::memory_order_release);
}

// Relaxed: the counts that follow (`attached`, acq_rel) publish these to the others.
void ShmGroup::stamp_member(uint32_t rank) {
    ctl(rank).token.store(own_process_token(), std::memory_order_relaxed);
    ctl(rank).pid_ns.store(own_pid_namespace(), std::memory_order_relaxed);
    ctl(rank).pid.store(getpid(), std::memory_order_relaxed);
}

bool ShmGroup::check_members() {
    for (uint32_t r = 0; r < n_; ++r) {
        if (r == rank_) continue;
        pid_t pid = ctl(r).pid.load(std::memory_order_relaxed);
        if (pid <= 0) continue;  // not attached yet
        bool alive = pid_namespace_is_ours(ctl(r).pid_ns.load(std::memory_order_relaxed))
                         ? process_running(pid)
                         : members_.alive(ctl(r).token.load(std::memory_order_relaxed));
        if (!alive) {
            TANDEM_INFO(FI_LOG_EP_DATA, "collective: member %u (pid %d) of %s died\n", r, pid,
                        seg_.name().c_str());
            header()->aborted.store(1, std::memory_order_release);
            return true;
        }
    }
    return false;
}

bool ShmGroup::all_reached(std::atomic<uint64_t> Ctl::*field, uint64_t gen) const {
    for (uint32_t r = 0; r < n_; ++r)
        if ((ctls_[r].*field).load(std::memory_order_acquire) < gen) return false;
    return true;
}

// ------------------------------------------------------------------------------------------

uint64_t ShmOp::generations(const Args &a, uint32_t n) {
    const size_t bytes = a.bytes(), piece = piece_bytes(a.coll, n);
    return bytes == 0 ? 1 : (bytes + piece - 1) / piece;
}

ShmOp::ShmOp(ShmGroup &g, const Args &a, const void *send, void *recv)
    : g_(g),
      a_(a),
      send_(static_cast<const uint8_t *>(send)),
      recv_(static_cast<uint8_t *>(recv)),
      gen0_(g.next_gen),
      gens_(generations(a, g.size())) {
    g.next_gen += gens_;
}

size_t ShmOp::chunk_bytes() const {
    const size_t left = a_.bytes() - offset();
    return left < ShmGroup::kChunk ? left : ShmGroup::kChunk;
}

// Whether a member died is a read of /proc per member: at most every kMemberCheck of waiting
// (the clock itself read every 1024th wait), not every so many polls, which a fast
// succession of short operations reaches often.
void ShmOp::waiting() {
    if (++spins_ % kSpinsPerCheck) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - g_.last_check < ShmGroup::kMemberCheck) return;
    g_.last_check = now;
    g_.check_members();
}

bool ShmOp::progress() {
    if (finished_) return true;  // (its turn is passed on once only)
    if (chunk_ == 0 && phase_ == 0 && g_.turn != gen0_) return false;  // an earlier one runs
    while (!status_ && chunk_ < gens_) {
        if (g_.aborted()) {
            fail(FI_ECONNRESET);
            break;
        }
        bool complete = false;
        switch (a_.coll) {
            case FI_BARRIER:
                complete = barrier_step();
                break;
            case FI_BROADCAST:
                complete = broadcast_step();
                break;
            case FI_ALLREDUCE:
                complete = reduce_step(true);
                break;
            case FI_REDUCE:
                complete = reduce_step(false);
                break;
            default:
                complete = block_step();
                break;
        }
        if (!complete) {
            if (!status_) {
                waiting();
                return false;
            }
            break;
        }
        ++chunk_;
        phase_ = 0;
        spins_ = 0;
    }
    g_.turn = gen0_ + gens_;  // (failed: those behind fail on the abort mark, or run)
    finished_ = true;
    return true;
}

}  // namespace tandem::off::coll

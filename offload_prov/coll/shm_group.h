// Collectives of a group whose members all run on this node: through one shared segment,
// with no messages. Each member copies its input into its own slot once; the members reduce
// disjoint parts of the vector straight out of everyone's slots into a shared result (every
// part reduced by one member, in rank order, so all get the same bits), and each copies the
// result out once. Synchronisation is three counters per member (arrived, reduced, done),
// each on its own cache line and written only by that member, which the others poll.
//
// Operations of the group run in the order posted, one generation per chunk of at most
// kChunk bytes; slots and results alternate between two halves by generation, so a member
// may start chunk g while others still read chunk g - 1. Writing a half again (chunk g + 2)
// waits until every member is done with chunk g.
//
// The segment is created by rank 0 at the join (ShmSegment, removed when rank 0 leaves or
// reaped if it died) and opened by the others once the join's exchange agreed on it. A
// member whose process dies leaves the segment marked aborted: every operation of the group
// then fails with FI_ECONNRESET, now and later (a new group must be joined).
#pragma once

#include "offload_prov/coll/schedule.h"
#include "main_prov/shm/shm_segment.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace tandem::off::coll {

class ShmGroup {
  public:
    static constexpr size_t kChunk = 256u << 10;
    // Groups larger than this use the message algorithms (n slots of 2 kChunk each).
    static constexpr uint32_t kMaxMembers = 64;

    // Rank 0: creates the segment (throws ShmError). Others: open() once it exists.
    static std::unique_ptr<ShmGroup> create(const std::string &name, uint32_t n);
    // nullptr while the creator has not finished it (try again later); throws on other errors.
    static std::unique_ptr<ShmGroup> open(const std::string &name, uint32_t n, uint32_t rank);
    static std::string name_for(uint64_t ordered_key, uint32_t id);

    uint32_t size() const { return n_; }
    uint32_t rank() const { return rank_; }
    bool all_attached() const;
    bool aborted() const;
    void abort();  // every operation of the group fails, here and at every member
    // Whether a member other than us has died (checks /proc or the members' segments: call
    // rarely); marks the group aborted if so.
    bool check_members();

    struct alignas(64) Ctl {
        std::atomic<uint64_t> arrived;  // generation whose input is in the member's slot
        std::atomic<uint64_t> reduced;  // generation whose part of the result is written
        std::atomic<uint64_t> done;     // generation the member no longer reads
        // Who the member is, to tell whether it still runs: its pid where its pid namespace
        // is ours, else its process token (ProcessWatch).
        std::atomic<int32_t> pid;
        std::atomic<uint32_t> token;
        std::atomic<uint64_t> pid_ns;
    };
    Ctl &ctl(uint32_t r) const { return ctls_[r]; }
    uint8_t *slot(uint32_t r, uint64_t gen) const {
        return slots_ + (size_t(r) * 2 + gen % 2) * kChunk;
    }
    uint8_t *result(uint64_t gen) const { return results_ + (gen % 2) * kChunk; }
    // Whether every member's field has reached gen.
    bool all_reached(std::atomic<uint64_t> Ctl::*field, uint64_t gen) const;

    // How often a waiting member looks whether the others still run.
    static constexpr std::chrono::milliseconds kMemberCheck{20};
    std::chrono::steady_clock::time_point last_check{};
    uint64_t next_gen = 1;  // of the next operation posted here
    uint64_t turn = 1;      // first generation of the operation that may run now (in order)

  private:
    struct Header;
    ShmGroup(ShmSegment seg, uint32_t n, uint32_t rank);
    Header *header() const;
    void stamp_member(uint32_t rank);
    ShmSegment seg_;
    ProcessWatch members_;
    uint32_t n_, rank_;
    Ctl *ctls_;
    uint8_t *slots_, *results_;
};

// One operation of a ShmGroup, any of the nine collectives. Drive it with progress() until it
// returns true; status() then says how it ended.
class ShmOp {
  public:
    // Generations (chunks) the operation takes in a group of n.
    static uint64_t generations(const Args &a, uint32_t n);
    static size_t piece_bytes(fi_collective_op coll, uint32_t n);
    ShmOp(ShmGroup &g, const Args &a, const void *send, void *recv);

    bool progress();
    int status() const { return status_; }
    // The next wait looks whether the other members still run (once kMemberCheck has passed
    // since the last look), not only every so many waits: a process that slept made few.
    void check_members_next() { spins_ = kSpinsPerCheck - 1; }
    void fail(int err) {
        if (!status_) status_ = err;
    }

  private:
    // One step of the current chunk (shm_barrier.cpp, shm_broadcast.cpp, shm_reduce.cpp):
    // true once the chunk is complete, false while it waits on other members.
    bool barrier_step();
    bool broadcast_step();
    bool reduce_step(bool all);
    bool block_step();  // shm_blocks.cpp
    // Another member's progress holds us: rarely, see whether one of them died.
    void waiting();
    static constexpr uint32_t kSpinsPerCheck = 1024;

    ShmGroup &g_;
    Args a_;
    const uint8_t *send_;
    uint8_t *recv_;
    uint64_t gen0_, gens_;
    uint64_t chunk_ = 0;  // index of the current one
    int phase_ = 0;       // within it
    uint32_t spins_ = 0;
    int status_ = 0;
    bool finished_ = false;

    uint64_t gen() const { return gen0_ + chunk_; }
    size_t offset() const { return chunk_ * ShmGroup::kChunk; }
    size_t chunk_bytes() const;
};

}  // namespace tandem::off::coll

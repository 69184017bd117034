// Who copies which part of a split copy. A large message or RMA write read with CMA is copied
// by both sides at once: the receiver reads the first part and asks the sender (Cts) to write
// the rest. If the sender has no core in time, the receiver takes its part back and reads it
// too, rather than wait for the sender to be scheduled. A claim table in the receiver's
// segment (after its ring) decides it: a word per slot, generation << 2 | state. The receiver
// opens a slot and names it in its Cts; the sender takes it before it writes its part, or the
// receiver takes it back: whoever takes it copies, the other never. A released slot comes
// back under its next generation, so that a late Cts of the old one finds it taken.
#pragma once

#include "common/wire.h"

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

namespace tandem::shm {

enum SplitClaim : uint64_t { kClaimFree = 0, kClaimOpen = 1, kClaimSender = 2, kClaimReceiver = 3 };
inline constexpr uint32_t kSplitClaims = 64;

// A claim as a Cts names it: slot << 32 | generation (wire::kLocalNoClaim: none).
using ClaimId = uint64_t;

// The receiver's side: the table in our own segment.
class SplitClaims {
  public:
    SplitClaims() = default;  // no table: open() never gives a claim
    // table: kSplitClaims words, all kClaimFree (a segment just made).
    explicit SplitClaims(std::atomic<uint64_t> *table);

    // A slot opened for a Cts, or nullopt when every slot is in use (copy it all then).
    std::optional<ClaimId> open();
    // After our part: true when we took the sender's part back (it had not begun: we read it
    // ourselves, and no WriteDone will come), false when the sender has it.
    bool take_back(ClaimId claim);
    // The split is over: the slot is free again under its next generation.
    void release(ClaimId claim);

    // The sender's side, in the receiver's table (nullptr: its segment has none): true when
    // the part is ours to write, false when the receiver took it back or the claim is not one
    // of that table's.
    static bool take_for_sender(std::atomic<uint64_t> *table, ClaimId claim);

  private:
    std::atomic<uint64_t> *table_ = nullptr;
    std::vector<uint32_t> generation_;  // of each slot
    std::vector<uint32_t> free_;        // slots free for a Cts
};

}  // namespace tandem::shm

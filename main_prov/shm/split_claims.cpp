#include "main_prov/shm/split_claims.h"

namespace tandem::shm {

namespace {

uint64_t word(uint32_t generation, SplitClaim state) {
    return uint64_t(generation) << 2 | state;
}

}  // namespace

SplitClaims::SplitClaims(std::atomic<uint64_t> *table)
    : table_(table), generation_(table ? kSplitClaims : 0, 0) {
    if (table_)
        for (uint32_t i = kSplitClaims; i-- > 0;) free_.push_back(i);
}

std::optional<ClaimId> SplitClaims::open() {
    if (free_.empty()) return std::nullopt;
    uint32_t slot = free_.back();
    free_.pop_back();
    uint32_t gen = generation_[slot];
    // Release: the slot is open before the Cts that names it can be read.
    table_[slot].store(word(gen, kClaimOpen), std::memory_order_release);
    return ClaimId(slot) << 32 | gen;
}

bool SplitClaims::take_back(ClaimId claim) {
    if (claim == wire::kLocalNoClaim) return false;
    uint32_t slot = uint32_t(claim >> 32), gen = uint32_t(claim);
    uint64_t open = word(gen, kClaimOpen);
    return table_[slot].compare_exchange_strong(open, word(gen, kClaimReceiver),
                                                std::memory_order_acq_rel);
}

void SplitClaims::release(ClaimId claim) {
    if (claim == wire::kLocalNoClaim) return;
    uint32_t slot = uint32_t(claim >> 32);
    uint32_t gen = ++generation_[slot];
    table_[slot].store(word(gen, kClaimFree), std::memory_order_release);
    free_.push_back(slot);
}

bool SplitClaims::take_for_sender(std::atomic<uint64_t> *table, ClaimId claim) {
    uint32_t slot = uint32_t(claim >> 32), gen = uint32_t(claim);
    if (!table || slot >= kSplitClaims) return false;
    uint64_t open = word(gen, kClaimOpen);
    return table[slot].compare_exchange_strong(open, word(gen, kClaimSender),
                                               std::memory_order_acq_rel);
}

}  // namespace tandem::shm

// When a node-local peer whose process is gone counts as dead: what waits on it may then fail
// (FI_ECONNRESET) instead of hanging, and nothing more goes to it.
//
// A process that answered and then exited (a receiver's Fin, then its exit) must not fail the
// operation its answer completes: the answer may still be in our inbox, unread, when its
// death is seen (a progress pass reads a bounded batch of cells, and the death may come
// between the read and the check). So the verdict waits until our inbox has been read past
// every cell claimed in it when the death was seen (ShmRing::claimed_end), which holds all
// the dead process ever wrote to us.
#pragma once

#include "common/shm_ring.h"
#include "main_prov/shm/shm_segment.h"

#include <cstdint>

namespace tandem::shm {

class DeathVerdict {
  public:
    enum class State : uint8_t {
        kAlive,     // its owner runs (asked until its death is seen, never after)
        kDraining,  // gone, and our inbox still holds cells it may have written: ask again soon
        kDead,      // gone, and all it wrote to us is read
    };
    // peer: the peer's segment; inbox: ours (nullptr: we have none, nothing to drain).
    State judge(const ShmSegment &peer, ShmRing *inbox) {
        if (!seen_) {
            if (peer.owner_alive()) return State::kAlive;
            seen_ = true;
            if (inbox) drain_to_ = inbox->claimed_end();
        }
        return inbox && inbox->consumed() < drain_to_ ? State::kDraining : State::kDead;
    }

  private:
    bool seen_ = false;
    uint64_t drain_to_ = 0;  // our inbox's claimed_end() when the death was seen
};

}  // namespace tandem::shm

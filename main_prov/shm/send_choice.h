// How a node-local host message of more than a cell travels: staged through the peer's ring a
// cell at a time (Frag), or by single copy (an Rts whose buffers the receiver reads with
// cross-memory attach), from what copying costs here and what this receiver's Fins taught us.
// Both providers' senders ask it (tandem for its messages, off_tandem for an owner that is not
// tandem), so a peer is judged one way.
#pragma once

#include "main_prov/shm/peer_inbox.h"

#include <cstddef>
#include <cstdint>

namespace tandem::shm {

// A device message staged by the sender's device (no IPC handle, or the policy stages it) of
// more than a cell and up to this size goes through one host bounce that the receiver reads
// with cross-memory attach (an Rts); larger ones through cells, so that no sender holds a
// bounce of unbounded size. Both providers' senders of device memory use it.
inline constexpr size_t kDeviceBounceMax = 64u << 20;

// Whether the peer has polled within the last kPeerPollMs, as far as its heartbeat (of the
// coarse clock, a tick or so behind) tells.
inline constexpr uint32_t kPeerPollMs = 6;
bool peer_polls(const PeerInbox &peer);

// True: staged. False: single copy, *rts_ns its expected cost (what the Fin's lateness is
// measured against, learn_lateness). Only for a peer we may read with CMA (peer.cma).
bool stages_better(PeerInbox &peer, size_t len, double *rts_ns);

// An Rts's Fin came (posted at posted_ns, expected to take expected_ns): how much later it
// came than its copy's cost is the receiver's lateness, averaged into the peer's.
void learn_lateness(PeerInbox &peer, int64_t posted_ns, double expected_ns);

int64_t now_ns();  // the steady clock

}  // namespace tandem::shm

// Private to off_tandem's endpoint (offload_prov/endpoint.cpp and offload_prov/ep/): try_push,
// defined here so that the sends (ep/send.cpp) inline it as the cell path (ep/cell_send.cpp)
// does. (The segment's layout and names are the channel's: main_prov/shm/inbox_segment.h.)
#pragma once

#include "offload_prov/endpoint.h"
#include "common/test_hook.h"
#include "main_prov/shm/inbox_segment.h"

#include <atomic>
#include <cstdint>
#include <string>

namespace tandem::off {

// The cell straight into the peer's inbox, if it can go now: nothing waits for room before
// it (order) and the ring has a free cell. False, with nothing written, otherwise.
inline bool Endpoint::try_push(PeerLink &link, const wire::LocalHeader &hdr, const iovec *iov,
                               size_t count, size_t offset, size_t len, const uint8_t *staged) {
    if (!link.backlog.empty()) return false;
    void *cell = link.ring->try_reserve(producer_id_, link.view);
    if (!cell) return false;
    stop_at("local.ring_reserved");
    fill_cell(static_cast<uint8_t *>(cell), hdr, iov, count, offset, len, staged);
    link.ring->publish(cell);
    notify(link);
    return true;
}

}  // namespace tandem::off

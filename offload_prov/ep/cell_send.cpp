// What off_tandem's endpoint does around the cells it sends (each link's shm::Outbox,
// main_prov/shm/outbox.h, writes them): the end of a stream of cells, the answer (Fin) to a
// peer's operation, and the sleep: arming the inbox and the liveness timer before it.
#include "offload_prov/endpoint.h"

#include "common/log.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tandem::off {

using wire::LocalHeader;
using wire::LocalOp;

void Endpoint::finish_stream(const shm::Stream &stream, int status) {
    switch (stream.end.kind) {
        case StreamEnd::Kind::None:
            return;
        case StreamEnd::Kind::CompleteTx:
            complete_tx(stream.end.context, stream.end.flags, stream.len, status);
            return;
        case StreamEnd::Kind::FailPending:
            if (status) finish_pending(stream.hdr.msg_id, status);
            return;
        case StreamEnd::Kind::ReadAccess:
            if (!status && owner_ep_ops_)
                owner_ep_ops_->access_done(owner_ep_, stream.end.rma_key, FI_REMOTE_READ);
            return;
    }
}

int Endpoint::arm() {
    if (!enabled_) return 0;
    shm::InboxWake *wake = channel_->wake();
    if (wake) wake->drain();
    ShmRing *inbox = channel_->inbox();
    bool pending = (inbox && !inbox->arm()) || !tx_done_.empty() || !cq_backlog_.empty() ||
                   sender_->backlogged;
    if (!wake) return pending ? 1 : 0;
    if (pending)
        wake->wake_self();
    else
        arm_liveness_timer();
    return pending ? 1 : 0;
}

// While operations wait on peers (an answer, a split copy's other half, an atomic's result),
// the sleep ends when their next liveness check is due; while collectives run, every
// kAsleepCheckMs for theirs (probes of silent members, node-local members' processes).
// Otherwise no timer runs.
void Endpoint::arm_liveness_timer() {
    const int64_t now = coarse_now_ms();
    int64_t due = INT64_MAX;
    if (waiting_on_peers()) due = next_check_ms_;
    if (coll_.busy()) {
        coll_.checks_due();
        due = std::min(due, now + coll::Engine::kAsleepCheckMs);
    }
    shm::InboxWake &wake = *channel_->wake();
    if (due != INT64_MAX)
        wake.set_timer(due - now);
    else if (wake.timer_set())
        wake.stop_timer();
}

void Endpoint::answer(std::string_view sender, uint64_t msg_id, int status) {
    channel_->answer(sender, msg_id, status);
}

}  // namespace tandem::off

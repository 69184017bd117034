// tandem's half of triggered operations and deferred work (fi_trigger(3)); off_tandem's half,
// the queue that holds them, is offload_prov/trigger/. A data call with FI_TRIGGER, or a
// work request of FI_QUEUE_WORK, is prepared here into a TriggeredOp (its request owns
// every list it needs) and handed to the queue as a peer::TriggerWork. When the condition is
// met the queue calls TriggeredOp::start, which issues the request on its endpoint as if it
// had just been posted; work that will never start is discarded through
// TriggeredOp::discard, which reports it as fi_cancel would.
#pragma once

#include "main_prov/tx_request.h"

#include <variant>

namespace tandem {

class Cntr;
class Domain;
class Engine;

// FI_OP_CNTR_SET / FI_OP_CNTR_ADD: deferred work on a counter alone.
struct CounterOpRequest {
    Cntr *cntr = nullptr;
    uint64_t value = 0;
    bool add = false;
};

using TriggeredRequest = std::variant<SendRequest, RecvRequest, RmaRequest, AtomicRequest,
                                      CounterOpRequest, CollRequest>;

// A deferred work request's operation, prepared (Domain::queue_work): the endpoint it runs on
// and what it does.
struct PreparedWork {
    Engine *ep = nullptr;
    TriggeredRequest request;
};

struct TriggeredOp {
    Domain *domain = nullptr;
    Engine *ep = nullptr;  // nullptr: a counter operation
    TriggeredRequest request;
    OwnedPayload owned;  // an FI_INJECT payload, copied when the operation was queued
    const void *match = nullptr;

    // peer::TriggerWork's callbacks (the caller holds the domain lock).
    static int start(void *arg);
    static void discard(void *arg, int err, bool report);
};

// The request's context, operation flags and deferred-work completion, whatever its kind.
void *context_of(const TriggeredRequest &r);
uint64_t flags_of(const TriggeredRequest &r);
const DeferredDone &done_of(const TriggeredRequest &r);
// Whether it is a receive (counted against rx_attr->size) rather than a transmit.
inline bool is_receive(const TriggeredRequest &r) {
    return std::holds_alternative<RecvRequest>(r);
}

}  // namespace tandem

#include "main_prov/rx_matcher.h"

#include "peer/peer_srx.h"

#include <new>

namespace tandem {

RxMatcher::~RxMatcher() {
    for (PostedQueue *q : {&posted_msg_, &posted_tag_}) {
        while (RxOp *rx = q->front()) {
            q->erase(rx);
            delete rx;
        }
    }
    for (RxOp *rx : spare_) delete rx;
    for (auto *list : {&unexpected_msg_, &unexpected_tag_})
        for (auto &ux : *list) delete ux.peer_entry;
}

bool RxMatcher::take_claimed(void *context, Unexpected &out) {
    for (auto *list : {&unexpected_tag_, &unexpected_msg_}) {
        for (auto it = list->begin(); it != list->end(); ++it) {
            if (!it->claimed || it->claim_context != context) continue;
            out = std::move(*it);
            list->erase(it);
            return true;
        }
    }
    return false;
}

void RxMatcher::erase_unexpected(Unexpected *ux) {
    auto &list = unexpected_for(ux->tagged());
    for (auto it = list.begin(); it != list.end(); ++it) {
        if (&*it == ux) {
            list.erase(it);
            return;
        }
    }
}

RxOp *RxMatcher::cancel(void *context) {
    for (PostedQueue *q : {&posted_msg_, &posted_tag_}) {
        for (RxOp *rx = q->front(); rx; rx = rx->posted_next) {
            if (rx->context != context) continue;
            q->erase(rx);
            return rx;
        }
    }
    return nullptr;
}

void RxMatcher::drop_posted() {
    for (bool tagged : {false, true})
        while (RxOp *rx = list_for(tagged).front()) {
            list_for(tagged).erase(rx);
            --outstanding;
            free_op(rx);
        }
}

// The entries of messages a peer held for the endpoint go too: its offload twin, closed
// first, no longer holds them.
void RxMatcher::forget_endpoint(Engine *ep) {
    for (auto *list : {&unexpected_msg_, &unexpected_tag_})
        list->remove_if([ep](const Unexpected &ux) {
            if (ux.ep != ep) return false;
            delete ux.peer_entry;
            return true;
        });
}

}  // namespace tandem

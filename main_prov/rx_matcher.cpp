#include "main_prov/rx_matcher.h"

#include "peer/peer_srx.h"

namespace tandem {

namespace {

struct RxOpPool {
    std::vector<void *> spare;
    ~RxOpPool() {
        for (void *p : spare) ::operator delete(p);
    }
};
thread_local RxOpPool g_rx_pool;
constexpr size_t kRxPoolMax = 1024;

}  // namespace

void *RxOp::operator new(size_t size) {
    if (size == sizeof(RxOp) && !g_rx_pool.spare.empty()) {
        void *p = g_rx_pool.spare.back();
        g_rx_pool.spare.pop_back();
        return p;
    }
    return ::operator new(size);
}

void RxOp::operator delete(void *p, size_t size) noexcept {
    if (!p) return;
    if (size == sizeof(RxOp) && g_rx_pool.spare.size() < kRxPoolMax) {
        try {
            g_rx_pool.spare.push_back(p);
            return;
        } catch (...) {
        }
    }
    ::operator delete(p);
}

RxMatcher::~RxMatcher() {
    for (auto *rx : posted_msg_) delete rx;
    for (auto *rx : posted_tag_) delete rx;
    for (auto *list : {&unexpected_msg_, &unexpected_tag_})
        for (auto &ux : *list) delete ux.peer_entry;
}

RxOp *RxMatcher::match_posted(bool tagged, uint64_t tag, fi_addr_t src) {
    auto &list = list_for(tagged);
    for (auto it = list.begin(); it != list.end(); ++it) {
        RxOp *rx = *it;
        if (tagged && !rx->matches_tag(tag)) continue;
        if (!rx->matches_src(src)) continue;
        if (!rx->multi) list.erase(it);
        return rx;
    }
    return nullptr;
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
    for (auto *list : {&posted_msg_, &posted_tag_}) {
        for (auto it = list->begin(); it != list->end(); ++it) {
            if ((*it)->context != context) continue;
            RxOp *rx = *it;
            list->erase(it);
            return rx;
        }
    }
    return nullptr;
}

// The entries of messages a peer held for the endpoint go too: its offload twin, closed
// first, no longer holds them.
void RxMatcher::forget_endpoint(Endpoint *ep) {
    for (auto *list : {&unexpected_msg_, &unexpected_tag_})
        list->remove_if([ep](const Unexpected &ux) {
            if (ux.ep != ep) return false;
            delete ux.peer_entry;
            return true;
        });
}

}  // namespace tandem

// Data operations captured from a call: the *prepare* step of every transmit (and of a
// deferred receive). A request holds the call's arguments, checked, and its own copies of
// the lists the call pointed into (iov, descriptors, ioc lists), so that it can be *issued*
// now, or later from progress (a triggered operation, deferred work) once the caller's
// arrays are gone. The buffers the lists name stay the application's, as fi_trigger(3)
// says, except for FI_INJECT, whose payload a deferred request copies (own_payload).
#pragma once

#include "hmem/atomic.h"
#include "main_prov/rx_matcher.h"
#include "peer/peer_coll.h"

#include <rdma/fi_atomic.h>
#include <rdma/fi_errno.h>

#include <cstdint>
#include <vector>

namespace tandem {

class Cntr;

// Operation flag internal to tandem (bit 63 is no FI_* operation flag): fi_inject and friends,
// which generate no completion entry.
inline constexpr uint64_t kNoCompletion = 1ull << 63;

// An atomic call of any form (fi_atomic(3)): the message (its rma_iov_count is 1), and for
// the fetch and compare kinds the result list, for the compare kind the compare list.
struct AtomicCall {
    fi_msg_atomic msg;
    atomic::Kind kind;
    uint64_t flags;
    const fi_ioc *compare = nullptr;
    void **compare_desc = nullptr;
    size_t compare_count = 0;
    fi_ioc *result = nullptr;  // (the API takes the result list as non-const)
    void **result_desc = nullptr;
    size_t result_count = 0;

    AtomicCall &with_compare(const fi_ioc *ioc, void **desc, size_t count) {
        compare = ioc;
        compare_desc = desc;
        compare_count = count;
        return *this;
    }
    AtomicCall &with_result(fi_ioc *ioc, void **desc, size_t count) {
        result = ioc;
        result_desc = desc;
        result_count = count;
        return *this;
    }
};

// How an operation completes when it is deferred work (FI_QUEUE_WORK, fi_trigger(3)): not
// on its endpoint's CQ unless it asked for FI_COMPLETION, not on the endpoint's counters, and
// by one increment of its own completion counter (when it names one).
struct DeferredDone {
    bool deferred = false;
    Cntr *cntr = nullptr;
};

// An iov list with its descriptors, copied. Only the first count entries are written.
struct IovList {
    size_t count = 0;
    size_t len = 0;
    bool has_desc = false;
    iovec iov[kMaxIov];
    void *desc[kMaxIov];

    // 0, or -FI_EINVAL for a list tandem does not take (null with entries, too long).
    int capture(const iovec *list, void *const *descs, size_t n) {
        if ((n && !list) || n > kMaxIov) return -FI_EINVAL;
        count = n;
        has_desc = descs != nullptr;
        len = 0;
        for (size_t i = 0; i < n; ++i) {
            iov[i] = list[i];
            desc[i] = descs ? descs[i] : nullptr;
            len += list[i].iov_len;
        }
        return 0;
    }
    void **descs() { return has_desc ? desc : nullptr; }
};

struct SendRequest {
    DeferredDone done;
    IovList payload;
    fi_addr_t dest = FI_ADDR_UNSPEC;
    void *context = nullptr;
    uint64_t flags = 0;
    uint64_t tag = 0;
    uint64_t data = 0;
    bool tagged = false;
};

struct RecvRequest {
    DeferredDone done;
    IovList buffers;
    fi_addr_t src = FI_ADDR_UNSPEC;
    void *context = nullptr;
    uint64_t flags = 0;
    uint64_t tag = 0;
    uint64_t ignore = 0;
    bool tagged = false;
};

struct RmaRequest {
    DeferredDone done;
    IovList local;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    uint64_t addr = 0;
    uint64_t key = 0;
    void *context = nullptr;
    uint64_t flags = 0;
    uint64_t data = 0;
    bool write = false;
};

// An atomic call of any kind with its lists copied; view() is the call pointing into them.
struct AtomicRequest {
    DeferredDone done;
    atomic::Kind kind = atomic::Kind::Base;
    uint64_t flags = 0;
    fi_msg_atomic msg{};  // msg_iov, desc and rma_iov are set by view()
    bool has_desc = false, has_compare_desc = false, has_result_desc = false;
    fi_rma_ioc rma{};
    fi_ioc operand[kMaxIov]{};
    void *desc[kMaxIov]{};
    size_t compare_count = 0, result_count = 0;
    fi_ioc compare[kMaxIov]{};
    void *compare_desc[kMaxIov]{};
    fi_ioc result[kMaxIov]{};
    void *result_desc[kMaxIov]{};

    // 0, or -FI_EINVAL for lists tandem does not take (atomic::check_call checks the rest).
    int capture(const AtomicCall &a);
    AtomicCall view();
};

// What a deferred request keeps of an FI_INJECT payload: the bytes, read when the request is
// captured (the application may reuse its buffer once the call returns).
// A collective call (fi_collective(3)), checked: its group and what the twin runs
// (work.arg / work.done are filled when it is issued). The buffers stay the application's
// until the operation completes, as for any collective.
class CollGroup;
struct CollRequest {
    CollGroup *group = nullptr;
    peer::CollWork work;
    void *context = nullptr;
    uint64_t flags = 0;
    DeferredDone done;
};

struct OwnedPayload {
    std::vector<uint8_t> bytes;
    bool device = false;  // copied from device memory (the request is then host memory)
};

}  // namespace tandem

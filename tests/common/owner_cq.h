// A CQ owner written by a test (fi_peer(3), "PEER CQ"): the fid_peer_cq a provider under test
// writes its completions into, recording each one it takes. With refuse_alternate, every other
// call is refused (-FI_EAGAIN), so that each completion must be written again to be taken.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include "tests/common/peer_structs.h"

#include <cstddef>
#include <vector>

namespace tandem_test {

struct OwnerCq {
    fid_peer_cq cq{};
    fi_ops_cq_owner ops{};
    bool refuse_alternate = false;
    bool refuse_next = true;
    size_t refused = 0;
    struct Entry {
        bool err;
        void *context;
        uint64_t flags;
        size_t len;
        uint64_t tag;
        fi_addr_t src;
        int error;
    };
    std::vector<Entry> taken;

    explicit OwnerCq(bool refuse_alternate_calls = false)
        : refuse_alternate(refuse_alternate_calls) {
        ops.size = sizeof ops;
        ops.write = [](fid_peer_cq *cq, void *context, uint64_t flags, size_t len, void *, uint64_t,
                       uint64_t tag, fi_addr_t src) -> ssize_t {
            auto *self = reinterpret_cast<OwnerCq *>(cq);
            if (self->refuse()) return -FI_EAGAIN;
            self->taken.push_back({false, context, flags, len, tag, src, 0});
            return 0;
        };
        ops.writeerr = [](fid_peer_cq *cq, const fi_cq_err_entry *e) -> ssize_t {
            auto *self = reinterpret_cast<OwnerCq *>(cq);
            if (self->refuse()) return -FI_EAGAIN;
            self->taken.push_back(
                {true, e->op_context, e->flags, e->len, e->tag, FI_ADDR_NOTAVAIL, e->err});
            return 0;
        };
        cq.fid.fclass = FI_CLASS_PEER_CQ;
        cq.owner_ops = &ops;
    }
    bool refuse() {
        if (!refuse_alternate) return false;
        bool no = refuse_next;
        refuse_next = !refuse_next;
        refused += no;
        return no;
    }
    // How many completions taken have this flag.
    size_t count(uint64_t flag) const {
        size_t n = 0;
        for (const Entry &e : taken) n += (e.flags & flag) != 0;
        return n;
    }
};

}  // namespace tandem_test

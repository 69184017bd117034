// Node-local allreduce and reduce (ShmGroup). Per chunk:
//  1. every member copies its input into its slot and announces it (arrived);
//  2. short vectors (one chunk, at most kWhole bytes): each member that wants the result
//     reduces the whole chunk itself from all slots, in rank order, straight into its output.
//     Longer ones: member r reduces its r-th part of the chunk (count / n elements) from all
//     slots, in rank order, into the shared result and announces it (reduced);
//  3. once every part is there, each member that wants the result copies it out.
// Every element is reduced by exactly one member in rank order (or by each, identically, in
// rank order), so every member ends with the same bits, as with the message algorithms.
#include "hmem/atomic.h"
#include "offload_prov/coll/schedule_build.h"
#include "offload_prov/coll/shm_group.h"

#include <rdma/fi_errno.h>

#include <cstring>

namespace tandem::off::coll {

namespace {

// Up to this many bytes every member reduces the whole vector: the n reads of a few cache
// lines cost less than a second round of announcements.
constexpr size_t kWhole = 4096;

// dst = slot 0 op slot 1 op ... op slot n-1 over [offset, offset + len) of the chunk.
int reduce_slots(const ShmGroup &g, uint64_t gen, const Args &a, uint8_t *dst, size_t offset,
                 size_t len) {
    if (!len) return 0;
    memcpy(dst, g.slot(0, gen) + offset, len);
    for (uint32_t r = 1; r < g.size(); ++r)
        if (atomic::reduce(a.op, a.datatype, dst, g.slot(r, gen) + offset, len / a.elem))
            return FI_EINVAL;
    return 0;
}

}  // namespace

bool ShmOp::reduce_step(bool all) {
    ShmGroup::Ctl &me = g_.ctl(g_.rank());
    const bool wants = all || g_.rank() == a_.root;
    const size_t len = chunk_bytes();
    const bool whole = gens_ == 1 && len <= kWhole;
    switch (phase_) {
        case 0:
            if (gen() > 2 && !g_.all_reached(&ShmGroup::Ctl::done, gen() - 2)) return false;
            if (len) memcpy(g_.slot(g_.rank(), gen()), send_ + offset(), len);
            me.arrived.store(gen(), std::memory_order_release);
            phase_ = 1;
            [[fallthrough]];
        case 1: {
            if (!g_.all_reached(&ShmGroup::Ctl::arrived, gen())) return false;
            if (whole) {
                if (wants)
                    if (int err = reduce_slots(g_, gen(), a_, recv_ + offset(), 0, len)) fail(err);
                me.done.store(gen(), std::memory_order_release);
                return true;
            }
            const Blocks parts{len / a_.elem, g_.size()};
            const size_t start = parts.start(g_.rank()) * a_.elem;
            if (int err = reduce_slots(g_, gen(), a_, g_.result(gen()) + start, start,
                                       parts.len(g_.rank()) * a_.elem))
                fail(err);
            me.reduced.store(gen(), std::memory_order_release);
            phase_ = 2;
            [[fallthrough]];
        }
        case 2:
            if (!g_.all_reached(&ShmGroup::Ctl::reduced, gen())) return false;
            if (wants && len) memcpy(recv_ + offset(), g_.result(gen()), len);
            me.done.store(gen(), std::memory_order_release);
            return true;
    }
    return false;
}

}  // namespace tandem::off::coll

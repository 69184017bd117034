// Node-local collectives that move blocks (ShmGroup): allgather, gather, scatter, alltoall and
// reduce-scatter. A chunk is one piece of every block at the same offset:
//  - allgather, gather: each member copies its piece into its slot; then each member (the
//    root alone for gather) copies every member's piece into place;
//  - scatter: the root copies member r's piece into slot r; each member copies out its own;
//  - alltoall, reduce-scatter: a slot holds n sub-slots, one per destination; each member
//    copies its piece for member j into sub-slot j of its own slot; then member r takes
//    sub-slot r of every slot: copied into place (alltoall), or reduced in rank order into
//    its result (reduce-scatter).
// One copy into shared memory and one out per byte, as for the reductions.
#include "hmem/atomic.h"
#include "offload_prov/coll/shm_group.h"

#include <rdma/fi_errno.h>

#include <cstring>

namespace tandem::off::coll {

// Bytes of each block a chunk carries: a whole slot, or a sub-slot when a slot holds a piece
// for every member (kept a multiple of 64, which every element size divides).
size_t ShmOp::piece_bytes(fi_collective_op coll, uint32_t n) {
    if (coll == FI_ALLTOALL || coll == FI_REDUCE_SCATTER) return ShmGroup::kChunk / n / 64 * 64;
    return ShmGroup::kChunk;
}

bool ShmOp::block_step() {
    ShmGroup::Ctl &me = g_.ctl(g_.rank());
    const uint32_t n = g_.size(), r = g_.rank();
    const size_t block = a_.bytes();
    const size_t piece = piece_bytes(a_.coll, n);
    const size_t off = chunk_ * piece;
    const size_t len = block - off < piece ? block - off : piece;
    const bool root = r == a_.root;
    if (phase_ == 0) {
        const bool writes = a_.coll != FI_SCATTER || root;
        if (writes && gen() > 2 && !g_.all_reached(&ShmGroup::Ctl::done, gen() - 2)) return false;
        switch (a_.coll) {
            case FI_ALLGATHER:
            case FI_GATHER:
                memcpy(g_.slot(r, gen()), send_ + off, len);
                break;
            case FI_SCATTER:
                if (root)
                    for (uint32_t m = 0; m < n; ++m)
                        memcpy(g_.slot(m, gen()), send_ + m * block + off, len);
                break;
            default:  // alltoall, reduce-scatter
                for (uint32_t m = 0; m < n; ++m)
                    memcpy(g_.slot(r, gen()) + m * piece, send_ + m * block + off, len);
                break;
        }
        me.arrived.store(gen(), std::memory_order_release);
        phase_ = 1;
    }
    if (a_.coll == FI_SCATTER) {
        if (g_.ctl(a_.root).arrived.load(std::memory_order_acquire) < gen()) return false;
    } else if (!g_.all_reached(&ShmGroup::Ctl::arrived, gen())) {
        return false;
    }
    switch (a_.coll) {
        case FI_ALLGATHER:
        case FI_GATHER:
            if (a_.coll == FI_ALLGATHER || root)
                for (uint32_t m = 0; m < n; ++m)
                    memcpy(recv_ + m * block + off, g_.slot(m, gen()), len);
            break;
        case FI_SCATTER:
            memcpy(recv_ + off, g_.slot(r, gen()), len);
            break;
        case FI_ALLTOALL:
            for (uint32_t m = 0; m < n; ++m)
                memcpy(recv_ + m * block + off, g_.slot(m, gen()) + r * piece, len);
            break;
        default: {  // reduce-scatter: sub-slot r of every member, in rank order
            uint8_t *out = recv_ + off;
            memcpy(out, g_.slot(0, gen()) + r * piece, len);
            for (uint32_t m = 1; m < n; ++m)
                if (atomic::reduce(a_.op, a_.datatype, out, g_.slot(m, gen()) + r * piece,
                                   len / a_.elem))
                    fail(FI_EINVAL);
            break;
        }
    }
    me.done.store(gen(), std::memory_order_release);
    return true;
}

}  // namespace tandem::off::coll

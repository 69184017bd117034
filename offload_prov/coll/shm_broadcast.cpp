// Node-local broadcast (ShmGroup): the root copies each chunk into the shared result half of
// its generation, the others copy it out. One copy in, one copy out per member.
#include "offload_prov/coll/shm_group.h"

#include <cstring>

namespace tandem::off::coll {

bool ShmOp::broadcast_step() {
    ShmGroup::Ctl &me = g_.ctl(g_.rank());
    const ShmGroup::Ctl &root = g_.ctl(a_.root);
    const size_t len = chunk_bytes();
    if (g_.rank() == a_.root) {
        // The half is free once every member is done with the chunk two generations back.
        if (gen() > 2 && !g_.all_reached(&ShmGroup::Ctl::done, gen() - 2)) return false;
        if (len) memcpy(g_.result(gen()), recv_ + offset(), len);
        me.arrived.store(gen(), std::memory_order_release);
    } else {
        if (root.arrived.load(std::memory_order_acquire) < gen()) return false;
        if (len) memcpy(recv_ + offset(), g_.result(gen()), len);
    }
    me.done.store(gen(), std::memory_order_release);
    return true;
}

}  // namespace tandem::off::coll

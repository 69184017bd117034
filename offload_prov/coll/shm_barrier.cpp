// Node-local barrier (ShmGroup): each member announces the generation and waits until every
// member has announced it. One cache line written per member, n read.
#include "offload_prov/coll/shm_group.h"

namespace tandem::off::coll {

bool ShmOp::barrier_step() {
    ShmGroup::Ctl &me = g_.ctl(g_.rank());
    if (phase_ == 0) {
        me.arrived.store(gen(), std::memory_order_release);
        phase_ = 1;
    }
    if (!g_.all_reached(&ShmGroup::Ctl::arrived, gen())) return false;
    me.done.store(gen(), std::memory_order_release);
    return true;
}

}  // namespace tandem::off::coll

#include "offload_prov/config.h"

#include "common/params.h"
#include "common/wire.h"

namespace tandem::off {

namespace {
Config g_config;
}

const Config &Config::get() {
    return g_config;
}

void Config::load(fi_provider *prov) {
    ParamReader p(prov);
    g_config.cma = p.flag("cma",
                          "Move large node-local messages in one copy with cross-memory attach "
                          "(process_vm_readv); off: stage them through the shared ring",
                          true);
    g_config.ring_cells = p.size("ring_cells",
                                 "Cells of an endpoint's shared-memory inbox (a power of two; "
                                 "each holds 8 KiB)",
                                 256);
    size_t cells = 16;
    while (cells < g_config.ring_cells && cells < (1u << 16)) cells <<= 1;
    g_config.ring_cells = cells;
    g_config.eager_limit = wire::kLocalBodyRoom;
    g_config.coll_allreduce_ring_min =
        p.size("coll_allreduce_ring_min",
               "Bytes from which fi_allreduce runs the ring (reduce-scatter + allgather) "
               "instead of recursive doubling",
               64u << 10);
    g_config.coll_allgather_ring_min =
        p.size("coll_allgather_ring_min",
               "Bytes per member from which fi_allgather runs the ring instead of Bruck's "
               "algorithm",
               32u << 10);
}

}  // namespace tandem::off

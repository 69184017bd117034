// off_tandem's parameters (fi_param: FI_OFF_TANDEM_<NAME>, listed by `fi_info -e`).
#pragma once

#include <rdma/providers/fi_prov.h>

#include <cstddef>
#include <cstdint>

namespace tandem::off {

struct Config {
    bool cma = true;          // single copy by cross-memory attach when the kernel permits
    uint64_t job = 0;         // this process's job (digest; 0: none named): CMA stays inside it
    size_t ring_cells = 256;  // inbox cells per endpoint (each wire::kLocalCellSize bytes)
    size_t eager_limit = 0;   // largest message sent inline (fits one cell)
    // Collectives: from these sizes (bytes) allreduce, and allgather (per rank), take the
    // ring rather than recursive doubling / Bruck (offload_prov/coll/selection.cpp).
    size_t coll_allreduce_ring_min = 64u << 10;
    size_t coll_allgather_ring_min = 32u << 10;

    static const Config &get();
    static void load(fi_provider *prov);
};

}  // namespace tandem::off

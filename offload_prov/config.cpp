#include "offload_prov/config.h"

#include "common/auth_key.h"
#include "common/params.h"
#include "common/wire.h"

#include <cstdlib>
#include <string>

namespace tandem::off {

namespace {
Config g_config;

// The job the launcher says this process belongs to: a PMIx namespace (Open MPI, Slurm with
// PMIx, PRRTE), Open MPI's own job id, or a Slurm job step; empty when none did.
std::string launcher_job() {
    if (const char *ns = getenv("PMIX_NAMESPACE"); ns && *ns) return std::string("pmix:") + ns;
    if (const char *id = getenv("OMPI_MCA_orte_ess_jobid"); id && *id)
        return std::string("orte:") + id;
    if (const char *job = getenv("SLURM_JOB_ID"); job && *job) {
        const char *step = getenv("SLURM_STEP_ID");
        return std::string("slurm:") + job + "." + (step ? step : "");
    }
    return {};
}
}  // namespace

const Config &Config::get() {
    return g_config;
}

void Config::load(fi_provider *prov) {
    ParamReader p(prov);
    g_config.cma = p.flag("cma",
                          "Move large node-local messages in one copy with cross-memory attach "
                          "(process_vm_readv); off: stage them through the shared ring",
                          true);
    // Cross-memory attach reads and writes another process's memory with only the kernel's
    // ptrace check between them: any process of the same user passes it. It is used only
    // between processes of one job, as the launcher names it, so that a job never reaches
    // into another's memory on a shared node.
    std::string job = p.text("job",
                             "The job this process belongs to: single copy by cross-memory "
                             "attach is used only between processes of the same job (others "
                             "are staged). Empty (the default): the launcher's job, from "
                             "PMIX_NAMESPACE, OMPI_MCA_orte_ess_jobid or "
                             "SLURM_JOB_ID.SLURM_STEP_ID; processes no launcher started are "
                             "of one job",
                             "");
    if (job.empty()) job = launcher_job();
    g_config.job = job.empty()
                       ? 0
                       : auth_key_digest(reinterpret_cast<const uint8_t *>(job.data()), job.size());
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

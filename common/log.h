// Every log line of tandem goes through fi_log so that FI_LOG_LEVEL / FI_LOG_PROV /
// FI_LOG_SUBSYS work as users expect. Each provider library names itself once at load.
#pragma once

#include <rdma/fabric.h>
#include <rdma/providers/fi_log.h>

namespace tandem {

const fi_provider *log_provider() noexcept;
void set_log_provider(const fi_provider *prov) noexcept;

}  // namespace tandem

// Quiet until a provider named itself (code under unit test runs without one).
#define TANDEM_LOG(level, subsys, ...)                                    \
    do {                                                                  \
        if (::tandem::log_provider())                                     \
            FI_LOG(::tandem::log_provider(), level, subsys, __VA_ARGS__); \
    } while (0)
#define TANDEM_WARN(subsys, ...) TANDEM_LOG(FI_LOG_WARN, subsys, __VA_ARGS__)
#define TANDEM_INFO(subsys, ...) TANDEM_LOG(FI_LOG_INFO, subsys, __VA_ARGS__)
#define TANDEM_DEBUG(subsys, ...) TANDEM_LOG(FI_LOG_DEBUG, subsys, __VA_ARGS__)

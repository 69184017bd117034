#include "log.h"

#include "fabric_error.h"

#include <atomic>

namespace tandem {

namespace {
std::atomic<const fi_provider *> g_provider{nullptr};
}

const fi_provider *log_provider() noexcept {
    return g_provider.load(std::memory_order_relaxed);
}
void set_log_provider(const fi_provider *prov) noexcept {
    g_provider.store(prov);
}

int current_exception_errno() noexcept {
    try {
        throw;
    } catch (const FabricError &e) {
        TANDEM_DEBUG(FI_LOG_CORE, "%s (%s)\n", e.what(), fi_strerror(e.code()));
        return -e.code();
    } catch (const std::bad_alloc &) {
        return -FI_ENOMEM;
    } catch (const std::exception &e) {
        TANDEM_WARN(FI_LOG_CORE, "internal error: %s\n", e.what());
        return -FI_EOTHER;
    } catch (...) {
        TANDEM_WARN(FI_LOG_CORE, "internal error: unknown exception\n");
        return -FI_EOTHER;
    }
}

}  // namespace tandem

#include "common/fabric_compat.h"

namespace tandem::compat {

uint32_t core_version() {
    // fi_version() of the libfabric in this process: the core that loaded us, whichever
    // release it is (it never changes while we are loaded).
    static const uint32_t version = fi_version();
    return version;
}

}  // namespace tandem::compat

// The progress model the tests' variants ask for: TANDEM_TEST_PROGRESS=auto makes every
// domain a test opens ask for FI_PROGRESS_AUTO for control and data (the api_auto.*,
// peer.*.auto.* and hmem.emu_auto.* variants: tandem's progress thread runs beside every call).
#pragma once

#include <rdma/fabric.h>

#include <cstdlib>
#include <cstring>

namespace tandem_test {

inline fi_progress test_progress() {
    const char *p = std::getenv("TANDEM_TEST_PROGRESS");
    return p && std::strcmp(p, "auto") == 0 ? FI_PROGRESS_AUTO : FI_PROGRESS_UNSPEC;
}

// Sets the hints' progress fields to what the variant asks for (left alone otherwise).
inline void ask_test_progress(fi_domain_attr *d) {
    if (test_progress() != FI_PROGRESS_AUTO) return;
    d->control_progress = FI_PROGRESS_AUTO;
    d->data_progress = FI_PROGRESS_AUTO;
}

}  // namespace tandem_test

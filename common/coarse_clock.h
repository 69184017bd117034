// The clock progress loops read to pace their periodic checks (peer liveness, the listener):
// CLOCK_MONOTONIC_COARSE, the kernel's last tick, which the vDSO returns without reading a
// clock source. A precise read costs tens of nanoseconds where the clock source is a
// paravirtual one (kvm-clock), which showed up as a tenth of a busy node-local transfer loop;
// the checks need milliseconds.
#pragma once

#include <ctime>

#include <cstdint>

namespace tandem {

inline int64_t coarse_now_ms() {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return int64_t(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
}

// A sleeper's limit for a timer due at `due` (coarse_now_ms): the milliseconds left, at least
// 1 (the coarse clock may lag the sleep's own); -1 for no timer (due < 0).
inline int ms_until(int64_t due) {
    if (due < 0) return -1;
    const int64_t left = due - coarse_now_ms();
    return left < 1 ? 1 : left > 3600000 ? 3600000 : static_cast<int>(left);
}

}  // namespace tandem

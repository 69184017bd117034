// An environment variable set for one scope (a test of this process), then unset: for the
// settings tandem reads at each use, as the test hooks (common/test_hook.h) do.
#pragma once

#include <cstdlib>

namespace tandem_test {

struct ScopedEnv {
    const char *name;
    ScopedEnv(const char *n, const char *value) : name(n) { setenv(n, value, 1); }
    ~ScopedEnv() { unsetenv(name); }
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv &operator=(const ScopedEnv &) = delete;
};

}  // namespace tandem_test

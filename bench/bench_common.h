// What the benchmark programs share: reading a size as users write it, and their error exits.
#pragma once

#include <rdma/fi_errno.h>

#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem_bench {

// Who speaks in error messages: the program ("tandem_bench") and the part this process plays
// ("client", "local/auto receiver").
inline const char *g_program = "bench";
inline char g_role[64] = "bench";
inline void set_role(const char *role) {
    std::snprintf(g_role, sizeof g_role, "%s", role);
}

// "<program>[<role>]: error: <message>" on stderr, then exit status 2.
[[noreturn, gnu::format(printf, 1, 2)]] inline void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "%s[%s]: error: ", g_program, g_role);
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    std::fflush(nullptr);
    std::_Exit(2);
}

// Dies when a libfabric call returned a negative fabric errno.
inline void check_fi(int64_t rc, const char *what) {
    if (rc < 0) die("%s: %s (%" PRId64 ")", what, fi_strerror(static_cast<int>(-rc)), rc);
}

// "64k", "1M", "16MiB", "4096": bytes. False for anything else.
inline bool parse_size(const std::string &s, uint64_t *out) {
    if (s.empty()) return false;
    char *end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (errno || end == s.c_str()) return false;
    uint64_t mult = 1;
    if (*end) {
        switch (*end) {
            case 'k':
            case 'K':
                mult = 1ull << 10;
                break;
            case 'm':
            case 'M':
                mult = 1ull << 20;
                break;
            case 'g':
            case 'G':
                mult = 1ull << 30;
                break;
            default:
                return false;
        }
        ++end;
        if (*end == 'i' || *end == 'I') ++end;
        if (*end == 'b' || *end == 'B') ++end;
        if (*end) return false;
    }
    *out = v * mult;
    return true;
}

}  // namespace tandem_bench

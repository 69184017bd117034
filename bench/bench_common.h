// What the benchmark programs share: reading a size as users write it.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace tandem_bench {

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

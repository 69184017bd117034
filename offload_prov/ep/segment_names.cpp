// Where node-local endpoints meet in /dev/shm: the key an endpoint's address maps to, the
// names of its segment and wake FIFO made from that key, and the removal of what dead
// processes left there. Functions of an address and the user alone, shared by every endpoint.
#include "offload_prov/endpoint.h"

#include "common/log.h"
#include "offload_prov/ep/endpoint_internal.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

namespace tandem::off {

std::optional<std::string> local_key(const void *addr, size_t len) {
    if (!addr || len < sizeof(sa_family_t)) return std::nullopt;
    sa_family_t family;
    memcpy(&family, addr, sizeof family);
    char text[INET6_ADDRSTRLEN + 16];
    if (family == AF_INET && len >= sizeof(sockaddr_in)) {
        sockaddr_in sin;
        memcpy(&sin, addr, sizeof sin);
        snprintf(text, sizeof text, "4-%08x-%u", ntohl(sin.sin_addr.s_addr), ntohs(sin.sin_port));
        return std::string(text);
    }
    if (family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
        sockaddr_in6 sin6;
        memcpy(&sin6, addr, sizeof sin6);
        std::string key = "6-";
        for (uint8_t b : sin6.sin6_addr.s6_addr) {
            snprintf(text, sizeof text, "%02x", b);
            key += text;
        }
        snprintf(text, sizeof text, "-%u", ntohs(sin6.sin6_port));
        return key + text;
    }
    return std::nullopt;
}

std::string segment_prefix() {
    return "/tandem-" + std::to_string(geteuid()) + "-";
}

std::string segment_name(const std::string &key) {
    return segment_prefix() + key;
}

namespace detail {

// The wake FIFO of the endpoint with that key, beside its segment in /dev/shm.
std::string wake_path(const std::string &key) {
    return "/dev/shm" + segment_name(key) + ".wake";
}

// What processes that died without closing left in /dev/shm: their segments, then wake
// FIFOs without a segment (an endpoint creates its segment first and removes it last).
void reap_stale() {
    size_t n = ShmSegment::reap_stale(segment_prefix());
    const std::string suffix = ".wake";
    for (const std::string &name : ShmSegment::names_with_prefix(segment_prefix())) {
        if (!name.ends_with(suffix)) continue;
        std::string segment = "/dev/shm" + name.substr(0, name.size() - suffix.size());
        struct stat st;
        if (stat(segment.c_str(), &st) != 0 && errno == ENOENT &&
            unlink(("/dev/shm" + name).c_str()) == 0)
            ++n;
    }
    if (n) TANDEM_INFO(FI_LOG_EP_CTRL, "removed %zu leftovers of dead processes\n", n);
}

}  // namespace detail

}  // namespace tandem::off

// Value types that say what a number is.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <netinet/in.h>
#include <sys/socket.h>

namespace tandem {

using FabricAddr = fi_addr_t;  // an index or map value in an address vector
using Tag = uint64_t;
using RemoteKey = uint64_t;

// An endpoint name on the TCP link: an IPv4 or IPv6 socket address.
struct EndpointName {
    sockaddr_storage ss{};

    static socklen_t length_of(const sockaddr *sa) {
        return sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    }
    socklen_t length() const { return length_of(reinterpret_cast<const sockaddr *>(&ss)); }
    const sockaddr *sa() const { return reinterpret_cast<const sockaddr *>(&ss); }
    sockaddr *sa() { return reinterpret_cast<sockaddr *>(&ss); }
    // A key that identifies the name (family, address, port), for maps.
    std::string key() const { return std::string(reinterpret_cast<const char *>(&ss), length()); }
    std::string to_string() const;
    // The port, in host order (sin_port and sin6_port sit at the same offset).
    uint16_t port() const { return ntohs(reinterpret_cast<const sockaddr_in *>(&ss)->sin_port); }
    static bool from_bytes(const void *bytes, size_t len, EndpointName &out);
};

}  // namespace tandem

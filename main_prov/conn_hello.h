// The private data of a link connection request, which tandem fills with its own hello
// (wire::ConnHello): what kind of endpoint connects, its authorization key's digest, the
// RDM sender's name (so the listener can map it in its AV) or the MSG application's
// connection data. Built and checked here alone, for RDM endpoints, MSG endpoints and
// passive endpoints: bytes from the network, so every length is checked against what came.
#pragma once

#include "common/wire.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem {

struct ParsedHello {
    wire::ConnKind kind = wire::ConnKind::Rdm;
    uint64_t auth = 0;
    std::span<const uint8_t> name;  // RDM: the sender's endpoint name (a sockaddr)
    std::span<const uint8_t> user;  // MSG: the application's connection data
};

std::vector<uint8_t> build_conn_hello(wire::ConnKind kind, uint64_t auth,
                                      std::span<const uint8_t> name, std::span<const uint8_t> user);

// The request `data` holds, or nothing when it is not one this version of tandem accepts
// (*why says what was wrong, for the log). The spans point into `data`.
std::optional<ParsedHello> parse_conn_hello(std::span<const uint8_t> data, std::string *why);

// What a listener takes: a request parse_conn_hello accepts, from an endpoint of the kind
// `want` (a MSG request names nobody), with the listener's authorization key digest `auth`.
std::optional<ParsedHello> accept_conn_hello(std::span<const uint8_t> data, wire::ConnKind want,
                                             uint64_t auth, std::string *why);

}  // namespace tandem

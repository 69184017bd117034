#include "main_prov/conn_hello.h"

#include <cstring>

namespace tandem {

std::vector<uint8_t> build_conn_hello(wire::ConnKind kind, uint64_t auth,
                                      std::span<const uint8_t> name,
                                      std::span<const uint8_t> user) {
    wire::ConnHello hello{.magic = wire::kProtoMagic,
                          .version = wire::kConnHelloVersion,
                          .kind = static_cast<uint8_t>(kind),
                          .addr_len = static_cast<uint8_t>(name.size()),
                          .user_len = static_cast<uint32_t>(user.size()),
                          .reserved = 0,
                          .auth = auth};
    std::vector<uint8_t> out(sizeof hello + name.size() + user.size());
    memcpy(out.data(), &hello, sizeof hello);
    if (!name.empty()) memcpy(out.data() + sizeof hello, name.data(), name.size());
    if (!user.empty()) memcpy(out.data() + sizeof hello + name.size(), user.data(), user.size());
    return out;
}

std::optional<ParsedHello> parse_conn_hello(std::span<const uint8_t> data, std::string *why) {
    auto refuse = [&](std::string reason) -> std::optional<ParsedHello> {
        if (why) *why = std::move(reason);
        return std::nullopt;
    };
    wire::ConnHello hello;
    if (data.size() < sizeof hello)
        return refuse(std::to_string(data.size()) + " bytes, shorter than a hello");
    memcpy(&hello, data.data(), sizeof hello);
    if (hello.magic != wire::kProtoMagic) return refuse("not a tandem hello");
    if (hello.version != wire::kConnHelloVersion)
        return refuse("hello version " + std::to_string(hello.version) + ", this tandem speaks " +
                      std::to_string(wire::kConnHelloVersion));
    if (hello.kind != static_cast<uint8_t>(wire::ConnKind::Msg) &&
        hello.kind != static_cast<uint8_t>(wire::ConnKind::Rdm))
        return refuse("unknown endpoint kind " + std::to_string(hello.kind));
    // 64-bit sums of a byte, a 32-bit field and a size: they cannot wrap.
    if (uint64_t(sizeof hello) + hello.addr_len + hello.user_len != data.size())
        return refuse(std::to_string(data.size()) + " bytes where the hello announces " +
                      std::to_string(sizeof hello + hello.addr_len + uint64_t(hello.user_len)));
    ParsedHello req;
    req.kind = static_cast<wire::ConnKind>(hello.kind);
    req.auth = hello.auth;
    req.name = data.subspan(sizeof hello, hello.addr_len);
    req.user = data.subspan(sizeof hello + hello.addr_len, hello.user_len);
    return req;
}

std::optional<ParsedHello> accept_conn_hello(std::span<const uint8_t> data, wire::ConnKind want,
                                             uint64_t auth, std::string *why) {
    auto hello = parse_conn_hello(data, why);
    const char *refused = nullptr;
    if (!hello)
        return hello;
    else if (hello->kind != want || (want == wire::ConnKind::Msg && !hello->name.empty()))
        refused =
            want == wire::ConnKind::Msg ? "not from a MSG endpoint" : "not from an RDM endpoint";
    else if (hello->auth != auth)
        refused = "another authorization key";
    if (!refused) return hello;
    if (why) *why = refused;
    return std::nullopt;
}

}  // namespace tandem

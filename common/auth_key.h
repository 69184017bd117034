// Authorization keys (fi_domain(3), fi_endpoint(3): auth_key, "a.k.a. job key"): endpoints
// programmed with different keys must not communicate. tandem carries a 64-bit digest of an
// endpoint's key in its connection requests (wire::ConnHello::auth) and in its node-local
// segment, and each side compares digests. The key is an isolation label, as a VNI is, not a
// secret against someone reading the wire: the digest is no cryptographic hash.
#pragma once

#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace tandem {

// Largest key tandem takes (fi_getinfo refuses hints with a longer one).
inline constexpr size_t kMaxAuthKeySize = 64;

// A copy of a key in memory fi_freeinfo frees (malloc); nullptr when out of memory.
inline uint8_t *copy_auth_key(const uint8_t *key, size_t len) {
    auto *out = static_cast<uint8_t *>(std::malloc(len));
    if (out) std::memcpy(out, key, len);
    return out;
}

// 0 for no key; a nonzero digest of the bytes otherwise.
inline uint64_t auth_key_digest(const uint8_t *key, size_t len) {
    if (!key || !len) return 0;
    // FNV-1a over the length and the bytes, then a 64-bit finalizer so that keys differing in
    // one byte differ in about half the digest's bits.
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&](uint8_t b) { h = (h ^ b) * 0x100000001b3ull; };
    for (size_t i = 0; i < sizeof len; ++i) mix(uint8_t(len >> (8 * i)));
    for (size_t i = 0; i < len; ++i) mix(key[i]);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h ? h : 1;
}

// The key of an endpoint opened with `ep_info` in a domain opened with `domain_info`: its own
// (ep_attr) if it has one, the domain's otherwise (fi_endpoint(3): "The domain authorization
// key will be used if auth_key_size is set to 0"). A passive endpoint has no domain: the
// domain attributes of its own info stand for it.
inline std::pair<const uint8_t *, size_t> endpoint_auth_key(const fi_info *ep_info,
                                                            const fi_info *domain_info) {
    if (ep_info && ep_info->ep_attr && ep_info->ep_attr->auth_key_size)
        return {ep_info->ep_attr->auth_key, ep_info->ep_attr->auth_key_size};
    if (domain_info && domain_info->domain_attr && domain_info->domain_attr->auth_key_size)
        return {domain_info->domain_attr->auth_key, domain_info->domain_attr->auth_key_size};
    return {nullptr, 0};
}

inline uint64_t endpoint_auth_digest(const fi_info *ep_info, const fi_info *domain_info) {
    auto [key, len] = endpoint_auth_key(ep_info, domain_info);
    return auth_key_digest(key, len);
}

}  // namespace tandem

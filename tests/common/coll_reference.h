// An independent host model of fi_collective(3) for the collective tests: which buffers each
// rank's call reads and writes, and what every collective leaves in each rank's result buffer,
// computed with plain C++ from the inputs of every rank. Reductions fold the ranks' inputs in
// rank order with tests/common/atomic_reference.h's per-element operations (fi_atomic(3)'s
// definitions, literally: integer SUM and PROD wrap, MIN and MAX compare as C does, so a NaN
// never replaces nor is replaced). Nothing here comes from the provider.
//
// Also the inputs the tests give the calls: seeded values that keep every reduction exact and
// interesting (the unit tests), values of (salt, rank, element) that every rank process can
// compute for every other rank (the tests between processes), and a description of the first
// element a result got wrong.
#pragma once

#include "tests/common/atomic_reference.h"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace tandem_test::coll_ref {

// ---- the collectives --------------------------------------------------------------------------

inline bool reduces(fi_collective_op c) {
    return c == FI_ALLREDUCE || c == FI_REDUCE || c == FI_REDUCE_SCATTER;
}

inline bool rooted(fi_collective_op c) {
    return c == FI_BROADCAST || c == FI_REDUCE || c == FI_SCATTER || c == FI_GATHER;
}

// What one rank's call reads and writes (fi_collective(3)) among n ranks, with blocks of b
// bytes; absent buffers are passed as null. Broadcast's one buffer is recv: the root's input,
// the others' result.
struct Io {
    bool send = false, recv = false;
    size_t send_bytes = 0, recv_bytes = 0;
};

inline Io io_of(fi_collective_op c, size_t b, uint32_t n, bool root) {
    switch (c) {
        case FI_BARRIER:
            return {};
        case FI_BROADCAST:
            return {false, true, 0, b};
        case FI_ALLREDUCE:
            return {true, true, b, b};
        case FI_ALLGATHER:
            return {true, true, b, b * n};
        case FI_ALLTOALL:
            return {true, true, b * n, b * n};
        case FI_REDUCE_SCATTER:
            return {true, true, b * n, b};
        case FI_REDUCE:
            return {true, root, b, root ? b : 0};
        case FI_SCATTER:
            return {root, true, root ? b * n : 0, b};
        case FI_GATHER:
            return {true, root, b, root ? b * n : 0};
        default:
            break;
    }
    return {};
}

// Is the rank's input in its recv buffer (a broadcast's root: its one buffer), not in send?
inline bool input_in_recv(fi_collective_op c, bool root) {
    return c == FI_BROADCAST && root;
}

// out[i] = in[0][i] op in[1][i] op ... op in[n-1][i]: count elements of datatype, folded in rank
// order (one rank: its input as is).
inline std::vector<uint8_t> fold(int datatype, int op, const std::vector<const uint8_t *> &in,
                                 size_t count) {
    std::vector<uint8_t> out(count * atomic_ref::element_size(datatype));
    if (out.empty() || in.empty()) return out;
    atomic_ref::with_type(datatype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (size_t i = 0; i < count; ++i) {
            T acc;
            std::memcpy(&acc, in[0] + i * sizeof(T), sizeof(T));
            for (size_t r = 1; r < in.size(); ++r) {
                T v;
                std::memcpy(&v, in[r] + i * sizeof(T), sizeof(T));
                atomic_ref::apply<T>(op, acc, v, T{});
            }
            std::memcpy(out.data() + i * sizeof(T), &acc, sizeof(T));
        }
    });
    return out;
}

// What rank r's call leaves in its result buffer (empty where the call has none), with blocks
// of count elements of datatype: in[q] is rank q's input (its send buffer; a broadcast's root:
// its one buffer, the others' are not read).
inline std::vector<uint8_t> result_of(fi_collective_op c, int datatype, int op, size_t count,
                                      uint32_t root, uint32_t r,
                                      const std::vector<const uint8_t *> &in) {
    const size_t b = count * atomic_ref::element_size(datatype);
    auto blocks_at = [&](size_t offset) {
        std::vector<const uint8_t *> v;
        for (const uint8_t *p : in) v.push_back(p + offset);
        return v;
    };
    std::vector<uint8_t> e;
    switch (c) {
        case FI_BROADCAST:  // the root's vector everywhere
            e.assign(in[root], in[root] + b);
            break;
        case FI_ALLREDUCE:  // the element-wise reduction of every rank's vector
            e = fold(datatype, op, blocks_at(0), count);
            break;
        case FI_REDUCE:  // the same, at the root only
            if (r == root) e = fold(datatype, op, blocks_at(0), count);
            break;
        case FI_REDUCE_SCATTER:  // block r of the reduction of every rank's n blocks
            e = fold(datatype, op, blocks_at(r * b), count);
            break;
        case FI_ALLGATHER:  // block q from rank q
            for (const uint8_t *p : in) e.insert(e.end(), p, p + b);
            break;
        case FI_GATHER:  // the same, at the root only
            if (r == root)
                for (const uint8_t *p : in) e.insert(e.end(), p, p + b);
            break;
        case FI_ALLTOALL:  // block q from rank q's block r
            for (const uint8_t *p : in) e.insert(e.end(), p + r * b, p + (r + 1) * b);
            break;
        case FI_SCATTER:  // the root's block r
            e.assign(in[root] + r * b, in[root] + (r + 1) * b);
            break;
        default:  // FI_BARRIER: nothing
            break;
    }
    return e;
}

// The same for typed inputs: in[q] is rank q's input, T the C type of datatype.
template <class T>
std::vector<T> result_of(fi_collective_op c, int datatype, int op, size_t count, uint32_t root,
                         uint32_t r, const std::vector<std::vector<T>> &in) {
    std::vector<const uint8_t *> bytes_in;
    for (const std::vector<T> &v : in)
        bytes_in.push_back(reinterpret_cast<const uint8_t *>(v.data()));
    const std::vector<uint8_t> bytes = result_of(c, datatype, op, count, root, r, bytes_in);
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!bytes.empty()) std::memcpy(static_cast<void *>(out.data()), bytes.data(), bytes.size());
    return out;
}

// ---- the values the tests use -----------------------------------------------------------------

// SplitMix64's finaliser: well-mixed 64 bits from any number.
inline uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A seed from the parts of a case (each suite its own base).
inline uint64_t hash_of(uint64_t base, std::initializer_list<uint64_t> parts) {
    uint64_t h = base;
    for (uint64_t p : parts) h = mix(h ^ p);
    return h;
}

// A value of T (an integer or real type) for a reduction by op among n ranks, from one draw of
// rng: logical ops see some zeros (rarely enough that both results occur), PROD mostly odd
// factors (small ones for reals), reals are integers (so any order of a sum is exact), integers
// cover their whole range.
template <class T>
T reduction_input(int op, uint32_t n, std::mt19937_64 &rng) {
    constexpr bool integer = atomic_ref::cat_of<T>() == atomic_ref::Cat::Int;
    const uint64_t x = rng();
    const bool rare = x % (2 * uint64_t(n)) == 0;
    switch (op) {
        case FI_LAND:
            return rare ? T(0) : T((x >> 20) | 1);
        case FI_LOR:
            return rare ? T((x >> 20) | 1) : T(0);
        case FI_PROD:
            if constexpr (integer)
                return T((x >> 20) | ((x & 7) ? 1 : 0));
            else
                return T(1 + int((x >> 20) % 3));
        default:
            break;
    }
    if constexpr (integer)
        return T((x >> 3) ^ (x << 61));
    else
        return T(int64_t((x >> 8) % (uint64_t(1) << 21)) - (int64_t(1) << 20));
}

// count such values of datatype (an integer or real type; complex types are left alone) at p.
inline void fill_reduction_input(int datatype, int op, uint32_t n, std::mt19937_64 &rng, uint8_t *p,
                                 size_t count) {
    atomic_ref::with_type(datatype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (atomic_ref::cat_of<T>() != atomic_ref::Cat::Complex) {
            for (size_t i = 0; i < count; ++i) {
                const T v = reduction_input<T>(op, n, rng);
                std::memcpy(p + i * sizeof(T), &v, sizeof(T));
            }
        }
    });
}

// Between processes: rank q's element i of the call salted `salt`, which every rank can compute
// for every other rank.
inline uint64_t val(uint64_t salt, int q, size_t i) {
    return mix(mix(salt) ^ (uint64_t(q) << 48) ^ uint64_t(i));
}
inline uint64_t salt_of(int coll, size_t count, int root = 0) {
    return (uint64_t(coll) << 40) ^ (uint64_t(count) << 8) ^ uint64_t(root);
}

// Result memory no element may reach: behind a result, and the result of a rank that has none.
inline constexpr uint64_t kSentinel = 0x5e5e5e5e5e5e5e5eull;

// One rank's buffers for a call of collective c (FI_SUM where it reduces) on FI_UINT64 among
// ranks 0 .. n-1, rank q's inputs val(salt, q, j): the input (kSentinel where the call reads
// none), the result buffer and the result expected in it, and how many bytes the call reads and
// writes at this rank. Every buffer is one element longer than the call reads or writes (that
// element, like every one the call must not write, keeps kSentinel), and a rooted collective's
// buffers have the root's size at every rank.
struct Plan {
    std::vector<uint64_t> in, out, want;
    size_t reads = 0, writes = 0;  // bytes
};

inline Plan plan(fi_collective_op c, size_t count, int root, int n, int me, uint64_t salt) {
    const size_t b = count * sizeof(uint64_t);
    auto io = [&](int q) { return io_of(c, b, uint32_t(n), q == root); };
    auto reads = [&](int q) { return input_in_recv(c, q == root) ? b : io(q).send_bytes; };
    std::vector<std::vector<uint64_t>> inputs(n);
    for (int q = 0; q < n; ++q) {
        inputs[q].resize(reads(q) / sizeof(uint64_t));
        for (size_t j = 0; j < inputs[q].size(); ++j) inputs[q][j] = val(salt, q, j);
    }
    const std::vector<uint64_t> result =
        result_of(c, FI_UINT64, FI_SUM, count, uint32_t(root), uint32_t(me), inputs);
    const Io at_root = io_of(c, b, uint32_t(n), true);
    Plan p;
    p.out.assign(at_root.recv_bytes / sizeof(uint64_t) + 1, kSentinel);
    p.want = p.out;
    std::copy(result.begin(), result.end(), p.want.begin());
    if (c == FI_BROADCAST) {  // one buffer: the root's input, the others' result
        p.in = me == root ? p.want : p.out;
    } else {
        p.in.assign(at_root.send_bytes / sizeof(uint64_t) + 1, kSentinel);
        std::copy(inputs[me].begin(), inputs[me].end(), p.in.begin());
    }
    p.reads = reads(me);
    p.writes = input_in_recv(c, me == root) ? 0 : io(me).recv_bytes;
    return p;
}

// ---- comparing --------------------------------------------------------------------------------

// len bytes of a little-endian value, most significant first ("(empty)" for none).
inline std::string hex(const uint8_t *p, size_t len) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (size_t i = len; i-- > 0;) {
        s += digits[p[i] >> 4];
        s += digits[p[i] & 15];
    }
    return s.empty() ? "(empty)" : s;
}

// Empty when got holds the len bytes of want; else how many of its elements (elem bytes each)
// differ, and the first of them: where it is in the blocks of `block` bytes, both values in hex.
inline std::string mismatch(const uint8_t *want, const uint8_t *got, size_t len, size_t elem,
                            size_t block) {
    if (len == 0 || std::memcmp(want, got, len) == 0) return std::string();
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < len; i += elem)
        if (std::memcmp(want + i, got + i, elem) != 0 && !bad++) first = i;
    return std::to_string(bad) + " of " + std::to_string(len / elem) +
           " elements wrong; first element " + std::to_string(first / elem) + " (byte " +
           std::to_string(first) + ", block " + std::to_string(first / block) + ", byte " +
           std::to_string(first % block) + " of it): expected " + hex(want + first, elem) +
           ", got " + hex(got + first, elem);
}

}  // namespace tandem_test::coll_ref

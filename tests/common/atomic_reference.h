// An independent host model of fi_atomic(3) for the atomic tests: which (kind, operation,
// datatype) triples tandem supports, the values the tests run them on, and what each operation
// does to the target and returns, computed with plain C++ on the host, literally as the man
// page describes each operation. Nothing here comes from the provider.
//
// What tandem promises (and the model encodes):
//   - datatypes: the 16 point-to-point ones, FI_INT8 .. FI_LONG_DOUBLE_COMPLEX, FI_INT128,
//     FI_UINT128;
//   - MIN, MAX, CSWAP_LE/LT/GE/GT: integers and real floating types, not complex;
//     SUM, PROD, LOR, LAND, LXOR, ATOMIC_READ, ATOMIC_WRITE, CSWAP, CSWAP_NE: every type;
//     BOR, BAND, BXOR, MSWAP: integers only;
//   - base calls take MIN..BXOR and ATOMIC_WRITE, fetch calls MIN..BXOR, ATOMIC_READ and
//     ATOMIC_WRITE, compare calls CSWAP..MSWAP;
//   - the valid calls return count = 2048 / sizeof(element);
//   - logical operations give 1 or 0 of the type (complex: 1 + 0i); a complex value is true when
//     either part is non-zero; integer SUM and PROD wrap; comparisons of floating values are the
//     C comparisons (a NaN operand never replaces, a NaN target is never replaced by MIN/MAX,
//     -0.0 and +0.0 compare equal).
//
// Last, issue_call(): one operation in any of the three forms of its kind, for the tests to post.
//
// Byte comparisons skip what is not part of a value: the 6 padding bytes after each 10-byte
// x87 long double (sizeof 16 on x86-64), which neither the C language nor fi_atomic defines.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace tandem_test::atomic_ref {

inline constexpr int kNumOps = FI_MSWAP + 1;          // FI_MIN .. FI_MSWAP
inline constexpr int kNumDatatypes = FI_UINT128 + 1;  // FI_INT8 .. FI_UINT128
inline constexpr size_t kMaxBytesPerOp = 2048;

enum class Kind { Base, Fetch, Compare };
inline constexpr Kind kKinds[] = {Kind::Base, Kind::Fetch, Kind::Compare};

inline const char *kind_name(Kind k) {
    switch (k) {
        case Kind::Base:
            return "fi_atomic";
        case Kind::Fetch:
            return "fi_fetch_atomic";
        case Kind::Compare:
            return "fi_compare_atomic";
    }
    return "?";
}

inline const char *op_name(int op) {
    static const char *const names[] = {
        "FI_MIN",         "FI_MAX",          "FI_SUM",      "FI_PROD",     "FI_LOR",
        "FI_LAND",        "FI_BOR",          "FI_BAND",     "FI_LXOR",     "FI_BXOR",
        "FI_ATOMIC_READ", "FI_ATOMIC_WRITE", "FI_CSWAP",    "FI_CSWAP_NE", "FI_CSWAP_LE",
        "FI_CSWAP_LT",    "FI_CSWAP_GE",     "FI_CSWAP_GT", "FI_MSWAP"};
    return op >= 0 && op < kNumOps ? names[op] : "(op out of range)";
}

inline const char *datatype_name(int dt) {
    static const char *const names[] = {"FI_INT8",          "FI_UINT8",
                                        "FI_INT16",         "FI_UINT16",
                                        "FI_INT32",         "FI_UINT32",
                                        "FI_INT64",         "FI_UINT64",
                                        "FI_FLOAT",         "FI_DOUBLE",
                                        "FI_FLOAT_COMPLEX", "FI_DOUBLE_COMPLEX",
                                        "FI_LONG_DOUBLE",   "FI_LONG_DOUBLE_COMPLEX",
                                        "FI_INT128",        "FI_UINT128"};
    return dt >= 0 && dt < kNumDatatypes ? names[dt] : "(datatype out of range)";
}

// ---- the types --------------------------------------------------------------------------------

// A complex value laid out as C's `_Complex R` (and std::complex<R>): real part, then imaginary.
template <class R>
struct Cx {
    R re, im;
};
template <class R>
bool operator==(const Cx<R> &a, const Cx<R> &b) {
    return a.re == b.re && a.im == b.im;
}
template <class R>
bool operator!=(const Cx<R> &a, const Cx<R> &b) {
    return !(a == b);
}

template <class T>
struct IsCx : std::false_type {};
template <class R>
struct IsCx<Cx<R>> : std::true_type {};

enum class Cat { Int, Real, Complex };

template <class T>
constexpr Cat cat_of() {
    if constexpr (IsCx<T>::value)
        return Cat::Complex;
    else if constexpr (std::is_floating_point_v<T>)
        return Cat::Real;
    else
        return Cat::Int;
}

// The unsigned type of the same width (std::make_unsigned knows __int128 only in GNU mode).
template <class T>
struct UnsignedOf {
    using type = std::make_unsigned_t<T>;
};
template <>
struct UnsignedOf<__int128> {
    using type = unsigned __int128;
};
template <>
struct UnsignedOf<unsigned __int128> {
    using type = unsigned __int128;
};

template <class T>
constexpr bool is_signed_int() {
    return T(-1) < T(0);
}
template <class T>
constexpr T int_max() {
    using U = typename UnsignedOf<T>::type;
    return is_signed_int<T>() ? T(U(~U(0)) >> 1) : T(~U(0));
}
template <class T>
constexpr T int_min() {
    return is_signed_int<T>() ? T(-int_max<T>() - 1) : T(0);
}

template <class T>
struct Tag {
    using type = T;
};

// Calls f(Tag<C type of dt>{}).
template <class F>
void with_type(int dt, F &&f) {
    switch (dt) {
        case FI_INT8:
            return f(Tag<int8_t>{});
        case FI_UINT8:
            return f(Tag<uint8_t>{});
        case FI_INT16:
            return f(Tag<int16_t>{});
        case FI_UINT16:
            return f(Tag<uint16_t>{});
        case FI_INT32:
            return f(Tag<int32_t>{});
        case FI_UINT32:
            return f(Tag<uint32_t>{});
        case FI_INT64:
            return f(Tag<int64_t>{});
        case FI_UINT64:
            return f(Tag<uint64_t>{});
        case FI_FLOAT:
            return f(Tag<float>{});
        case FI_DOUBLE:
            return f(Tag<double>{});
        case FI_FLOAT_COMPLEX:
            return f(Tag<Cx<float>>{});
        case FI_DOUBLE_COMPLEX:
            return f(Tag<Cx<double>>{});
        case FI_LONG_DOUBLE:
            return f(Tag<long double>{});
        case FI_LONG_DOUBLE_COMPLEX:
            return f(Tag<Cx<long double>>{});
        case FI_INT128:
            return f(Tag<__int128>{});
        case FI_UINT128:
            return f(Tag<unsigned __int128>{});
    }
}

inline Cat category(int dt) {
    Cat c = Cat::Int;
    with_type(dt, [&](auto tag) { c = cat_of<typename decltype(tag)::type>(); });
    return c;
}

inline size_t element_size(int dt) {
    size_t s = 0;
    with_type(dt, [&](auto tag) { s = sizeof(typename decltype(tag)::type); });
    return s;
}

// Is byte `i` of an element of `dt` part of its value (not padding)?
inline bool value_byte(int dt, size_t i) {
    if (dt == FI_LONG_DOUBLE) return i < 10;
    if (dt == FI_LONG_DOUBLE_COMPLEX) return i % sizeof(long double) < 10;
    return true;
}

// ---- which triples are valid ------------------------------------------------------------------

inline bool type_allows(int op, Cat cat) {
    switch (op) {
        case FI_MIN:
        case FI_MAX:
        case FI_CSWAP_LE:
        case FI_CSWAP_LT:
        case FI_CSWAP_GE:
        case FI_CSWAP_GT:
            return cat != Cat::Complex;
        case FI_BOR:
        case FI_BAND:
        case FI_BXOR:
        case FI_MSWAP:
            return cat == Cat::Int;
        default:
            return true;
    }
}

inline bool kind_allows(Kind k, int op) {
    switch (k) {
        case Kind::Base:
            return op <= FI_BXOR || op == FI_ATOMIC_WRITE;
        case Kind::Fetch:
            return op <= FI_ATOMIC_WRITE;
        case Kind::Compare:
            return op >= FI_CSWAP && op <= FI_MSWAP;
    }
    return false;
}

inline bool valid(Kind k, int op, int dt) {
    return kind_allows(k, op) && type_allows(op, category(dt));
}

// What the *valid call should return for an in-range pair: 0 or -FI_EOPNOTSUPP.
inline int expected_valid_ret(Kind k, int op, int dt) {
    return valid(k, op, dt) ? 0 : -FI_EOPNOTSUPP;
}
inline size_t expected_count(int dt) {
    return kMaxBytesPerOp / element_size(dt);
}

// ---- the operations ---------------------------------------------------------------------------

template <class T>
bool truth(const T &v) {
    if constexpr (IsCx<T>::value)
        return v.re != 0 || v.im != 0;
    else
        return v != T(0);
}

template <class T>
T from_bool(bool b) {
    if constexpr (IsCx<T>::value) {
        using R = decltype(T{}.re);
        return T{R(b ? 1 : 0), R(0)};
    } else
        return T(b ? 1 : 0);
}

// Integer arithmetic wraps: done in the unsigned type (never narrower than unsigned int, so
// that uint16_t * uint16_t cannot overflow a promoted int).
template <class T>
T wrap_add(T a, T b) {
    using U = typename UnsignedOf<T>::type;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(W(U(a)) + W(U(b))));
}
template <class T>
T wrap_mul(T a, T b) {
    using U = typename UnsignedOf<T>::type;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(W(U(a)) * W(U(b))));
}

template <class T>
T add(const T &a, const T &b) {
    if constexpr (IsCx<T>::value)
        return T{a.re + b.re, a.im + b.im};
    else if constexpr (std::is_floating_point_v<T>)
        return a + b;
    else
        return wrap_add(a, b);
}

template <class T>
T mul(const T &a, const T &b) {
    if constexpr (IsCx<T>::value)
        return T{a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
    else if constexpr (std::is_floating_point_v<T>)
        return a * b;
    else
        return wrap_mul(a, b);
}

// One element: t is the target, b the operand (buf), c the compare value; fi_atomic(3)'s
// conceptual descriptions, literally.
template <class T>
void apply(int op, T &t, const T &b, const T &c) {
    constexpr Cat cat = cat_of<T>();
    switch (op) {
        case FI_MIN:
            if constexpr (cat != Cat::Complex)
                if (b < t) t = b;
            break;
        case FI_MAX:
            if constexpr (cat != Cat::Complex)
                if (b > t) t = b;
            break;
        case FI_SUM:
            t = add(t, b);
            break;
        case FI_PROD:
            t = mul(t, b);
            break;
        case FI_LOR:
            t = from_bool<T>(truth(t) || truth(b));
            break;
        case FI_LAND:
            t = from_bool<T>(truth(t) && truth(b));
            break;
        case FI_LXOR:
            t = from_bool<T>((truth(t) && !truth(b)) || (!truth(t) && truth(b)));
            break;
        case FI_BOR:
            if constexpr (cat == Cat::Int) t = T(t | b);
            break;
        case FI_BAND:
            if constexpr (cat == Cat::Int) t = T(t & b);
            break;
        case FI_BXOR:
            if constexpr (cat == Cat::Int) t = T(t ^ b);
            break;
        case FI_ATOMIC_READ:
            break;
        case FI_ATOMIC_WRITE:
            t = b;
            break;
        case FI_CSWAP:
            if (c == t) t = b;
            break;
        case FI_CSWAP_NE:
            if (c != t) t = b;
            break;
        case FI_CSWAP_LE:
            if constexpr (cat != Cat::Complex)
                if (c <= t) t = b;
            break;
        case FI_CSWAP_LT:
            if constexpr (cat != Cat::Complex)
                if (c < t) t = b;
            break;
        case FI_CSWAP_GE:
            if constexpr (cat != Cat::Complex)
                if (c >= t) t = b;
            break;
        case FI_CSWAP_GT:
            if constexpr (cat != Cat::Complex)
                if (c > t) t = b;
            break;
        case FI_MSWAP:
            if constexpr (cat == Cat::Int) t = T((b & c) | (t & ~c));
            break;
    }
}

// ---- the values the tests use -----------------------------------------------------------------

inline constexpr size_t kCount = 4;  // elements per operation in the tests

// Bytes of kCount elements: target before, operand, compare.
struct Case {
    std::string name;
    std::vector<uint8_t> target, operand, compare;
};

template <class T>
std::vector<uint8_t> bytes_of(const std::array<T, kCount> &v) {
    std::vector<uint8_t> out(sizeof(T) * kCount, 0);
    for (size_t i = 0; i < kCount; ++i) std::memcpy(out.data() + i * sizeof(T), &v[i], sizeof(T));
    return out;
}

template <class T>
Case make_case(const char *name, const std::array<T, kCount> &t, const std::array<T, kCount> &b,
               const std::array<T, kCount> &c) {
    return Case{name, bytes_of(t), bytes_of(b), bytes_of(c)};
}

// The cases of a datatype: two ordinary ones (negative, zero, equal and unequal compare values,
// both outcomes of every comparison, integer wrap-around), and for floating types a third with
// NaN, -0.0 and infinities.
template <class T>
std::vector<Case> cases_of() {
    std::vector<Case> out;
    constexpr Cat cat = cat_of<T>();
    if constexpr (cat == Cat::Int) {
        auto I = [](long long v) { return T(v); };
        const T mx = int_max<T>(), mn = int_min<T>();
        // e0: equal compare, MAX replaces; e1: zero target; e2: zero operand; e3: wraps.
        out.push_back(make_case<T>("ordinary", {I(-5), I(0), I(7), mx}, {I(3), I(-2), I(0), I(2)},
                                   {I(-5), I(1), I(9), I(-100)}));
        // e0: both zero (LOR 0); e1: the minimum (SUM/PROD wrap, CSWAP equal); e3: masks.
        out.push_back(make_case<T>("extremes", {I(0), mn, I(-1), I(0x5A)},
                                   {I(0), I(-1), I(6), I(0x0F)}, {I(5), mn, I(-2), I(0x3C)}));
    } else if constexpr (cat == Cat::Real) {
        out.push_back(make_case<T>("ordinary", {T(-5.5), T(0), T(7.25), T(1e30)},
                                   {T(3), T(-2), T(0), T(2)}, {T(-5.5), T(1), T(9), T(-100)}));
        out.push_back(make_case<T>("equal values", {T(0), T(-2.5), T(1.5), T(100)},
                                   {T(0), T(-2.5), T(0.25), T(-100)},
                                   {T(1), T(-2.5), T(1.5), T(100)}));
        const T nan = std::numeric_limits<T>::quiet_NaN();
        const T inf = std::numeric_limits<T>::infinity();
        out.push_back(make_case<T>("NaN, -0.0, inf", {nan, T(-0.0), inf, T(1)},
                                   {T(1), T(0.0), -inf, nan}, {nan, T(0.0), inf, T(1)}));
    } else {
        using R = decltype(T{}.re);
        out.push_back(make_case<T>("ordinary", {T{-5.5, 2}, T{0, 0}, T{7.25, -1}, T{0, 3}},
                                   {T{3, 1}, T{-2, 0}, T{0, 0}, T{2, 2}},
                                   {T{-5.5, 2}, T{1, 0}, T{7.25, 1}, T{0, 3}}));
        out.push_back(make_case<T>("equal values", {T{0, 0}, T{1, 0}, T{0, -1}, T{4, 4}},
                                   {T{0, 0}, T{0, 1}, T{0.5, 0.5}, T{-4, -4}},
                                   {T{0, 0}, T{1, 1}, T{0, -1}, T{4, -4}}));
        const R nan = std::numeric_limits<R>::quiet_NaN();
        const R inf = std::numeric_limits<R>::infinity();
        out.push_back(make_case<T>(
            "NaN, -0.0, inf", {T{nan, 0}, T{-0.0, -0.0}, T{inf, 1}, T{0, nan}},
            {T{1, 1}, T{0, 0}, T{-inf, 0}, T{0, 0}}, {T{nan, 0}, T{0, 0}, T{inf, 1}, T{0, nan}}));
    }
    return out;
}

inline std::vector<Case> cases(int dt) {
    std::vector<Case> out;
    with_type(dt, [&](auto tag) { out = cases_of<typename decltype(tag)::type>(); });
    return out;
}

// Whether a case applies to an operation: the product of complex numbers with infinite or NaN
// parts is left out (C's Annex G recovers infinities there, a textbook formula does not, and
// fi_atomic(3) says neither).
inline bool case_applies(int dt, int op, const Case &c) {
    return !(category(dt) == Cat::Complex && op == FI_PROD && c.name == "NaN, -0.0, inf");
}

// The reference: `target` (count elements of dt) is updated in place; returns what a fetching
// call returns (the target before).
inline std::vector<uint8_t> reference(int dt, int op, std::vector<uint8_t> &target,
                                      const std::vector<uint8_t> &operand,
                                      const std::vector<uint8_t> &compare) {
    std::vector<uint8_t> before = target;
    with_type(dt, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const size_t n = target.size() / sizeof(T);
        for (size_t i = 0; i < n; ++i) {
            T t, b{}, c{};
            std::memcpy(&t, target.data() + i * sizeof(T), sizeof(T));
            if (operand.size() >= (i + 1) * sizeof(T))
                std::memcpy(&b, operand.data() + i * sizeof(T), sizeof(T));
            if (compare.size() >= (i + 1) * sizeof(T))
                std::memcpy(&c, compare.data() + i * sizeof(T), sizeof(T));
            apply<T>(op, t, b, c);
            std::memcpy(target.data() + i * sizeof(T), &t, sizeof(T));
        }
    });
    return before;
}

// ---- comparing ------------------------------------------------------------------------------

// An element's bytes in memory order, padding shown as "..".
inline std::string hex(int dt, const uint8_t *p) {
    std::string s;
    char b[4];
    for (size_t i = 0; i < element_size(dt); ++i) {
        std::snprintf(b, sizeof b, "%02x", p[i]);
        s += value_byte(dt, i) ? b : "..";
    }
    return s;
}

// Empty when `got` holds the values of `want` (count elements of dt, padding ignored); else
// which element differs, with both as hex bytes.
inline std::string diff(int dt, const uint8_t *got, const uint8_t *want, size_t count) {
    const size_t s = element_size(dt);
    std::string out;
    for (size_t e = 0; e < count; ++e) {
        bool same = true;
        for (size_t i = 0; i < s; ++i)
            if (value_byte(dt, i) && got[e * s + i] != want[e * s + i]) same = false;
        if (!same) {
            if (!out.empty()) out += "; ";
            out += "element " + std::to_string(e) + " is " + hex(dt, got + e * s) + ", expected " +
                   hex(dt, want + e * s);
        }
    }
    return out;
}

// ---- issuing an operation ---------------------------------------------------------------------

// Which call of a kind is used: fi_atomic / fi_atomicv (two-entry ioc lists) / fi_atomicmsg.
enum class Form { Short, Vec, Msg };
inline const char *form_name(Form f) {
    return f == Form::Short ? "short form" : f == Form::Vec ? "v form" : "msg form";
}

// One operation's arguments.
struct Call {
    Kind kind = Kind::Base;
    int op = FI_SUM;
    int dt = FI_UINT64;
    size_t count = kCount;
    Form form = Form::Short;
    void *operand = nullptr, *compare = nullptr, *result = nullptr;
    void *odesc = nullptr, *cdesc = nullptr, *rdesc = nullptr;  // their descriptors
    uint64_t addr = 0, key = 0;
    uint64_t msg_flags = 0, data = 0;            // msg form only
    size_t compare_count = 0, result_count = 0;  // 0: count (the v and msg forms)
};

// `total` elements of `size` bytes at p as an ioc list: two entries (the first `first`
// elements, then the rest) when 0 < first < total, else one.
inline std::vector<fi_ioc> iocs(void *p, size_t size, size_t total, size_t first) {
    auto *b = static_cast<uint8_t *>(p);
    if (first == 0 || first >= total) return {fi_ioc{b, total}};
    return {fi_ioc{b, first}, fi_ioc{b ? b + first * size : nullptr, total - first}};
}

// Posts `c` once from `ep` to `to` (what the call returns, -FI_EAGAIN included). The v form
// splits the operand 1 + rest, the compare values rest + 1 and the results in halves; the msg
// form uses one entry each.
inline ssize_t issue_call(fid_ep *ep, fi_addr_t to, const Call &c, void *ctx) {
    const auto dt = static_cast<fi_datatype>(c.dt);
    const auto op = static_cast<fi_op>(c.op);
    const size_t s = c.dt >= 0 && c.dt < kNumDatatypes ? element_size(c.dt) : 8;
    const size_t ccount = c.compare_count ? c.compare_count : c.count;
    const size_t rcount = c.result_count ? c.result_count : c.count;
    if (c.form == Form::Short) {
        switch (c.kind) {
            case Kind::Base:
                return fi_atomic(ep, c.operand, c.count, c.odesc, to, c.addr, c.key, dt, op, ctx);
            case Kind::Fetch:
                return fi_fetch_atomic(ep, c.operand, c.count, c.odesc, c.result, c.rdesc, to,
                                       c.addr, c.key, dt, op, ctx);
            case Kind::Compare:
                return fi_compare_atomic(ep, c.operand, c.count, c.odesc, c.compare, c.cdesc,
                                         c.result, c.rdesc, to, c.addr, c.key, dt, op, ctx);
        }
    }
    const bool vec = c.form == Form::Vec;
    std::vector<fi_ioc> ov = iocs(c.operand, s, c.count, vec ? 1 : 0);
    std::vector<fi_ioc> cv = iocs(c.compare, s, ccount, vec ? ccount - 1 : 0);
    std::vector<fi_ioc> rv = iocs(c.result, s, rcount, vec ? rcount / 2 : 0);
    void *od[2] = {c.odesc, c.odesc}, *cd[2] = {c.cdesc, c.cdesc}, *rd[2] = {c.rdesc, c.rdesc};
    if (vec) {
        switch (c.kind) {
            case Kind::Base:
                return fi_atomicv(ep, ov.data(), od, ov.size(), to, c.addr, c.key, dt, op, ctx);
            case Kind::Fetch:
                return fi_fetch_atomicv(ep, ov.data(), od, ov.size(), rv.data(), rd, rv.size(), to,
                                        c.addr, c.key, dt, op, ctx);
            case Kind::Compare:
                return fi_compare_atomicv(ep, ov.data(), od, ov.size(), cv.data(), cd, cv.size(),
                                          rv.data(), rd, rv.size(), to, c.addr, c.key, dt, op, ctx);
        }
    }
    fi_rma_ioc rioc{c.addr, c.count, c.key};
    fi_msg_atomic m{};
    m.msg_iov = ov.data();
    m.desc = od;
    m.iov_count = ov.size();
    m.addr = to;
    m.rma_iov = &rioc;
    m.rma_iov_count = 1;
    m.datatype = dt;
    m.op = op;
    m.context = ctx;
    m.data = c.data;
    switch (c.kind) {
        case Kind::Base:
            return fi_atomicmsg(ep, &m, c.msg_flags);
        case Kind::Fetch:
            return fi_fetch_atomicmsg(ep, &m, rv.data(), rd, rv.size(), c.msg_flags);
        case Kind::Compare:
            return fi_compare_atomicmsg(ep, &m, cv.data(), cd, cv.size(), rv.data(), rd, rv.size(),
                                        c.msg_flags);
    }
    return -FI_ENOSYS;
}

}  // namespace tandem_test::atomic_ref

// The one reduction engine: what each fi_op does to one element of each point-to-point
// fi_datatype. The atomics and the collectives' reductions (hmem/atomic.h) use it on the host,
// and device-resident reductions are to use the same code inside CUDA kernels (the build
// checks that it compiles as device code), so this header stays device-clean: every function is
// TANDEM_HD, and there are no exceptions, virtuals, std:: containers or std::complex, and no
// long double in a device pass (CUDA has none).
//
// Semantics are fi_atomic(3) taken literally, per element i:
//     old = target[i]; result[i] = old (fetch and compare kinds); target[i] = f(old, buf, cmp)
// with buf = operand[i] and cmp = compare[i]. The edge cases that follow from that:
//  - Integer SUM and PROD wrap modulo 2^bits: they are computed in the unsigned counterpart,
//    at least unsigned int wide, because signed overflow (and uint16 * uint16 promoted to
//    int) is undefined behaviour.
//  - Floating-point MIN is "if (buf < old) target = buf" and MAX likewise, not fmin/fmax:
//    a NaN operand never replaces the target, a NaN target is never replaced (every
//    comparison with NaN is false), and -0.0 and +0.0 compare equal, so neither replaces
//    the other (the target keeps its sign).
//  - CSWAP, CSWAP_LE/LT/GE/GT compare the same literal way: a NaN compare value or target
//    never swaps, and a compare value of -0.0 matches a +0.0 target (and the reverse).
//    CSWAP_NE swaps whenever either side is NaN, since NaN != x holds.
//  - LOR, LAND and LXOR yield 1 or 0 of the type. NaN counts as true (it is nonzero); a
//    complex value is true when either part is nonzero, and the result is {1,0} or {0,0}.
//  - Complex PROD is the textbook (a.re*b.re - a.im*b.im, a.re*b.im + a.im*b.re), without
//    C Annex G's recovery of infinities from NaN parts.
//  - The padding bytes of long double (6 of 16 on x86-64) are unspecified afterwards, in the
//    target and in the result.
#pragma once

#include <rdma/fi_domain.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <utility>

#if !defined(TANDEM_HD)
#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__
#else
#define TANDEM_HD
#endif
#endif

namespace tandem::reduce {

__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 UInt128;

// FI_*_COMPLEX: laid out as C's _Complex (real part first).
template <class F>
struct Complex {
    F re, im;
};

template <class F>
TANDEM_HD constexpr bool operator==(const Complex<F> &a, const Complex<F> &b) {
    return a.re == b.re && a.im == b.im;
}
template <class F>
TANDEM_HD constexpr bool operator!=(const Complex<F> &a, const Complex<F> &b) {
    return !(a == b);
}
template <class F>
TANDEM_HD constexpr Complex<F> operator+(const Complex<F> &a, const Complex<F> &b) {
    return {a.re + b.re, a.im + b.im};
}
template <class F>
TANDEM_HD constexpr Complex<F> operator*(const Complex<F> &a, const Complex<F> &b) {
    return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}

// The ops are defined per category, as libfabric's own atomic tables define them.
enum class Category : uint8_t { Integer, Real, Complex };
inline constexpr unsigned kIntegers = 1u << unsigned(Category::Integer);
inline constexpr unsigned kReals = 1u << unsigned(Category::Real);
inline constexpr unsigned kComplexes = 1u << unsigned(Category::Complex);
inline constexpr unsigned kOrdered = kIntegers | kReals;
inline constexpr unsigned kAllCategories = kIntegers | kReals | kComplexes;

TANDEM_HD constexpr unsigned category_mask(Category c) {
    return 1u << unsigned(c);
}

// Wide: the type SUM and PROD compute in (see the top of the file). HostOnly: built on long
// double, which a device pass must not instantiate.
template <class T, Category C, class Wide = T, bool HostOnly = false>
struct TypeDesc {
    using type = T;
    using wide = Wide;
    static constexpr Category category = C;
    static constexpr bool host_only = HostOnly;
};

// The point-to-point datatypes, FI_INT8 .. FI_UINT128 (FI_INT128 == FI_DATATYPE_LAST).
template <int Datatype>
struct DatatypeDesc;
// clang-format off
template <> struct DatatypeDesc<FI_INT8>    : TypeDesc<int8_t, Category::Integer, unsigned> {};
template <> struct DatatypeDesc<FI_UINT8>   : TypeDesc<uint8_t, Category::Integer, unsigned> {};
template <> struct DatatypeDesc<FI_INT16>   : TypeDesc<int16_t, Category::Integer, unsigned> {};
template <> struct DatatypeDesc<FI_UINT16>  : TypeDesc<uint16_t, Category::Integer, unsigned> {};
template <> struct DatatypeDesc<FI_INT32>   : TypeDesc<int32_t, Category::Integer, uint32_t> {};
template <> struct DatatypeDesc<FI_UINT32>  : TypeDesc<uint32_t, Category::Integer, uint32_t> {};
template <> struct DatatypeDesc<FI_INT64>   : TypeDesc<int64_t, Category::Integer, uint64_t> {};
template <> struct DatatypeDesc<FI_UINT64>  : TypeDesc<uint64_t, Category::Integer, uint64_t> {};
template <> struct DatatypeDesc<FI_FLOAT>   : TypeDesc<float, Category::Real> {};
template <> struct DatatypeDesc<FI_DOUBLE>  : TypeDesc<double, Category::Real> {};
template <> struct DatatypeDesc<FI_FLOAT_COMPLEX>
    : TypeDesc<Complex<float>, Category::Complex> {};
template <> struct DatatypeDesc<FI_DOUBLE_COMPLEX>
    : TypeDesc<Complex<double>, Category::Complex> {};
template <> struct DatatypeDesc<FI_LONG_DOUBLE>
    : TypeDesc<long double, Category::Real, long double, true> {};
template <> struct DatatypeDesc<FI_LONG_DOUBLE_COMPLEX>
    : TypeDesc<Complex<long double>, Category::Complex, Complex<long double>, true> {};
template <> struct DatatypeDesc<FI_INT128>  : TypeDesc<Int128, Category::Integer, UInt128> {};
template <> struct DatatypeDesc<FI_UINT128> : TypeDesc<UInt128, Category::Integer, UInt128> {};
// clang-format on

inline constexpr int kNumDatatypes = FI_UINT128 + 1;
inline constexpr int kNumOps = FI_ATOMIC_OP_LAST;
using DatatypeSeq = std::make_index_sequence<kNumDatatypes>;
using OpSeq = std::make_index_sequence<kNumOps>;

#if defined(__CUDA_ARCH__)
inline constexpr bool kDevicePass = true;
#else
inline constexpr bool kDevicePass = false;
#endif

// Whether this compilation pass may instantiate code for the datatype.
template <int Datatype>
inline constexpr bool kAvailable = !(kDevicePass && DatatypeDesc<Datatype>::host_only);

template <class T>
TANDEM_HD constexpr bool truth(const T &v) {
    return v != T(0);
}
template <class F>
TANDEM_HD constexpr bool truth(const Complex<F> &v) {
    return v.re != F(0) || v.im != F(0);
}

template <class T>
struct Logical {
    static TANDEM_HD constexpr T of(bool b) { return T(b ? 1 : 0); }
};
template <class F>
struct Logical<Complex<F>> {
    static TANDEM_HD constexpr Complex<F> of(bool b) { return {F(b ? 1 : 0), F(0)}; }
};

// One functor per fi_op: the categories it is defined on, and the new target value from the
// old one, the operand (buf) and the compare value (cmp). W is the datatype's wide type.
template <int Op>
struct OpFn;

template <>
struct OpFn<FI_MIN> {
    static constexpr unsigned categories = kOrdered;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return buf < old ? buf : old;
    }
};
template <>
struct OpFn<FI_MAX> {
    static constexpr unsigned categories = kOrdered;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return buf > old ? buf : old;
    }
};
template <>
struct OpFn<FI_SUM> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return T(W(old) + W(buf));
    }
};
template <>
struct OpFn<FI_PROD> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return T(W(old) * W(buf));
    }
};
template <>
struct OpFn<FI_LOR> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return Logical<T>::of(truth(old) || truth(buf));
    }
};
template <>
struct OpFn<FI_LAND> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return Logical<T>::of(truth(old) && truth(buf));
    }
};
template <>
struct OpFn<FI_BOR> {
    static constexpr unsigned categories = kIntegers;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return T(old | buf);
    }
};
template <>
struct OpFn<FI_BAND> {
    static constexpr unsigned categories = kIntegers;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return T(old & buf);
    }
};
template <>
struct OpFn<FI_LXOR> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return Logical<T>::of(truth(old) != truth(buf));
    }
};
template <>
struct OpFn<FI_BXOR> {
    static constexpr unsigned categories = kIntegers;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &) {
        return T(old ^ buf);
    }
};
template <>
struct OpFn<FI_ATOMIC_READ> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &, const T &) {
        return old;
    }
};
template <>
struct OpFn<FI_ATOMIC_WRITE> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &, const T &buf, const T &) {
        return buf;
    }
};
template <>
struct OpFn<FI_CSWAP> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &cmp) {
        return cmp == old ? buf : old;
    }
};
template <>
struct OpFn<FI_CSWAP_NE> {
    static constexpr unsigned categories = kAllCategories;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &cmp) {
        return cmp != old ? buf : old;
    }
};
template <>
struct OpFn<FI_CSWAP_LE> {
    static constexpr unsigned categories = kOrdered;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &cmp) {
        return cmp <= old ? buf : old;
    }
};
template <>
struct OpFn<FI_CSWAP_LT> {
    static constexpr unsigned categories = kOrdered;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &cmp) {
        return cmp < old ? buf : old;
    }
};
template <>
struct OpFn<FI_CSWAP_GE> {
    static constexpr unsigned categories = kOrdered;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &cmp) {
        return cmp >= old ? buf : old;
    }
};
template <>
struct OpFn<FI_CSWAP_GT> {
    static constexpr unsigned categories = kOrdered;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &cmp) {
        return cmp > old ? buf : old;
    }
};
template <>
struct OpFn<FI_MSWAP> {
    static constexpr unsigned categories = kIntegers;
    template <class T, class W>
    static TANDEM_HD T apply(const T &old, const T &buf, const T &cmp) {
        return T((buf & cmp) | (old & ~cmp));
    }
};

// Which buffers an op reads: ATOMIC_READ has no operand, only the compare ops a compare.
TANDEM_HD constexpr bool reads_operand(int op) {
    return op != FI_ATOMIC_READ;
}
TANDEM_HD constexpr bool reads_compare(int op) {
    return op >= FI_CSWAP && op <= FI_MSWAP;
}

template <int Op, int Datatype>
TANDEM_HD constexpr bool supported() {
    return (OpFn<Op>::categories & category_mask(DatatypeDesc<Datatype>::category)) != 0;
}

// Runtime lookups, as folds over the tables above: each term is zero but the matching one.
template <size_t... Ds>
TANDEM_HD constexpr size_t datatype_size(int datatype, std::index_sequence<Ds...>) {
    return ((datatype == int(Ds) ? sizeof(typename DatatypeDesc<int(Ds)>::type) : 0) + ...);
}
template <size_t... Ds>
TANDEM_HD constexpr size_t datatype_align(int datatype, std::index_sequence<Ds...>) {
    return ((datatype == int(Ds) ? alignof(typename DatatypeDesc<int(Ds)>::type) : 0) + ...);
}
template <size_t... Ds>
TANDEM_HD constexpr unsigned datatype_category_mask(int datatype, std::index_sequence<Ds...>) {
    return ((datatype == int(Ds) ? category_mask(DatatypeDesc<int(Ds)>::category) : 0u) | ...);
}
template <size_t... Ops>
TANDEM_HD constexpr unsigned op_categories(int op, std::index_sequence<Ops...>) {
    return ((op == int(Ops) ? OpFn<int(Ops)>::categories : 0u) | ...);
}

// Bytes of one element; 0 for anything but a point-to-point datatype.
TANDEM_HD constexpr size_t datatype_size(int datatype) {
    return datatype_size(datatype, DatatypeSeq{});
}
TANDEM_HD constexpr size_t datatype_align(int datatype) {
    return datatype_align(datatype, DatatypeSeq{});
}
// Whether op is defined on datatype (for some kind of call; the kinds are the caller's).
TANDEM_HD constexpr bool valid(int op, int datatype) {
    return (op_categories(op, OpSeq{}) & datatype_category_mask(datatype, DatatypeSeq{})) != 0;
}

// The element loop. Elements go through temporaries with memcpy, so no buffer needs to be
// aligned (wire buffers are not); operand and compare are only touched when the op reads
// them, result only when not null. The target is not written back by ATOMIC_READ.
template <int Op, int Datatype>
TANDEM_HD void apply_elements(void *target, const void *operand, const void *compare, void *result,
                              size_t count) {
    using D = DatatypeDesc<Datatype>;
    using T = typename D::type;
    constexpr size_t n = sizeof(T);
    auto *tgt = static_cast<unsigned char *>(target);
    auto *opd = static_cast<const unsigned char *>(operand);
    auto *cmpb = static_cast<const unsigned char *>(compare);
    auto *res = static_cast<unsigned char *>(result);
    for (size_t i = 0; i < count; ++i) {
        T old, buf{}, cmp{};
        memcpy(&old, tgt + i * n, n);
        if constexpr (reads_operand(Op)) memcpy(&buf, opd + i * n, n);
        if constexpr (reads_compare(Op)) memcpy(&cmp, cmpb + i * n, n);
        if (res) memcpy(res + i * n, &old, n);
        const T next = OpFn<Op>::template apply<T, typename D::wide>(old, buf, cmp);
        if constexpr (Op != FI_ATOMIC_READ) memcpy(tgt + i * n, &next, n);
    }
}

template <int Op, int Datatype>
TANDEM_HD bool try_apply(void *target, const void *operand, const void *compare, void *result,
                         size_t count) {
    if constexpr (supported<Op, Datatype>() && kAvailable<Datatype>) {
        apply_elements<Op, Datatype>(target, operand, compare, result, count);
        return true;
    } else {
        return false;
    }
}

template <int Datatype, size_t... Ops>
TANDEM_HD int apply_op(int op, void *target, const void *operand, const void *compare, void *result,
                       size_t count, std::index_sequence<Ops...>) {
    const bool applied = ((op == int(Ops) && try_apply<int(Ops), Datatype>(target, operand, compare,
                                                                           result, count)) ||
                          ...);
    return applied ? 0 : -FI_EINVAL;
}

// Runtime op on a datatype known at compile time, without function pointers: what a kernel
// calls. 0, or -FI_EINVAL when op is not defined on the datatype (or it is not available
// in this pass). No null checks: buffers the op reads must be there.
template <int Datatype>
TANDEM_HD int apply_op(int op, void *target, const void *operand, const void *compare, void *result,
                       size_t count) {
    return apply_op<Datatype>(op, target, operand, compare, result, count, OpSeq{});
}

#if !defined(__CUDA_ARCH__)
// Host dispatch: one function pointer per (op, datatype), null where the op is not defined.
using ApplyFn = void (*)(void *target, const void *operand, const void *compare, void *result,
                         size_t count);

struct DispatchTable {
    ApplyFn fn[kNumOps * kNumDatatypes];
    // op and datatype must be in range.
    constexpr ApplyFn at(int op, int datatype) const { return fn[op * kNumDatatypes + datatype]; }
};

template <int Op, int Datatype>
constexpr ApplyFn dispatch_entry() {
    if constexpr (supported<Op, Datatype>()) {
        return &apply_elements<Op, Datatype>;
    } else {
        return nullptr;
    }
}

template <size_t... Cells>
constexpr DispatchTable make_dispatch_table(std::index_sequence<Cells...>) {
    return {{dispatch_entry<int(Cells / kNumDatatypes), int(Cells % kNumDatatypes)>()...}};
}

inline constexpr DispatchTable kDispatchTable =
    make_dispatch_table(std::make_index_sequence<kNumOps * kNumDatatypes>{});
#endif

}  // namespace tandem::reduce

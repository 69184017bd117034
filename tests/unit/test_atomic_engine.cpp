// The reduction engine (hmem/reduce_ops.h) through its host API (hmem/atomic.h). Every
// (kind, op, datatype) is checked against an expectation table and a reference written here
// independently of the engine's templates, byte for byte (so NaN outcomes are exact); then
// sizes, refusals, unaligned buffers and integer wrap-around.
#include "hmem/atomic.h"

#include <gtest/gtest.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <cfloat>
#include <complex>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace tandem::atomic {
namespace {

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

constexpr Kind kKinds[] = {Kind::Base, Kind::Fetch, Kind::Compare};
constexpr char kind_letter(Kind k) {
    return k == Kind::Base ? 'B' : k == Kind::Fetch ? 'F' : 'C';
}

// Categories of datatypes: integer, real, complex.
enum : unsigned { I = 1, R = 2, C = 4 };

// What libfabric's atomic tables define per category, and which kinds of call may carry each
// op (fi_atomic(3)): B = fi_atomic, F = fi_fetch_atomic, C = fi_compare_atomic.
struct OpRow {
    int op;
    const char *name;
    const char *kinds;
    unsigned categories;
};
constexpr OpRow kOps[] = {
    {FI_MIN, "MIN", "BF", I | R},
    {FI_MAX, "MAX", "BF", I | R},
    {FI_SUM, "SUM", "BF", I | R | C},
    {FI_PROD, "PROD", "BF", I | R | C},
    {FI_LOR, "LOR", "BF", I | R | C},
    {FI_LAND, "LAND", "BF", I | R | C},
    {FI_BOR, "BOR", "BF", I},
    {FI_BAND, "BAND", "BF", I},
    {FI_LXOR, "LXOR", "BF", I | R | C},
    {FI_BXOR, "BXOR", "BF", I},
    {FI_ATOMIC_READ, "ATOMIC_READ", "F", I | R | C},
    {FI_ATOMIC_WRITE, "ATOMIC_WRITE", "BF", I | R | C},
    {FI_CSWAP, "CSWAP", "C", I | R | C},
    {FI_CSWAP_NE, "CSWAP_NE", "C", I | R | C},
    {FI_CSWAP_LE, "CSWAP_LE", "C", I | R},
    {FI_CSWAP_LT, "CSWAP_LT", "C", I | R},
    {FI_CSWAP_GE, "CSWAP_GE", "C", I | R},
    {FI_CSWAP_GT, "CSWAP_GT", "C", I | R},
    {FI_MSWAP, "MSWAP", "C", I},
};
static_assert(std::size(kOps) == FI_ATOMIC_OP_LAST);

struct TypeRow {
    int datatype;
    const char *name;
    size_t size;
    size_t align;
    unsigned category;
};
constexpr TypeRow kTypes[] = {
    {FI_INT8, "INT8", 1, 1, I},
    {FI_UINT8, "UINT8", 1, 1, I},
    {FI_INT16, "INT16", 2, 2, I},
    {FI_UINT16, "UINT16", 2, 2, I},
    {FI_INT32, "INT32", 4, 4, I},
    {FI_UINT32, "UINT32", 4, 4, I},
    {FI_INT64, "INT64", 8, 8, I},
    {FI_UINT64, "UINT64", 8, 8, I},
    {FI_FLOAT, "FLOAT", 4, 4, R},
    {FI_DOUBLE, "DOUBLE", 8, 8, R},
    {FI_FLOAT_COMPLEX, "FLOAT_COMPLEX", 8, 4, C},
    {FI_DOUBLE_COMPLEX, "DOUBLE_COMPLEX", 16, 8, C},
    {FI_LONG_DOUBLE, "LONG_DOUBLE", sizeof(long double), alignof(long double), R},
    {FI_LONG_DOUBLE_COMPLEX, "LONG_DOUBLE_COMPLEX", 2 * sizeof(long double), alignof(long double),
     C},
    {FI_INT128, "INT128", 16, 16, I},
    {FI_UINT128, "UINT128", 16, 16, I},
};
static_assert(std::size(kTypes) == 16 && FI_INT128 == 14 && FI_UINT128 == 15);

void PrintTo(const TypeRow &row, std::ostream *os) {
    *os << row.name;
}

bool expect_valid(Kind kind, const OpRow &op, const TypeRow &type) {
    return std::strchr(op.kinds, kind_letter(kind)) && (op.categories & type.category);
}

// ---- The reference, per element, over the test's own types ----

template <class T>
struct IsComplex : std::false_type {};
template <class F>
struct IsComplex<std::complex<F>> : std::true_type {};

template <class T>
bool truthy(const T &v) {
    if constexpr (IsComplex<T>::value) {
        return v.real() != 0 || v.imag() != 0;
    } else {
        return v != T(0);
    }
}

template <class T>
T from_bool(bool b) {
    return b ? T(1) : T(0);
}

// Computes in 128 unsigned bits and truncates: modular arithmetic, whatever the width.
template <class T>
T wrap_sum(T a, T b) {
    return T(u128(a) + u128(b));
}
template <class T>
T wrap_prod(T a, T b) {
    return T(u128(a) * u128(b));
}

template <class T>
T reference(int op, T old, T buf, T cmp) {
    constexpr bool integer = !std::is_floating_point_v<T> && !IsComplex<T>::value;
    constexpr bool ordered = !IsComplex<T>::value;
    const bool a = truthy(old), b = truthy(buf);
    switch (op) {
        case FI_SUM:
            if constexpr (integer)
                return wrap_sum(old, buf);
            else
                return old + buf;
        case FI_PROD:
            if constexpr (integer) {
                return wrap_prod(old, buf);
            } else if constexpr (IsComplex<T>::value) {
                return T(old.real() * buf.real() - old.imag() * buf.imag(),
                         old.real() * buf.imag() + old.imag() * buf.real());
            } else {
                return old * buf;
            }
        case FI_LOR:
            return from_bool<T>(a || b);
        case FI_LAND:
            return from_bool<T>(a && b);
        case FI_LXOR:
            return from_bool<T>((a && !b) || (!a && b));
        case FI_ATOMIC_READ:
            return old;
        case FI_ATOMIC_WRITE:
            return buf;
        case FI_CSWAP:
            if (cmp == old) return buf;
            return old;
        case FI_CSWAP_NE:
            if (cmp != old) return buf;
            return old;
    }
    if constexpr (ordered) {
        switch (op) {
            case FI_MIN:
                if (buf < old) return buf;
                return old;
            case FI_MAX:
                if (buf > old) return buf;
                return old;
            case FI_CSWAP_LE:
                if (cmp <= old) return buf;
                return old;
            case FI_CSWAP_LT:
                if (cmp < old) return buf;
                return old;
            case FI_CSWAP_GE:
                if (cmp >= old) return buf;
                return old;
            case FI_CSWAP_GT:
                if (cmp > old) return buf;
                return old;
        }
    }
    if constexpr (integer) {
        switch (op) {
            case FI_BOR:
                return T(old | buf);
            case FI_BAND:
                return T(old & buf);
            case FI_BXOR:
                return T(old ^ buf);
            case FI_MSWAP:
                return T((buf & cmp) | (old & ~cmp));
        }
    }
    ADD_FAILURE() << "no reference for op " << op;
    return old;
}

// ---- Values per type ----

template <class T>
T top() {
    if constexpr (std::is_same_v<T, i128>) {
        return i128(~u128(0) >> 1);
    } else if constexpr (std::is_same_v<T, u128>) {
        return ~u128(0);
    } else {
        return std::numeric_limits<T>::max();
    }
}
template <class T>
T bottom() {
    if constexpr (std::is_same_v<T, i128>) {
        return -top<i128>() - 1;
    } else if constexpr (std::is_same_v<T, u128>) {
        return 0;
    } else {
        return std::numeric_limits<T>::lowest();
    }
}

// Every pair (and triple, for the compare ops) of these meets in some call, so equal values
// meet too.
template <class T>
std::vector<T> values() {
    if constexpr (IsComplex<T>::value) {
        using F = typename T::value_type;
        const F nan = std::numeric_limits<F>::quiet_NaN();
        // No infinities: inf * 0 makes a NaN whose sign depends on operand order.
        return {T(1, 2), T(-0.0, 0), T(0, 0), T(0, -1.5), T(3, 3), T(nan, 1), T(-2, -0.5)};
    } else if constexpr (std::is_floating_point_v<T>) {
        const T inf = std::numeric_limits<T>::infinity();
        return {T(-2.5), T(-0.0), T(0.0), T(1), T(3), std::numeric_limits<T>::quiet_NaN(),
                inf,     -inf};
    } else if constexpr (std::is_same_v<T, u128> || std::is_unsigned_v<T>) {
        return {T(0), T(1), T(2), T(0x5a), T(top<T>() / 2 + 1), T(top<T>() - 1), top<T>()};
    } else {
        return {bottom<T>(), T(-3), T(-1), T(0), T(1), T(0x5a), top<T>()};
    }
}

// ---- Byte comparison, blind to padding (long double: 10 value bytes of 16 on x86-64) ----

template <class T>
struct Layout {
    static constexpr size_t parts = 1, stride = sizeof(T), used = sizeof(T);
};
constexpr size_t kLongDoubleUsed = LDBL_MANT_DIG == 64 ? 10 : sizeof(long double);
template <>
struct Layout<long double> {
    static constexpr size_t parts = 1, stride = sizeof(long double), used = kLongDoubleUsed;
};
template <>
struct Layout<std::complex<long double>> {
    static constexpr size_t parts = 2, stride = sizeof(long double), used = kLongDoubleUsed;
};

template <class T>
bool same_elements(const uint8_t *a, const uint8_t *b, size_t count) {
    for (size_t i = 0; i < count * Layout<T>::parts; ++i)
        if (std::memcmp(a + i * Layout<T>::stride, b + i * Layout<T>::stride, Layout<T>::used))
            return false;
    return true;
}

template <class T>
std::string hex(const uint8_t *p, size_t count) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < count * sizeof(T); ++i) {
        if (i && i % sizeof(T) == 0) s += ' ';
        s += digits[p[i] >> 4];
        s += digits[p[i] & 15];
    }
    return s;
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T> &v) {
    std::vector<uint8_t> out(v.size() * sizeof(T));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

constexpr size_t kCount = 5;

// Runs one valid (kind, op) on type T over every combination of values, kCount at a time,
// with the buffers that kind of call would pass: no operand for ATOMIC_READ, a compare only
// for the compare kind, a result only for the fetching kinds.
template <class T>
void check_op(const TypeRow &type, Kind kind, int op) {
    const std::vector<T> vals = values<T>();
    const size_t n = vals.size();
    const bool compares = kind == Kind::Compare;
    const size_t combos = compares ? n * n * n : n * n;
    std::vector<T> olds, bufs, cmps;
    for (size_t c = 0; c < combos; ++c) {
        olds.push_back(vals[c % n]);
        bufs.push_back(vals[c / n % n]);
        cmps.push_back(vals[c / n / n % n]);
    }
    for (size_t first = 0; first < combos; first += kCount) {
        std::vector<T> old(kCount), buf(kCount), cmp(kCount), want(kCount);
        for (size_t i = 0; i < kCount; ++i) {
            const size_t c = (first + i) % combos;  // the last call wraps to the start
            old[i] = olds[c];
            buf[i] = bufs[c];
            cmp[i] = cmps[c];
            want[i] = reference<T>(op, old[i], buf[i], cmp[i]);
        }
        std::vector<uint8_t> target = bytes_of(old), operand = bytes_of(buf),
                             compare = bytes_of(cmp), result(kCount * sizeof(T), 0xee);
        const int rc =
            apply(op, type.datatype, target.data(), op == FI_ATOMIC_READ ? nullptr : operand.data(),
                  compares ? compare.data() : nullptr, kind == Kind::Base ? nullptr : result.data(),
                  kCount);
        ASSERT_EQ(rc, 0);
        const std::vector<uint8_t> want_target = bytes_of(want), want_result = bytes_of(old);
        EXPECT_TRUE(same_elements<T>(target.data(), want_target.data(), kCount))
            << "old " << hex<T>(want_result.data(), kCount) << "\nbuf "
            << hex<T>(operand.data(), kCount)
            << (compares ? "\ncmp " + hex<T>(compare.data(), kCount) : std::string()) << "\ngot "
            << hex<T>(target.data(), kCount) << "\nwant " << hex<T>(want_target.data(), kCount);
        if (kind != Kind::Base) {
            EXPECT_TRUE(same_elements<T>(result.data(), want_result.data(), kCount))
                << "got " << hex<T>(result.data(), kCount) << "\nwant "
                << hex<T>(want_result.data(), kCount);
        }
        if (::testing::Test::HasFailure()) return;  // one report per (kind, op) is enough
    }
}

template <class T>
void check_every_kind_and_op(const TypeRow &type) {
    for (Kind kind : kKinds) {
        for (const OpRow &op : kOps) {
            SCOPED_TRACE(std::string("kind ") + kind_letter(kind) + ", op " + op.name);
            const bool want = expect_valid(kind, op, type);
            ASSERT_EQ(valid(kind, op.op, type.datatype), want);
            if (want) check_op<T>(type, kind, op.op);
            if (::testing::Test::HasFatalFailure()) return;
        }
    }
}

class AtomicEngineDatatype : public ::testing::TestWithParam<TypeRow> {};

TEST_P(AtomicEngineDatatype, EveryKindAndOpMatchesTheReference) {
    const TypeRow &type = GetParam();
    switch (type.datatype) {
        case FI_INT8:
            return check_every_kind_and_op<int8_t>(type);
        case FI_UINT8:
            return check_every_kind_and_op<uint8_t>(type);
        case FI_INT16:
            return check_every_kind_and_op<int16_t>(type);
        case FI_UINT16:
            return check_every_kind_and_op<uint16_t>(type);
        case FI_INT32:
            return check_every_kind_and_op<int32_t>(type);
        case FI_UINT32:
            return check_every_kind_and_op<uint32_t>(type);
        case FI_INT64:
            return check_every_kind_and_op<int64_t>(type);
        case FI_UINT64:
            return check_every_kind_and_op<uint64_t>(type);
        case FI_FLOAT:
            return check_every_kind_and_op<float>(type);
        case FI_DOUBLE:
            return check_every_kind_and_op<double>(type);
        case FI_FLOAT_COMPLEX:
            return check_every_kind_and_op<std::complex<float>>(type);
        case FI_DOUBLE_COMPLEX:
            return check_every_kind_and_op<std::complex<double>>(type);
        case FI_LONG_DOUBLE:
            return check_every_kind_and_op<long double>(type);
        case FI_LONG_DOUBLE_COMPLEX:
            return check_every_kind_and_op<std::complex<long double>>(type);
        case FI_INT128:
            return check_every_kind_and_op<i128>(type);
        case FI_UINT128:
            return check_every_kind_and_op<u128>(type);
    }
    FAIL() << "no C++ type for " << type.name;
}

INSTANTIATE_TEST_SUITE_P(AllDatatypes, AtomicEngineDatatype, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<TypeRow> &info) {
                             return std::string(info.param.name);
                         });

// ---- Refusals ----

TEST(AtomicEngine, PairsValidForNoKindAreRefusedAndTouchNothing) {
    uint8_t target[64], operand[64], compare[64], result[64];
    std::memset(operand, 0x11, sizeof operand);
    std::memset(compare, 0x22, sizeof compare);
    int refused = 0;
    for (const OpRow &op : kOps) {
        for (const TypeRow &type : kTypes) {
            if (op.categories & type.category) continue;
            SCOPED_TRACE(std::string(op.name) + " on " + type.name);
            std::memset(target, 0x5a, sizeof target);
            std::memset(result, 0x77, sizeof result);
            EXPECT_EQ(apply(op.op, type.datatype, target, operand, compare, result, 2), -FI_EINVAL);
            EXPECT_EQ(reduce(op.op, type.datatype, target, operand, 2), -FI_EINVAL);
            for (Kind kind : kKinds) EXPECT_FALSE(valid(kind, op.op, type.datatype));
            for (size_t i = 0; i < sizeof target; ++i) {
                ASSERT_EQ(target[i], 0x5a);
                ASSERT_EQ(result[i], 0x77);
            }
            ++refused;
        }
    }
    // 6 ordered ops x 3 complex types + 4 integer-only ops x 6 other types.
    EXPECT_EQ(refused, 6 * 3 + 4 * 6);
}

TEST(AtomicEngine, UnknownOpsDatatypesAndKindsAreRefused) {
    uint8_t target[16] = {}, operand[16] = {}, compare[16] = {}, result[16] = {};
    for (int op : {-1, int(FI_ATOMIC_OP_LAST), int(FI_NOOP), 1000}) {
        EXPECT_EQ(apply(op, FI_INT32, target, operand, compare, result, 1), -FI_EINVAL) << op;
        EXPECT_EQ(reduce(op, FI_INT32, target, operand, 1), -FI_EINVAL) << op;
        for (Kind kind : kKinds) EXPECT_FALSE(valid(kind, op, FI_INT32)) << op;
    }
    for (int datatype : {-1, 16, 99, int(FI_VOID), 1000}) {
        EXPECT_EQ(apply(FI_SUM, datatype, target, operand, compare, result, 1), -FI_EINVAL)
            << datatype;
        EXPECT_EQ(reduce(FI_SUM, datatype, target, operand, 1), -FI_EINVAL) << datatype;
        for (Kind kind : kKinds) EXPECT_FALSE(valid(kind, FI_SUM, datatype)) << datatype;
    }
    EXPECT_FALSE(valid(Kind(3), FI_SUM, FI_INT32));
    EXPECT_FALSE(valid(Kind(255), FI_ATOMIC_READ, FI_INT32));
}

// reduce() carries the base kind only.
TEST(AtomicEngine, ReduceRefusesOpsOutsideTheBaseKind) {
    int32_t dst[1] = {7}, src[1] = {9};
    for (int op : {FI_ATOMIC_READ, FI_CSWAP, FI_CSWAP_NE, FI_CSWAP_LT, FI_MSWAP}) {
        EXPECT_EQ(reduce(op, FI_INT32, dst, src, 1), -FI_EINVAL) << op;
        EXPECT_EQ(dst[0], 7);
    }
}

TEST(AtomicEngine, MissingBuffersAreRefused) {
    double target[2] = {1, 2}, operand[2] = {3, 4}, compare[2] = {1, 2};
    EXPECT_EQ(apply(FI_SUM, FI_DOUBLE, nullptr, operand, nullptr, nullptr, 2), -FI_EINVAL);
    EXPECT_EQ(apply(FI_SUM, FI_DOUBLE, target, nullptr, nullptr, nullptr, 2), -FI_EINVAL);
    EXPECT_EQ(apply(FI_CSWAP, FI_DOUBLE, target, operand, nullptr, nullptr, 2), -FI_EINVAL);
    EXPECT_EQ(apply(FI_CSWAP, FI_DOUBLE, target, nullptr, compare, nullptr, 2), -FI_EINVAL);
    EXPECT_EQ(target[0], 1);
    EXPECT_EQ(target[1], 2);
    // Nothing to do is not an error, and neither is a null operand for ATOMIC_READ.
    EXPECT_EQ(apply(FI_SUM, FI_DOUBLE, nullptr, nullptr, nullptr, nullptr, 0), 0);
    double result[2] = {};
    EXPECT_EQ(apply(FI_ATOMIC_READ, FI_DOUBLE, target, nullptr, nullptr, result, 2), 0);
    EXPECT_EQ(result[1], 2);
}

// ---- Sizes ----

TEST(AtomicEngine, SizesAlignmentsAndCounts) {
    for (const TypeRow &type : kTypes) {
        SCOPED_TRACE(type.name);
        EXPECT_EQ(datatype_size(type.datatype), type.size);
        EXPECT_EQ(datatype_align(type.datatype), type.align);
        EXPECT_EQ(max_count(type.datatype), kMaxBytes / type.size);
    }
    EXPECT_EQ(max_count(FI_INT8), 2048u);
    EXPECT_EQ(max_count(FI_DOUBLE_COMPLEX), 128u);
    for (int bad : {-1, 16, 17, 99, int(FI_VOID), int(FI_VOID) + 1}) {
        SCOPED_TRACE(bad);
        EXPECT_EQ(datatype_size(bad), 0u);
        EXPECT_EQ(datatype_align(bad), 0u);
        EXPECT_EQ(max_count(bad), 0u);
    }
}

// ---- Buffers straight off the wire ----

template <class T>
void check_unaligned(int datatype, int op, const std::vector<T> &old, const std::vector<T> &buf,
                     const std::vector<T> &want) {
    const size_t bytes = old.size() * sizeof(T);
    std::vector<uint8_t> target(bytes + 1), operand(bytes + 1), result(bytes + 1), expect(bytes);
    std::memcpy(target.data() + 1, old.data(), bytes);
    std::memcpy(operand.data() + 1, buf.data(), bytes);
    ASSERT_EQ(apply(op, datatype, target.data() + 1, operand.data() + 1, nullptr, result.data() + 1,
                    old.size()),
              0);
    std::memcpy(expect.data(), want.data(), bytes);
    EXPECT_TRUE(same_elements<T>(target.data() + 1, expect.data(), old.size()));
    std::memcpy(expect.data(), old.data(), bytes);
    EXPECT_TRUE(same_elements<T>(result.data() + 1, expect.data(), old.size()));
}

TEST(AtomicEngine, UnalignedBuffers) {
    check_unaligned<int32_t>(FI_INT32, FI_SUM, {1, -2, 3}, {10, 20, -30}, {11, 18, -27});
    check_unaligned<double>(FI_DOUBLE, FI_MAX, {1.5, -2, 3}, {1, 4, 3}, {1.5, 4, 3});
    check_unaligned<i128>(FI_INT128, FI_BXOR, {i128(1) << 100, 3}, {i128(1) << 100, 5}, {0, 6});
    check_unaligned<std::complex<double>>(FI_DOUBLE_COMPLEX, FI_PROD, {{1, 2}, {0, 1}},
                                          {{3, 4}, {0, 1}}, {{-5, 10}, {-1, 0}});
    check_unaligned<std::complex<long double>>(FI_LONG_DOUBLE_COMPLEX, FI_SUM, {{1, 2}},
                                               {{0.5, -4}}, {{1.5, -2}});
    check_unaligned<long double>(FI_LONG_DOUBLE, FI_MIN, {2, -1}, {1, 0}, {1, -1});
}

// ---- Wrap-around (run under UBSan in sanitizer builds) ----

template <class T>
T apply_one(int op, int datatype, T old, T buf) {
    EXPECT_EQ(apply(op, datatype, &old, &buf, nullptr, nullptr, 1), 0);
    return old;
}

TEST(AtomicEngine, IntegerOverflowWraps) {
    EXPECT_EQ(apply_one<int64_t>(FI_SUM, FI_INT64, INT64_MAX, 1), INT64_MIN);
    EXPECT_EQ(apply_one<int64_t>(FI_SUM, FI_INT64, INT64_MIN, -1), INT64_MAX);
    EXPECT_EQ(apply_one<int64_t>(FI_PROD, FI_INT64, INT64_MIN, -1), INT64_MIN);
    EXPECT_EQ(apply_one<int32_t>(FI_PROD, FI_INT32, INT32_MAX, 2), -2);
    EXPECT_EQ(apply_one<int8_t>(FI_PROD, FI_INT8, 100, 3), int8_t(44));
    EXPECT_EQ(apply_one<int8_t>(FI_PROD, FI_INT8, -128, -1), int8_t(-128));
    EXPECT_EQ(apply_one<int8_t>(FI_SUM, FI_INT8, 127, 1), int8_t(-128));
    EXPECT_EQ(apply_one<uint8_t>(FI_SUM, FI_UINT8, 255, 2), uint8_t(1));
    // Promoted to int, 0xffff * 0xffff would overflow it.
    EXPECT_EQ(apply_one<uint16_t>(FI_PROD, FI_UINT16, 0xffff, 0xffff), uint16_t(1));
    EXPECT_EQ(apply_one<int16_t>(FI_PROD, FI_INT16, -32768, -32768), int16_t(0));
    EXPECT_EQ(apply_one<uint64_t>(FI_SUM, FI_UINT64, UINT64_MAX, 1), 0u);
    const i128 max128 = top<i128>();
    EXPECT_TRUE(apply_one<i128>(FI_SUM, FI_INT128, max128, 1) == -max128 - 1);
    EXPECT_TRUE(apply_one<i128>(FI_PROD, FI_INT128, max128, 2) == -2);
    EXPECT_TRUE(apply_one<u128>(FI_SUM, FI_UINT128, ~u128(0), 1) == 0);
}

// ---- The documented floating-point edge cases, spelled out ----

uint64_t bits(double d) {
    uint64_t b;
    std::memcpy(&b, &d, sizeof b);
    return b;
}

TEST(AtomicEngine, FloatingPointEdgeCasesAreLiteral) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(bits(apply_one(FI_MIN, FI_DOUBLE, 1.0, nan)), bits(1.0));  // NaN never wins
    EXPECT_EQ(bits(apply_one(FI_MAX, FI_DOUBLE, 1.0, nan)), bits(1.0));
    EXPECT_EQ(bits(apply_one(FI_MIN, FI_DOUBLE, nan, -1.0)), bits(nan));  // nor is replaced
    EXPECT_EQ(bits(apply_one(FI_MAX, FI_DOUBLE, nan, 1.0)), bits(nan));
    EXPECT_EQ(bits(apply_one(FI_MIN, FI_DOUBLE, 0.0, -0.0)), bits(0.0));  // zeros are equal
    EXPECT_EQ(bits(apply_one(FI_MAX, FI_DOUBLE, -0.0, 0.0)), bits(-0.0));
    EXPECT_EQ(apply_one(FI_LAND, FI_DOUBLE, nan, 2.0), 1.0);  // NaN is true
    EXPECT_EQ(apply_one(FI_LXOR, FI_DOUBLE, -0.0, 0.0), 0.0);

    double target = 5.0, operand = 9.0, compare = nan;
    ASSERT_EQ(apply(FI_CSWAP_NE, FI_DOUBLE, &target, &operand, &compare, nullptr, 1), 0);
    EXPECT_EQ(target, 9.0);  // NaN != 5.0
    target = 0.0;
    compare = -0.0;
    ASSERT_EQ(apply(FI_CSWAP, FI_DOUBLE, &target, &operand, &compare, nullptr, 1), 0);
    EXPECT_EQ(target, 9.0);  // -0.0 == +0.0
    target = nan;
    compare = nan;
    ASSERT_EQ(apply(FI_CSWAP_LE, FI_DOUBLE, &target, &operand, &compare, nullptr, 1), 0);
    EXPECT_EQ(bits(target), bits(nan));

    // Complex logical results are {1, 0} or {0, 0}; either part makes a value true.
    std::complex<float> c = {0, 0}, d = {0, -3};
    ASSERT_EQ(apply(FI_LOR, FI_FLOAT_COMPLEX, &c, &d, nullptr, nullptr, 1), 0);
    EXPECT_EQ(c, std::complex<float>(1, 0));
}

TEST(AtomicEngine, ReduceCombinesDestinationWithSource) {
    double dst[4] = {1, 5, -2, 0}, src[4] = {3, 2, -7, -0.0};
    ASSERT_EQ(reduce(FI_MIN, FI_DOUBLE, dst, src, 4), 0);
    EXPECT_EQ(dst[0], 1);
    EXPECT_EQ(dst[1], 2);
    EXPECT_EQ(dst[2], -7);
    EXPECT_EQ(bits(dst[3]), bits(0.0));
    uint32_t u[3] = {1, 2, 0xffffffff}, v[3] = {4, 4, 1};
    ASSERT_EQ(reduce(FI_SUM, FI_UINT32, u, v, 3), 0);
    EXPECT_EQ(u[0], 5u);
    EXPECT_EQ(u[1], 6u);
    EXPECT_EQ(u[2], 0u);
    ASSERT_EQ(reduce(FI_ATOMIC_WRITE, FI_UINT32, u, v, 3), 0);
    EXPECT_EQ(u[2], 1u);
}

}  // namespace
}  // namespace tandem::atomic

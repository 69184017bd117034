// hmem/cuda_abi.h checked against a real cuda.h (the directory of the build's -I): every value,
// every type's size and alignment, and the ABI of every call of TANDEM_CUDA_DRIVER_CALLS
// against cuda.h's declaration of the exported symbol that tandem resolves with dlsym. The
// checks are static_asserts: a mismatch fails the build. The run prints what was checked, and
// fails if hmem/cuda_abi.h declares a constant or type that this file does not check.
//
// Exact type identity is impossible by design (tandem says int where cuda.h has an enum, and has
// its own opaque struct names), so types compare by ABI: same kind (integral or enum, floating,
// pointer, struct by value, opaque struct), size and alignment; a pointer's pointee compares the
// same way (a size_t * against an unsigned * would let the driver write past the object), and
// so does its constness.

// cuda.h declares each exported symbol under its own name (cuMemAlloc_v2, cuStreamQuery, both
// cuStreamDestroy and cuStreamDestroy_v2...) without its API-mapping macros only for the driver's
// own build; that is the declaration dlsym finds.
#define __CUDA_API_VERSION_INTERNAL 1  // NOLINT(bugprone-reserved-identifier)
#include <cuda.h>
#undef __CUDA_API_VERSION_INTERNAL

// What hmem/cuda_abi.h includes, so that including it inside a namespace adds no library's
// declarations there; its own names then live in tabi:: beside cuda.h's global ones.
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
// gcc 12 at -O2 with the sanitizers says members of std::function "may be used uninitialized"
// inside libstdc++'s own regex compiler (a false positive in the header, not this file's).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop
#include <set>
#include <string>
#include <tuple>
#include <type_traits>

namespace tabi {
#include "hmem/cuda_abi.h"
}  // namespace tabi

#ifndef TANDEM_CUDA_ABI_H
#error "TANDEM_CUDA_ABI_H: the path of hmem/cuda_abi.h, compiled in by CMake"
#endif
#ifndef TANDEM_CUDA_HEADER_DIR
#define TANDEM_CUDA_HEADER_DIR "(the compiler's include path)"
#endif

namespace {

enum class Kind { kVoid, kIntegral, kFloating, kPointer, kFunction, kStruct, kOpaque, kOther };

template <class T>
concept Complete = requires {
    sizeof(T);
};

template <class T>
consteval Kind kind_of() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_void_v<U>)
        return Kind::kVoid;
    else if constexpr (std::is_function_v<U>)
        return Kind::kFunction;
    else if constexpr (std::is_class_v<U> && !Complete<U>)
        return Kind::kOpaque;
    else if constexpr (std::is_integral_v<U> || std::is_enum_v<U>)
        return Kind::kIntegral;
    else if constexpr (std::is_floating_point_v<U>)
        return Kind::kFloating;
    else if constexpr (std::is_pointer_v<U>)
        return Kind::kPointer;
    else if constexpr (std::is_class_v<U> || std::is_union_v<U>)
        return Kind::kStruct;
    else
        return Kind::kOther;
}

template <class F, class G>
struct SameCall;

// True when a T where cuda.h has a C is passed, returned and pointed to alike.
template <class T, class C>
consteval bool same_abi() {
    constexpr Kind kind = kind_of<T>();
    if constexpr (kind != kind_of<C>() || kind == Kind::kOther) {
        return false;
    } else if constexpr (kind == Kind::kVoid || kind == Kind::kOpaque) {
        return true;
    } else if constexpr (kind == Kind::kFunction) {
        return SameCall<T, C>::value;
    } else if constexpr (sizeof(T) != sizeof(C) || alignof(T) != alignof(C)) {
        return false;
    } else if constexpr (kind == Kind::kPointer) {
        using TP = std::remove_pointer_t<T>;
        using CP = std::remove_pointer_t<C>;
        return std::is_const_v<TP> == std::is_const_v<CP> && same_abi<TP, CP>();
    } else if constexpr (kind == Kind::kStruct) {
        // Passed in registers or memory by its layout; a non-trivial one goes by reference.
        return std::is_trivially_copyable_v<T> == std::is_trivially_copyable_v<C>;
    } else {
        return true;
    }
}

// The first parameter (1-based) whose ABI differs, 0 when none does.
template <class... T>
struct Params {};
template <class TP, class CP>
struct FirstBadParam;
template <>
struct FirstBadParam<Params<>, Params<>> : std::integral_constant<int, 0> {};
template <class T, class... TR, class C, class... CR>
struct FirstBadParam<Params<T, TR...>, Params<C, CR...>>
    : std::integral_constant<int, !same_abi<T, C>() ? 1
                                  : FirstBadParam<Params<TR...>, Params<CR...>>::value == 0
                                      ? 0
                                      : 1 + FirstBadParam<Params<TR...>, Params<CR...>>::value> {};

template <class F, class G>
struct SameCall : std::false_type {
    static constexpr bool kFunctions = false;
};
template <class TR, class... TA, class CR, class... CA>
struct SameCall<TR(TA...), CR(CA...)> {
    static constexpr bool kFunctions = true;
    static constexpr int kTandemArity = sizeof...(TA);
    static constexpr int kCudaArity = sizeof...(CA);
    static constexpr bool kSameReturn = same_abi<TR, CR>();
    static constexpr int kBadParam = [] {
        if constexpr (sizeof...(TA) == sizeof...(CA))
            return FirstBadParam<Params<TA...>, Params<CA...>>::value;
        else
            return -1;
    }();
    static constexpr bool value = kTandemArity == kCudaArity && kSameReturn && kBadParam == 0;
    template <int N>
    using TandemParam = std::tuple_element_t<N - 1, std::tuple<TA...>>;
    template <int N>
    using CudaParam = std::tuple_element_t<N - 1, std::tuple<CA...>>;
};

// Never defined: naming it in an error shows which parameter differs, and both types.
template <int Parameter, class InCudaAbiH, class InCudaH>
struct ParameterDiffersInAbi;

template <class Check>
consteval bool params_match() {
    constexpr int bad = Check::kBadParam;
    if constexpr (bad > 0) {
        using Report = ParameterDiffersInAbi<bad, typename Check::template TandemParam<bad>,
                                             typename Check::template CudaParam<bad>>;
        return sizeof(Report) == 0;
    } else {
        return true;
    }
}

}  // namespace

// ---- The calls: one block of checks per entry of TANDEM_CUDA_DRIVER_CALLS, against cuda.h's
// declaration of the exported symbol (the global one). Each block lives in tabi::, so that the
// types of the entry are found as cuda_abi.h declares them, not as cuda.h does.
#define CHECK_CALL(field, sym, ret, params)                                                       \
    namespace tabi::check_##field {                                                               \
        using Tandem = ret params;                                                                \
        using Cuda = decltype(::sym);                                                             \
        using Check = SameCall<Tandem, Cuda>;                                                     \
        static_assert(Check::kFunctions, #sym ": not a function in cuda.h");                      \
        static_assert(Check::kTandemArity == Check::kCudaArity,                                   \
                      #sym ": cuda_abi.h gives it another number of parameters than cuda.h");     \
        static_assert(Check::kSameReturn, #sym ": its return type differs in ABI from cuda.h's"); \
        static_assert(params_match<Check>(), #sym                                                 \
                      ": a parameter differs in ABI (kind, size, alignment or pointee) from "     \
                      "cuda.h's: see ParameterDiffersInAbi<number, cuda_abi.h's, cuda.h's>");     \
    }
TANDEM_CUDA_DRIVER_CALLS(CHECK_CALL)
#undef CHECK_CALL

namespace {

#define COUNT_CALL(field, sym, ret, params) +1
constexpr int kCalls = 0 TANDEM_CUDA_DRIVER_CALLS(COUNT_CALL);
#undef COUNT_CALL
#define NAME_CALL(field, sym, ret, params) #sym,
constexpr const char *kCallNames[] = {TANDEM_CUDA_DRIVER_CALLS(NAME_CALL)};
#undef NAME_CALL

// ---- The types: tandem's name, cuda.h's.
#define CHECKED_TYPES(X)        \
    X(CUresult, CUresult)       \
    X(CUdevice, CUdevice)       \
    X(CUdeviceptr, CUdeviceptr) \
    X(CUcontext, CUcontext)     \
    X(CUstream, CUstream)       \
    X(CUevent, CUevent)         \
    X(CUipcMemHandle, CUipcMemHandle)

#define CHECK_TYPE(ours, theirs)                    \
    static_assert(same_abi<tabi::ours, ::theirs>(), \
                  #ours ": kind, size or alignment differs from cuda.h's " #theirs);
CHECKED_TYPES(CHECK_TYPE)
#undef CHECK_TYPE

// CUipcMemHandle is passed by value (cuIpcOpenMemHandle_v2): its layout too.
static_assert(tabi::kCuIpcHandleSize == CU_IPC_HANDLE_SIZE, "kCuIpcHandleSize: not cuda.h's");
static_assert(sizeof(tabi::CUipcMemHandle::reserved) == sizeof(::CUipcMemHandle::reserved),
              "CUipcMemHandle::reserved: not cuda.h's size");
static_assert(offsetof(tabi::CUipcMemHandle, reserved) == offsetof(::CUipcMemHandle, reserved),
              "CUipcMemHandle::reserved: not at cuda.h's offset");
static_assert(std::is_same_v<std::remove_extent_t<decltype(tabi::CUipcMemHandle::reserved)>,
                             std::remove_extent_t<decltype(::CUipcMemHandle::reserved)>>,
              "CUipcMemHandle::reserved: not cuda.h's element type");

// ---- The constants: each of cuda_abi.h's against cuda.h's value of the same name.
#define CHECKED_VALUES(X)                           \
    X(CUDA_SUCCESS)                                 \
    X(CUDA_ERROR_INVALID_VALUE)                     \
    X(CUDA_ERROR_OUT_OF_MEMORY)                     \
    X(CUDA_ERROR_NOT_INITIALIZED)                   \
    X(CUDA_ERROR_NO_DEVICE)                         \
    X(CUDA_ERROR_INVALID_DEVICE)                    \
    X(CUDA_ERROR_INVALID_CONTEXT)                   \
    X(CUDA_ERROR_MAP_FAILED)                        \
    X(CUDA_ERROR_ALREADY_MAPPED)                    \
    X(CUDA_ERROR_NOT_MAPPED)                        \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)           \
    X(CUDA_ERROR_INVALID_HANDLE)                    \
    X(CUDA_ERROR_NOT_READY)                         \
    X(CUDA_ERROR_ILLEGAL_ADDRESS)                   \
    X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)       \
    X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)           \
    X(CUDA_ERROR_NOT_PERMITTED)                     \
    X(CUDA_ERROR_NOT_SUPPORTED)                     \
    X(CUDA_ERROR_UNKNOWN)                           \
    X(CU_POINTER_ATTRIBUTE_CONTEXT)                 \
    X(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)             \
    X(CU_POINTER_ATTRIBUTE_DEVICE_POINTER)          \
    X(CU_POINTER_ATTRIBUTE_HOST_POINTER)            \
    X(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)             \
    X(CU_POINTER_ATTRIBUTE_BUFFER_ID)               \
    X(CU_POINTER_ATTRIBUTE_IS_MANAGED)              \
    X(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)          \
    X(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)        \
    X(CU_POINTER_ATTRIBUTE_RANGE_SIZE)              \
    X(CU_POINTER_ATTRIBUTE_MAPPED)                  \
    X(CU_MEMORYTYPE_HOST)                           \
    X(CU_MEMORYTYPE_DEVICE)                         \
    X(CU_MEMORYTYPE_ARRAY)                          \
    X(CU_MEMORYTYPE_UNIFIED)                        \
    X(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)               \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) \
    X(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)       \
    X(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)        \
    X(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)           \
    X(CU_STREAM_NON_BLOCKING)                       \
    X(CU_EVENT_DISABLE_TIMING)                      \
    X(CU_STREAM_WAIT_VALUE_GEQ)                     \
    X(CU_STREAM_WAIT_VALUE_EQ)                      \
    X(CU_STREAM_WRITE_VALUE_DEFAULT)                \
    X(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)

// As long long: both sides' values are small and non-negative, whatever their enum's type.
#define CHECK_VALUE(name)                                                               \
    static_assert(static_cast<long long>(tabi::name) == static_cast<long long>(::name), \
                  #name ": cuda_abi.h's value is not cuda.h's");
CHECKED_VALUES(CHECK_VALUE)
#undef CHECK_VALUE

#define NAME_OF(name, ...) #name,
constexpr const char *kValueNames[] = {CHECKED_VALUES(NAME_OF)};
constexpr const char *kTypeNames[] = {CHECKED_TYPES(NAME_OF)};
// Checked with the types above: the IPC handle's size, and the handles' structs (pointers to a
// struct that is opaque, incomplete, on both sides).
constexpr const char *kAlsoChecked[] = {"kCuIpcHandleSize", "CUctx_st", "CUstream_st",
                                        "CUevent_st"};
#undef NAME_OF

// The names hmem/cuda_abi.h declares at file scope (enumerators, constants, aliases, structs),
// read from its text: the ones this file does not check are returned.
std::set<std::string> unchecked_names(const char *path, bool *read) {
    std::ifstream in(path);
    *read = static_cast<bool>(in);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::set<std::string> declared;
    const std::regex patterns[] = {
        std::regex(R"(\n\s*(CU(?:DA)?_[A-Z0-9_]+)\s*=)"),            // enumerators
        std::regex(R"(\binline\s+constexpr\s+[\w:]+\s+(\w+)\s*=)"),  // constants
        std::regex(R"(\busing\s+(CU\w+)\s*=)"),                      // aliases
        std::regex(R"(\bstruct\s+(CU\w+)\b)"),                       // structs
        std::regex(R"(#\s*define\s+(CU(?:DA)?_\w+))"),               // macros
        std::regex(R"(\btypedef\b[^;]*\b(CU\w+)\s*;)"),              // typedefs
    };
    for (const auto &pattern : patterns) {
        for (std::sregex_iterator it(text.begin(), text.end(), pattern), end; it != end; ++it)
            declared.insert((*it)[1].str());
    }
    for (const char *name : kValueNames) declared.erase(name);
    for (const char *name : kTypeNames) declared.erase(name);
    for (const char *name : kAlsoChecked) declared.erase(name);
    return declared;
}

}  // namespace

int main() {
    bool read = false;
    const std::set<std::string> unchecked = unchecked_names(TANDEM_CUDA_ABI_H, &read);
    if (!read) {
        std::cerr << "cannot read " << TANDEM_CUDA_ABI_H << "\n";
        return 1;
    }
    std::cout << "hmem/cuda_abi.h against cuda.h of CUDA_VERSION " << CUDA_VERSION << " ("
              << TANDEM_CUDA_HEADER_DIR << "): " << kCalls << " driver calls (" << kCallNames[0]
              << " ... " << kCallNames[kCalls - 1] << "), " << std::size(kValueNames)
              << " constants, " << std::size(kTypeNames)
              << " types (with CUipcMemHandle's layout), checked at compile time\n";
    if (!unchecked.empty()) {
        std::cout << "hmem/cuda_abi.h declares what tests/unit/test_cuda_abi.cpp does not check:";
        for (const auto &name : unchecked) std::cout << " " << name;
        std::cout << "\n";
        return 1;
    }
    return 0;
}

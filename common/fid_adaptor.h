// The one place where tandem's C++ objects meet libfabric's C fids.
//
// An object that libfabric sees as a fid derives from FidObject<Self, FidT>; its fid lives
// in a slot next to a pointer back to the object, so a fid handed in by libfabric maps back
// to its object without casts scattered through the code. Ops tables are filled with
// Trampoline<&Self::method>::call: the generated function has exactly the C signature of
// the table entry (checked by the compiler), catches every exception and returns it as a
// negative fabric errno.
#pragma once

#include "fabric_error.h"

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>

#include <cstring>
#include <type_traits>

namespace tandem {

template <class FidT>
struct FidSlot {
    FidT fid;  // first member: a pointer to fid (or to its embedded struct fid) is a slot pointer
    void *self;
};

template <class Self, class FidT>
class FidObject {
  public:
    FidObject() {
        slot_.fid = {};
        // The base pointer: Self is not constructed yet, so the downcast waits until of().
        slot_.self = this;
    }
    FidObject(const FidObject &) = delete;
    FidObject &operator=(const FidObject &) = delete;

    FidT *fid() noexcept { return &slot_.fid; }
    struct fid *base_fid() noexcept {
        return reinterpret_cast<struct fid *>(&slot_.fid);
    }

    // Any pointer to this object's fid (typed or as struct fid *) back to the object.
    static Self *of(const void *fid) noexcept {
        auto *base = static_cast<FidObject *>(static_cast<const FidSlot<FidT> *>(fid)->self);
        return static_cast<Self *>(base);
    }

    // Initialises the embedded struct fid; fclass and ops are the object's, context the user's.
    void init_fid(size_t fclass, void *context, fi_ops *ops) noexcept {
        base_fid()->fclass = fclass;
        base_fid()->context = context;
        base_fid()->ops = ops;
    }

  private:
    FidSlot<FidT> slot_;
};

// The integer behind an enum field an application filled in, read without assuming it holds
// one of the enumerators (a bad value is input to reject, not undefined behaviour).
template <class E>
inline int raw_enum(const E &field) noexcept {
    static_assert(sizeof(E) == sizeof(int));
    int value;
    std::memcpy(&value, &field, sizeof value);
    return value;
}

template <class R>
inline R error_return(int negative_errno) noexcept {
    if constexpr (std::is_pointer_v<R>) {
        return nullptr;  // calls that return a string (strerror, straddr) fail with NULL
    } else {
        return static_cast<R>(negative_errno);
    }
}

template <auto Method>
struct Trampoline;

template <class Obj, class R, class... A, R (Obj::*M)(A...)>
struct Trampoline<M> {
    template <class FidT>
    static R call(FidT *fid, A... args) noexcept {
        try {
            return (Obj::of(fid)->*M)(args...);
        } catch (...) {
            return error_return<R>(current_exception_errno());
        }
    }
};

// For ops-table entries tandem does not implement: returns -FI_ENOSYS with the entry's type.
template <class FnPtr>
struct NotSupported;

template <class R, class... A>
struct NotSupported<R (*)(A...)> {
    static R call(A...) noexcept { return error_return<R>(-FI_ENOSYS); }
};

template <class FnPtr>
inline constexpr FnPtr enosys = &NotSupported<FnPtr>::call;

// The fi_ops of an object: close, and whichever of bind / control / ops_open it implements;
// every other entry -FI_ENOSYS.
inline constexpr fi_ops fid_ops(
    decltype(fi_ops::close) close, decltype(fi_ops::bind) bind = enosys<decltype(fi_ops::bind)>,
    decltype(fi_ops::control) control = enosys<decltype(fi_ops::control)>,
    decltype(fi_ops::ops_open) ops_open = enosys<decltype(fi_ops::ops_open)>) {
    return {sizeof(fi_ops),
            close,
            bind,
            control,
            ops_open,
            enosys<decltype(fi_ops::tostr)>,
            enosys<decltype(fi_ops::ops_set)>};
}

// An fi_ops_ep table: the calls given, -FI_ENOSYS for the others (tx_ctx and rx_ctx always:
// tandem has no scalable endpoints).
inline constexpr fi_ops_ep fid_ep_ops(
    decltype(fi_ops_ep::cancel) cancel = enosys<decltype(fi_ops_ep::cancel)>,
    decltype(fi_ops_ep::getopt) getopt = enosys<decltype(fi_ops_ep::getopt)>,
    decltype(fi_ops_ep::setopt) setopt = enosys<decltype(fi_ops_ep::setopt)>,
    decltype(fi_ops_ep::rx_size_left) rx_size_left = enosys<decltype(fi_ops_ep::rx_size_left)>,
    decltype(fi_ops_ep::tx_size_left) tx_size_left = enosys<decltype(fi_ops_ep::tx_size_left)>) {
    return {sizeof(fi_ops_ep),
            cancel,
            getopt,
            setopt,
            enosys<decltype(fi_ops_ep::tx_ctx)>,
            enosys<decltype(fi_ops_ep::rx_ctx)>,
            rx_size_left,
            tx_size_left};
}

}  // namespace tandem

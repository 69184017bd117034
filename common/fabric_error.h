// Errors inside tandem are C++ exceptions carrying a fabric errno; they are turned back
// into negative return values at the libfabric ABI boundary (fid_adaptor.h) and nowhere else.
#pragma once

#include <rdma/fi_errno.h>

#include <exception>
#include <new>
#include <string>

namespace tandem {

class FabricError : public std::exception {
  public:
    // code is a positive FI_E* / errno value, as in fi_errno(3).
    FabricError(int code, std::string what) : code_(code), what_(std::move(what)) {}
    int code() const noexcept { return code_; }
    const char *what() const noexcept override { return what_.c_str(); }

  private:
    int code_;
    std::string what_;
};

[[noreturn]] inline void fail(int code, std::string what) {
    throw FabricError(code, std::move(what));
}

inline void require(bool ok, int code, const char *what) {
    if (!ok) fail(code, what);
}

// Called in a catch(...) block: the negative fabric errno of the exception in flight.
int current_exception_errno() noexcept;

}  // namespace tandem

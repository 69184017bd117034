// What copying costs on this machine: memcpy, and cross-memory attach (process_vm_readv),
// measured once per process, when its first node-local endpoint is enabled (off_tandem's
// Endpoint::enable): at set-up, not in the first large message, whose sender would otherwise
// stall for the measurement inside the caller's timed loop (fi_pingpong -S 64k -I 300 read
// 150-170 us a transfer instead of 20 on the virtual machines of our CI, where first touches
// of memory are slow and the measurement took 40 ms a process).
// The node-local path chooses between staging a message through the rings (two memcpy, by
// the sender into cells and by the receiver out of them) and single copy by CMA (one kernel
// copy, split between both processes from kLocalSplitMin) from these figures, not from a
// size fixed in advance: CMA pins every page it copies, and how that compares with memcpy
// differs tenfold between machines (bare metal, virtual machines, kernels).
#pragma once

#include <cstddef>

namespace tandem {

class CopyCosts {
  public:
    // Nanoseconds to copy n bytes, interpolated between the sizes measured (and extended
    // linearly past the largest).
    double memcpy_ns(size_t n) const { return at(memcpy_, n); }
    double cma_ns(size_t n) const { return at(cma_, n); }
    // Whether CMA could be measured here (false: it is refused in this process).
    bool cma_measured() const { return cma_ok_; }

    // The figures of this process, measured at the first call (a few milliseconds).
    static const CopyCosts &get();
    // How long the measurement took (for the log line of the endpoint that made it).
    double measuring_ns() const { return measuring_ns_; }
    // Measures now (tests; get() keeps the first measurement).
    static CopyCosts measure();

    // Up to 1 MiB: the choice is between staging and single copy, and a ring of the default
    // 256 cells stages 1 MiB at most (larger messages go by CMA whatever the figures say).
    // Past it the figures grow in proportion.
    static constexpr size_t kSizes[] = {16u << 10, 64u << 10, 256u << 10, 1u << 20};
    static constexpr size_t kPoints = sizeof kSizes / sizeof kSizes[0];

  private:
    static double at(const double (&ns)[kPoints], size_t n);
    double memcpy_[kPoints] = {};
    double cma_[kPoints] = {};
    bool cma_ok_ = false;
    double measuring_ns_ = 0;
};

}  // namespace tandem

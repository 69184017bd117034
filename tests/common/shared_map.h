// An anonymous MAP_SHARED mapping of one T, zeroed and constructed in place: made by a test's
// process before it forks the processes that share it (the roles of tests/common/
// atomic_processes.h, the ranks of the collective tests), unmapped when it goes out of scope.
#pragma once

#include <sys/mman.h>

#include <cstring>
#include <new>

namespace tandem_test {

template <typename T>
class SharedMap {
  public:
    SharedMap() {
        void *p =
            mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
            std::memset(p, 0, sizeof(T));
            t_ = new (p) T;
        }
    }
    ~SharedMap() {
        if (t_) munmap(t_, sizeof(T));
    }
    SharedMap(const SharedMap &) = delete;
    SharedMap &operator=(const SharedMap &) = delete;
    T *get() const { return t_; }  // null when the mapping failed
    T *operator->() const { return t_; }

  private:
    T *t_ = nullptr;
};

}  // namespace tandem_test

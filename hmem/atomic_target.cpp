#include "hmem/atomic_target.h"

#include "common/iov.h"
#include "common/wire.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <cstring>
#include <sched.h>

#include <atomic>

namespace tandem::atomic {

namespace {

// The gate of every execution in this process (see the header). A leaf lock: taken with a
// domain lock held, and nothing under it takes another. A spin lock: it is held for one
// operation on at most 2 KiB (or its device copies), contended only by threads of this
// process progressing other domains, and a mutex's calls were a fifth of a node-local
// atomic's work at the target.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

class Gate {
  public:
    void lock() noexcept {
        for (unsigned spins = 0; held_.exchange(true, std::memory_order_acquire); ++spins) {
            while (held_.load(std::memory_order_relaxed)) {
                if (++spins % 128 == 0) sched_yield();  // the holder may be descheduled
                cpu_relax();
            }
        }
    }
    void unlock() noexcept { held_.store(false, std::memory_order_release); }

  private:
    std::atomic<bool> held_{false};
};
Gate g_gate;

struct GateGuard {
    GateGuard() noexcept { g_gate.lock(); }
    ~GateGuard() { g_gate.unlock(); }
    GateGuard(const GateGuard &) = delete;
    GateGuard &operator=(const GateGuard &) = delete;
};

bool kind_ok(uint8_t kind) {
    return kind <= static_cast<uint8_t>(wire::AtomicKind::Compare);
}

}  // namespace

int check_call(Kind kind, const fi_msg_atomic &m, const fi_ioc *compare, size_t ncompare,
               const fi_ioc *result, size_t nresult, size_t max_iov, size_t *count) noexcept {
    const bool fetches = kind != Kind::Base;
    const bool compares = kind == Kind::Compare;
    if ((m.iov_count && !m.msg_iov) || m.iov_count > max_iov) return -FI_EINVAL;
    if (m.rma_iov_count != 1 || !m.rma_iov) return -FI_EINVAL;  // rma_iov_limit is 1
    if (fetches && (!result || !nresult || nresult > max_iov)) return -FI_EINVAL;
    if (compares && (!compare || !ncompare || ncompare > max_iov)) return -FI_EINVAL;
    size_t limit = 0;
    if (int ret = query(kind, m.datatype, m.op, &limit)) return ret;
    const size_t n = element_count(m.msg_iov, m.iov_count);
    if (n == 0 || m.rma_iov[0].count != n) return -FI_EINVAL;
    if (fetches && element_count(result, nresult) != n) return -FI_EINVAL;
    if (compares && element_count(compare, ncompare) != n) return -FI_EINVAL;
    if (n > limit) return -FI_EMSGSIZE;  // fi_atomic(3): more elements than *valid said
    *count = n;
    return 0;
}

int build_request(Kind kind, int op, int datatype, size_t count, uint64_t addr, uint64_t key,
                  const iovec *operand, const hmem::MemRef *operand_mem, size_t noperand,
                  const iovec *compare, const hmem::MemRef *compare_mem, size_t ncompare,
                  uint8_t *out) {
    const size_t bytes = count * datatype_size(datatype);
    wire::AtomicBody body{};
    body.op = static_cast<uint8_t>(op);
    body.datatype = static_cast<uint8_t>(datatype);
    body.kind = static_cast<uint8_t>(kind);
    body.count = static_cast<uint32_t>(count);
    body.addr = addr;
    body.key = key;
    memcpy(out, &body, sizeof body);
    uint8_t *at = out + sizeof body;
    auto take = [&](const iovec *iov, const hmem::MemRef *mem, size_t n) -> int {
        if (hmem::all_host(mem, n)) {
            iov_gather(at, iov, n, 0, bytes);
        } else {
            ssize_t got = hmem::gather(at, iov, mem, n, 0, bytes);
            if (got < 0) return static_cast<int>(got);
        }
        at += bytes;
        return 0;
    };
    if (has_operand(op))
        if (int ret = take(operand, operand_mem, noperand)) return ret;
    if (kind == Kind::Compare)
        if (int ret = take(compare, compare_mem, ncompare)) return ret;
    return 0;
}

bool parse(const void *data, size_t len, Request &out) noexcept {
    wire::AtomicBody body;
    if (!data || len < sizeof body) return false;
    memcpy(&body, data, sizeof body);
    if (!kind_ok(body.kind)) return false;
    Kind kind = static_cast<Kind>(body.kind);
    if (!valid(kind, body.op, body.datatype)) return false;
    if (body.count == 0 || body.count > max_count(body.datatype)) return false;
    if (len != request_size(kind, body.op, body.datatype, body.count)) return false;
    out.op = body.op;
    out.datatype = body.datatype;
    out.kind = kind;
    out.count = body.count;
    out.elem = datatype_size(body.datatype);
    out.addr = body.addr;
    out.key = body.key;
    const uint8_t *at = static_cast<const uint8_t *>(data) + sizeof body;
    out.operand = nullptr;
    out.compare = nullptr;
    if (has_operand(body.op)) {
        out.operand = at;
        at += out.bytes();
    }
    if (kind == Kind::Compare) out.compare = at;
    return true;
}

uint64_t access_needed(Kind kind, int op) noexcept {
    if (kind == Kind::Base) return FI_REMOTE_WRITE;
    if (op == FI_ATOMIC_READ) return FI_REMOTE_READ;
    return FI_REMOTE_READ | FI_REMOTE_WRITE;
}

uint64_t access_event(Kind kind) noexcept {
    return kind == Kind::Base ? FI_REMOTE_WRITE : FI_REMOTE_READ;
}

int execute(const Request &r, const iovec *pieces, const hmem::MemRef *mem, size_t npieces,
            void *fetched) noexcept {
    if (npieces == 0 || iov_length(pieces, npieces) < r.bytes()) return FI_EACCES;
    // Natural alignment of the target: what a CPU or NIC atomic needs, and what an application
    // on any other provider would have to give.
    if (reinterpret_cast<uintptr_t>(pieces[0].iov_base) % datatype_align(r.datatype))
        return FI_EINVAL;
    void *result = r.kind == Kind::Base ? nullptr : fetched;
    GateGuard gate;
    if (npieces == 1 && hmem::all_host(mem, 1)) {
        int ret =
            apply(r.op, r.datatype, pieces[0].iov_base, r.operand, r.compare, result, r.count);
        return ret ? FI_EINVAL : 0;
    }
    // Device memory, or a target across the pieces of a region registered from several
    // buffers: updated in a host copy, under the gate as well.
    uint8_t scratch[kMaxBytes];
    if (r.bytes() > sizeof scratch) return FI_EINVAL;
    if (hmem::gather(scratch, pieces, mem, npieces, 0, r.bytes()) != ssize_t(r.bytes()))
        return FI_EIO;
    if (apply(r.op, r.datatype, scratch, r.operand, r.compare, result, r.count)) return FI_EINVAL;
    if (hmem::scatter(pieces, mem, npieces, 0, scratch, r.bytes()) != ssize_t(r.bytes()))
        return FI_EIO;
    return 0;
}

}  // namespace tandem::atomic

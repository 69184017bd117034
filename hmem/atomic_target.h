// Atomic operations as both providers carry them: the request an initiator builds (the wire
// format is wire::AtomicBody, common/wire.h) and its execution at the target, on host or
// device memory. The arithmetic is the reduction engine's (atomic.h, reduce_ops.h); this file
// adds what a remote request needs around it: validation of what arrived, the access it
// needs, device copies, and atomicity.
//
// Atomicity: every execution in a process takes one gate (a spin lock, the innermost lock of
// tandem: nothing is called under it but the engine and device copies). Operations arriving
// over any link, over the node-local path, from any number of peers and through any domain
// of the process are therefore atomic with respect to each other, for every datatype,
// including those no CPU instruction covers (long double complex, 128-bit integers) and
// regions in device memory, which are copied to the host, updated and copied back under it.
// fi_atomic(3) asks no more: another actor (the application's own CPU atomics, a GPU kernel)
// writing the region at the same time is undefined there.
#pragma once

#include "common/wire.h"
#include "hmem/atomic.h"
#include "hmem/hmem.h"

#include <rdma/fi_atomic.h>
#include <rdma/fi_errno.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace tandem::atomic {

// A request as it arrived, checked against itself: op and datatype valid for its kind, a
// count within the limit, and exactly the operand bytes that count implies.
struct Request {
    int op = 0;
    int datatype = 0;
    Kind kind = Kind::Base;
    size_t count = 0;
    size_t elem = 0;  // bytes of one element
    uint64_t addr = 0;
    uint64_t key = 0;
    const uint8_t *operand = nullptr;  // count elements, or nullptr (FI_ATOMIC_READ)
    const uint8_t *compare = nullptr;  // count elements (compare kind), else nullptr
    size_t bytes() const { return count * elem; }
};

// What fi_query_atomic and the *valid calls answer for one kind of call: 0 with the element
// limit in *count, -FI_EOPNOTSUPP for an operation the kind does not define on the datatype,
// -FI_EINVAL for a value that is no operation or datatype (or a null count).
inline int query(Kind kind, int datatype, int op, size_t *count) noexcept {
    if (!count) return -FI_EINVAL;
    if (!known_datatype(datatype) || op < 0 || op >= kOps) return -FI_EINVAL;
    if (!valid(kind, op, datatype)) return -FI_EOPNOTSUPP;
    *count = max_count(datatype);
    return 0;
}

// Elements in an fi_ioc list, and the list as byte ranges (each count times elem).
inline size_t element_count(const fi_ioc *ioc, size_t n) noexcept {
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) total += ioc[i].count;
    return total;
}
inline void byte_ranges(const fi_ioc *ioc, size_t n, size_t elem, iovec *out) noexcept {
    for (size_t i = 0; i < n; ++i) out[i] = {ioc[i].addr, ioc[i].count * elem};
}

// The shape of an atomic call as fi_atomic(3) asks it, for both providers: lists that have
// entries (at most max_iov each), one remote piece covering the operands' element count,
// result (fetch, compare) and compare (compare) lists of that count, an op the kind defines
// on the datatype, and no more elements than the *valid calls report. 0 with the element
// count in *count; -FI_EINVAL, -FI_EOPNOTSUPP or -FI_EMSGSIZE (too many elements).
int check_call(Kind kind, const fi_msg_atomic &m, const fi_ioc *compare, size_t ncompare,
               const fi_ioc *result, size_t nresult, size_t max_iov, size_t *count) noexcept;

// Whether calls of `kind` with this op carry operand elements (all but FI_ATOMIC_READ).
inline bool has_operand(int op) noexcept {
    return op != FI_ATOMIC_READ;
}

// Bytes of a request body: the AtomicBody and its operands.
inline size_t request_size(Kind kind, int op, int datatype, size_t count) noexcept {
    const size_t bytes = count * datatype_size(datatype);
    return sizeof(wire::AtomicBody) + (has_operand(op) ? bytes : 0) +
           (kind == Kind::Compare ? bytes : 0);
}

// Builds a request body at out (request_size bytes): the header, then the operand and compare
// elements gathered from the caller's lists (entry i of a list lives in mem[i]; a null mem is
// host memory). 0, or a negative fabric errno when a device copy failed.
int build_request(Kind kind, int op, int datatype, size_t count, uint64_t addr, uint64_t key,
                  const iovec *operand, const hmem::MemRef *operand_mem, size_t noperand,
                  const iovec *compare, const hmem::MemRef *compare_mem, size_t ncompare,
                  uint8_t *out);

// Parses a request body of len bytes (unaligned is fine). False when it is malformed.
bool parse(const void *body, size_t len, Request &out) noexcept;

// The remote access the target region must allow: FI_REMOTE_WRITE for the base kind,
// FI_REMOTE_READ for FI_ATOMIC_READ, both for the other fetch and compare operations.
uint64_t access_needed(Kind kind, int op) noexcept;

// The access an operation counts as at the target (FI_RMA_EVENT counters, and the flags of a
// remote CQ data completion): FI_REMOTE_WRITE for the base kind, FI_REMOTE_READ for the fetch
// and compare kinds, as they return data to the initiator.
uint64_t access_event(Kind kind) noexcept;

// Executes a request at the target on the memory its key resolved to (pieces, each in mem[i];
// mem may be null: all host), atomically with respect to every other execute() in the
// process. For the fetch and compare kinds, fetched receives the previous values (bytes()).
// 0, or a positive FI_* error: FI_EINVAL for a target element that is not naturally aligned,
// FI_EIO when device memory could not be copied.
int execute(const Request &r, const iovec *pieces, const hmem::MemRef *mem, size_t npieces,
            void *fetched) noexcept;

}  // namespace tandem::atomic

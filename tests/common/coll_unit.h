// What the unit tests of off_tandem's collective code share (tests/unit/test_coll_schedule.cpp:
// the algorithms over a fake transport; tests/unit/test_coll_shm.cpp: the node-local
// collectives): a call's Args (offload_prov/coll/schedule.h) and its label, and every rank's
// buffers of a call, with guard bytes on both sides, their expected results and their check
// after the call. The provider's Args only describes the call: the expected results come from
// tests/common/coll_reference.h.
#pragma once

#include "offload_prov/coll/schedule.h"
#include "tests/common/atomic_reference.h"
#include "tests/common/coll_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace tandem_test::coll_unit {

using tandem::off::coll::Args;

// One call: elements of datatype (none for a barrier), op for the reducing collectives only.
inline Args args_of(fi_collective_op c, size_t count, int datatype, int op = FI_SUM,
                    uint32_t root = 0) {
    Args a;
    a.coll = c;
    a.root = root;
    if (c == FI_BARRIER) return a;
    a.count = count;
    a.elem = atomic_ref::element_size(datatype);
    a.datatype = datatype;
    a.op = coll_ref::reduces(c) ? op : FI_NOOP;
    return a;
}

// "<name> n=<n> [root=<root>] [count=<count> <datatype>] [<op>]", for failure messages.
inline std::string label_of(const std::string &name, uint32_t n, const Args &a) {
    std::ostringstream o;
    o << name << " n=" << n;
    if (coll_ref::rooted(a.coll)) o << " root=" << a.root;
    if (a.coll != FI_BARRIER)
        o << " count=" << a.count << " " << atomic_ref::datatype_name(a.datatype);
    if (coll_ref::reduces(a.coll)) o << " " << atomic_ref::op_name(a.op);
    return o.str();
}

// Bytes with guard bytes on both sides.
class GuardedBuffer {
  public:
    GuardedBuffer() : GuardedBuffer(0) {}
    explicit GuardedBuffer(size_t len) : bytes_(len + 2 * kGuard, kGuardByte), len_(len) {}
    uint8_t *data() { return bytes_.data() + kGuard; }
    const uint8_t *data() const { return bytes_.data() + kGuard; }
    size_t size() const { return len_; }
    bool guards_intact() const {
        for (size_t i = 0; i < kGuard; ++i)
            if (bytes_[i] != kGuardByte || bytes_[kGuard + len_ + i] != kGuardByte) return false;
        return true;
    }

  private:
    static constexpr size_t kGuard = 64;
    static constexpr uint8_t kGuardByte = 0xa5;
    std::vector<uint8_t> bytes_;
    size_t len_;
};

// One rank's buffers of a call, sized as fi_collective(3) says (contents: the guard byte).
struct RankBuffers {
    coll_ref::Io io;
    GuardedBuffer send, recv;
    std::vector<uint8_t> input;   // what the call reads (send, a broadcast root's recv), before
    std::vector<uint8_t> expect;  // the result expected in recv
    bool expected = false;        // expect is set
};

inline RankBuffers buffers_for(const Args &a, uint32_t n, uint32_t r) {
    RankBuffers d;
    d.io = coll_ref::io_of(a.coll, a.bytes(), n, r == a.root);
    d.send = GuardedBuffer(d.io.send_bytes);
    d.recv = GuardedBuffer(d.io.recv_bytes);
    return d;
}

inline const GuardedBuffer &input_buffer(const Args &a, uint32_t r, const RankBuffers &d) {
    return coll_ref::input_in_recv(a.coll, r == a.root) ? d.recv : d.send;
}

// Records every rank's input as it is now: the call must leave it alone. (Ranks: RankBuffers,
// or a type derived from it.)
template <class Rank>
void record_inputs(const Args &a, std::vector<Rank> &ranks) {
    for (uint32_t r = 0; r < ranks.size(); ++r) {
        const GuardedBuffer &in = input_buffer(a, r, ranks[r]);
        ranks[r].input.assign(in.data(), in.data() + in.size());
    }
}

// The same, and every rank's expected result from those inputs.
template <class Rank>
void expect_results(const Args &a, std::vector<Rank> &ranks) {
    record_inputs(a, ranks);
    std::vector<const uint8_t *> in;
    for (const Rank &d : ranks) in.push_back(d.input.data());
    for (uint32_t r = 0; r < ranks.size(); ++r) {
        ranks[r].expect = coll_ref::result_of(a.coll, a.datatype, a.op, a.count, a.root, r, in);
        ranks[r].expected = true;
    }
}

// After the call: nothing written outside the buffers, the inputs untouched, the results (where
// expected) the reference's. Failures are reported; true when all is well.
template <class Rank>
bool check_buffers(const std::string &label, const Args &a, const std::vector<Rank> &ranks) {
    bool ok = true;
    const size_t elem = std::max<size_t>(a.elem, 1);
    const size_t block = std::max<size_t>(a.bytes(), 1);
    for (uint32_t r = 0; r < ranks.size(); ++r) {
        const Rank &d = ranks[r];
        if (!d.send.guards_intact() || !d.recv.guards_intact()) {
            ADD_FAILURE() << label << " rank " << r << ": written outside its buffers";
            ok = false;
        }
        const GuardedBuffer &in = input_buffer(a, r, d);
        if (in.size() &&
            (d.input.size() != in.size() || std::memcmp(in.data(), d.input.data(), in.size()))) {
            ADD_FAILURE() << label << " rank " << r << ": the input was changed";
            ok = false;
        }
        if (!d.expected || !d.io.recv || coll_ref::input_in_recv(a.coll, r == a.root)) continue;
        if (d.expect.size() != d.recv.size()) {
            ADD_FAILURE() << label << " rank " << r << ": reference of " << d.expect.size()
                          << " bytes for a buffer of " << d.recv.size();
            ok = false;
            continue;
        }
        const std::string bad =
            coll_ref::mismatch(d.expect.data(), d.recv.data(), d.recv.size(), elem, block);
        if (!bad.empty()) {
            ADD_FAILURE() << label << " rank " << r << ": " << bad;
            ok = false;
        }
    }
    return ok;
}

}  // namespace tandem_test::coll_unit

// fi_atomic(3) over FI_EP_RDM between two endpoints of one process: every (kind, operation,
// datatype) triple against the host model of tests/common/atomic_reference.h, fi_query_atomic,
// the failures (keys, bounds, access, pairs, counts, alignment), fi_inject_atomic, remote CQ
// data, counters and ordering. api.atomic.* runs it node-local (off_tandem), api_net.atomic.*
// over the TCP link (FI_TANDEM_LOCAL=0), api_domain.atomic.* under FI_THREAD_DOMAIN.
#include "fabric_fixture.h"

#include "../common/atomic_reference.h"

#include <rdma/fi_atomic.h>

namespace tandem_test {
namespace {

using namespace atomic_ref;

constexpr int kAllModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
constexpr uint64_t kAtomicCaps = FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

int valid_call(Kind k, fid_ep *ep, int dt, int op, size_t *count) {
    const auto d = static_cast<fi_datatype>(dt);
    const auto o = static_cast<fi_op>(op);
    switch (k) {
        case Kind::Base:
            return fi_atomicvalid(ep, d, o, count);
        case Kind::Fetch:
            return fi_fetch_atomicvalid(ep, d, o, count);
        case Kind::Compare:
            return fi_compare_atomicvalid(ep, d, o, count);
    }
    return -FI_ENOSYS;
}

uint64_t query_flags(Kind k) {
    return k == Kind::Fetch ? FI_FETCH_ATOMIC : k == Kind::Compare ? FI_COMPARE_ATOMIC : 0;
}

std::string hex_flags(uint64_t f) {
    char b[24];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(f));
    return b;
}

// The flags of an initiator's completion that say what it was.
constexpr uint64_t kWhatFlags = FI_ATOMIC | FI_RMA | FI_MSG | FI_TAGGED | FI_READ | FI_WRITE |
                                FI_SEND | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE;
uint64_t initiator_flags(Kind k) {
    return FI_ATOMIC | (k == Kind::Base ? FI_WRITE : FI_READ);
}

struct AtomicOp : Call {
    std::string str() const {
        return std::string(kind_name(kind)) + " (" + form_name(form) + ") " + op_name(op) + " " +
               datatype_name(dt) + " x" + std::to_string(count);
    }
};

struct Outcome {
    ssize_t post_ret = 0;
    std::optional<Completion> comp;
    std::optional<CqError> err;
    bool ok() const { return post_ret == 0 && comp && !err; }
    std::string str() const {
        if (post_ret) return "post returned " + fi_err_str(post_ret);
        if (err) return "error completion: " + describe(*err);
        if (comp) return "completed successfully";
        return "no completion within the deadline";
    }
};

class AtomicFixture : public FabricTest {
  protected:
    virtual int mode() const { return kAllModes; }
    void configure(FabricOptions &o) override {
        o.caps |= kAtomicCaps;
        o.mr_mode = mode();
    }

    // An operation (fi_atomic FI_SUM of kCount FI_UINT64 in the short form unless changed) from
    // `local` to `target` at `target_off`: the operand at local's start, the compare values at
    // `compare_off`, the results at `result_off`, all with local's descriptor.
    static AtomicOp atomic_op(const DataBuf &local, const DataBuf &target, size_t target_off = 0,
                              size_t compare_off = 1024, size_t result_off = 2048) {
        return atomic_op(local, rma_addr(target, target_off), target.key, compare_off, result_off);
    }
    // The same on the target address `addr` with `key`.
    static AtomicOp atomic_op(const DataBuf &local, uint64_t addr, uint64_t key,
                              size_t compare_off = 1024, size_t result_off = 2048) {
        AtomicOp o;
        o.operand = local.data();
        o.compare = local.data() + compare_off;
        o.result = local.data() + result_off;
        o.odesc = o.cdesc = o.rdesc = local.desc;
        o.addr = addr;
        o.key = key;
        return o;
    }

    ssize_t issue(const AtomicOp &o, void *c) { return issue_call(a().ep, a().peer[1], o, c); }

    // Posts (retrying -FI_EAGAIN) and waits for the operation's completion.
    Outcome run(const AtomicOp &o, void *c) {
        Outcome r;
        r.post_ret = post([&] { return issue(o, c); });
        if (r.post_ret) return r;
        poll_until([&] { return a().log.has(c) || a().log.has_err(c); });
        r.comp = a().log.find(c);
        r.err = a().log.find_err(c);
        return r;
    }

    // Posting must fail at once with `want`, and nothing may complete afterwards.
    void expect_refused_at_post(const AtomicOp &o, ssize_t want, void *c) {
        ssize_t ret = post([&] { return issue(o, c); });
        EXPECT_EQ(ret, want) << o.str() << " -> " << fi_err_str(ret) << ", expected "
                             << fi_err_str(want);
        poll_for(Ms(20));
        EXPECT_FALSE(a().log.has(c) || a().log.has_err(c))
            << o.str() << ": a refused post completed: " << a().log.summary();
    }

    // A registered region of `len` bytes in the middle of three times that, the rest guard
    // bytes; `base` is how a peer names its first byte.
    struct GuardedRegion {
        std::unique_ptr<DataBuf> mem;
        Fid<fid_mr> mr;
        uint64_t key = 0, base = 0;
        uint8_t *region() const { return mem->data() + mem->size() / 3; }
    };
    void guarded_region(GuardedRegion &g, size_t len, uint8_t fill, uint64_t access) {
        g.mem = std::make_unique<DataBuf>(3 * len, fill);
        ASSERT_FI_OK(
            fi_mr_reg(domain, g.region(), len, access, 0, next_key_++, 0, g.mr.out(), nullptr));
        g.key = fi_mr_key(g.mr);
        g.base = virt_addr() ? reinterpret_cast<uintptr_t>(g.region()) : 0;
    }
};

class AtomicTest : public AtomicFixture, public ::testing::WithParamInterface<int> {
  protected:
    int mode() const override { return GetParam(); }
};

// ---- the valid calls ------------------------------------------------------------------------

TEST_P(AtomicTest, ValidCallsMatchTheTable) {
    std::vector<std::string> wrong;
    for (Kind k : kKinds) {
        for (int op = 0; op < kNumOps; ++op) {
            for (int dt = 0; dt < kNumDatatypes; ++dt) {
                size_t count = 12345;
                const int ret = valid_call(k, a().ep, dt, op, &count);
                const int want = expected_valid_ret(k, op, dt);
                const std::string what = std::string(kind_name(k)) + "valid(" + datatype_name(dt) +
                                         ", " + op_name(op) + ")";
                if (ret != want)
                    wrong.push_back(what + " -> " + fi_err_str(ret) + ", expected " +
                                    fi_err_str(want));
                else if (want == 0 && count != expected_count(dt))
                    wrong.push_back(what + " count " + std::to_string(count) + ", expected " +
                                    std::to_string(expected_count(dt)));
            }
        }
    }
    std::string list;
    for (size_t i = 0; i < wrong.size() && i < 40; ++i) list += "\n  " + wrong[i];
    EXPECT_TRUE(wrong.empty()) << wrong.size() << " of " << 3 * kNumOps * kNumDatatypes
                               << " pairs differ from the table:" << list;
}

TEST_P(AtomicTest, ValidCallsRefuseOutOfRangeValues) {
    const int bad_dts[] = {FI_UINT128 + 1, FI_VOID, 300};
    const int bad_ops[] = {FI_MSWAP + 1, FI_NOOP, 300};
    for (Kind k : kKinds) {
        for (int dt : bad_dts) {
            size_t count = 0;
            EXPECT_EQ(valid_call(k, a().ep, dt, FI_ATOMIC_WRITE, &count), -FI_EINVAL)
                << kind_name(k) << "valid with datatype " << dt;
        }
        for (int op : bad_ops) {
            size_t count = 0;
            EXPECT_EQ(valid_call(k, a().ep, FI_UINT64, op, &count), -FI_EINVAL)
                << kind_name(k) << "valid with op " << op;
        }
    }
}

TEST_P(AtomicTest, QueryAtomicAgreesWithTheValidCalls) {
    std::vector<std::string> wrong;
    for (Kind k : kKinds) {
        for (int op = 0; op < kNumOps; ++op) {
            for (int dt = 0; dt < kNumDatatypes; ++dt) {
                size_t count = 777;
                const int vret = valid_call(k, a().ep, dt, op, &count);
                fi_atomic_attr attr{999, 999};
                const int qret = fi_query_atomic(domain, static_cast<fi_datatype>(dt),
                                                 static_cast<fi_op>(op), &attr, query_flags(k));
                const std::string what = std::string("fi_query_atomic(") + datatype_name(dt) +
                                         ", " + op_name(op) + ", " + kind_name(k) + ")";
                if (qret != vret)
                    wrong.push_back(what + " -> " + fi_err_str(qret) + ", the valid call " +
                                    fi_err_str(vret));
                else if (qret == 0 && attr.count != count)
                    wrong.push_back(what + " count " + std::to_string(attr.count) +
                                    ", the valid call " + std::to_string(count));
                else if (qret == 0 && attr.size != element_size(dt))
                    wrong.push_back(what + " size " + std::to_string(attr.size) + ", expected " +
                                    std::to_string(element_size(dt)));
            }
        }
    }
    std::string list;
    for (size_t i = 0; i < wrong.size() && i < 40; ++i) list += "\n  " + wrong[i];
    EXPECT_TRUE(wrong.empty()) << wrong.size() << " disagreements:" << list;
    fi_atomic_attr attr{};
    EXPECT_EQ(
        fi_query_atomic(domain, FI_UINT64, FI_CSWAP, &attr, FI_FETCH_ATOMIC | FI_COMPARE_ATOMIC),
        -FI_EINVAL);
    EXPECT_EQ(fi_query_atomic(domain, static_cast<fi_datatype>(FI_UINT128 + 1), FI_SUM, &attr, 0),
              -FI_EINVAL);
    EXPECT_EQ(fi_query_atomic(domain, FI_UINT64, static_cast<fi_op>(FI_MSWAP + 1), &attr, 0),
              -FI_EINVAL);
}

// ---- every operation against the host model ---------------------------------------------------

TEST_P(AtomicTest, EveryOpAndDatatypeMatchesAHostReference) {
    constexpr size_t kTargetOff = 256, kTargetLen = 4096;
    constexpr size_t kCompareOff = 1024, kResultOff = 2048;
    auto target = buf(kTargetLen, 0xEE, true);
    auto local = buf(4096);
    uint8_t *operand = local->data(), *compare = local->data() + kCompareOff,
            *result = local->data() + kResultOff;
    std::vector<std::string> wrong;
    size_t runs = 0, form = 0;
    for (Kind k : kKinds) {
        for (int op = 0; op < kNumOps; ++op) {
            for (int dt = 0; dt < kNumDatatypes; ++dt) {
                // The valid call first: it must agree with the table.
                size_t count = 12345;
                const int vret = valid_call(k, a().ep, dt, op, &count);
                if (vret != expected_valid_ret(k, op, dt) ||
                    (vret == 0 && count != expected_count(dt)))
                    wrong.push_back(std::string(kind_name(k)) + "valid(" + datatype_name(dt) +
                                    ", " + op_name(op) + ") -> " + fi_err_str(vret) + ", count " +
                                    std::to_string(count) + "; the table says " +
                                    fi_err_str(expected_valid_ret(k, op, dt)));
                if (!valid(k, op, dt)) continue;
                const size_t s = element_size(dt), len = s * kCount;
                for (const Case &cs : cases(dt)) {
                    if (!case_applies(dt, op, cs)) continue;
                    std::memset(target->data(), 0xEE, kTargetLen);
                    std::memcpy(target->data() + kTargetOff, cs.target.data(), len);
                    std::memcpy(operand, cs.operand.data(), len);
                    std::memcpy(compare, cs.compare.data(), len);
                    std::memset(result, 0xCD, 1024);
                    AtomicOp o = atomic_op(*local, *target, kTargetOff, kCompareOff, kResultOff);
                    o.kind = k;
                    o.op = op;
                    o.dt = dt;
                    o.form = static_cast<Form>(form++ % 3);
                    const std::string what = o.str() + " [" + cs.name + "]: ";
                    ++runs;
                    a().log.clear();
                    Outcome r = run(o, ctx(0));
                    if (!r.ok()) {
                        wrong.push_back(what + r.str());
                        continue;
                    }
                    if ((r.comp->flags & kWhatFlags) != initiator_flags(k))
                        wrong.push_back(what + "completion flags 0x" + hex_flags(r.comp->flags));
                    std::vector<uint8_t> want_target = cs.target;
                    std::vector<uint8_t> want_result =
                        reference(dt, op, want_target, cs.operand, cs.compare);
                    std::string d =
                        diff(dt, target->data() + kTargetOff, want_target.data(), kCount);
                    if (!d.empty()) wrong.push_back(what + "target: " + d);
                    if (check_fill(target->data(), kTargetOff, 0xEE) != -1 ||
                        check_fill(target->data() + kTargetOff + len, kTargetLen - kTargetOff - len,
                                   0xEE) != -1)
                        wrong.push_back(what + "bytes around the target elements changed");
                    if (k != Kind::Base) {
                        d = diff(dt, result, want_result.data(), kCount);
                        if (!d.empty()) wrong.push_back(what + "fetched: " + d);
                    }
                    if (check_fill(result + (k == Kind::Base ? 0 : len), 64, 0xCD) != -1)
                        wrong.push_back(what + "written past the results");
                }
            }
        }
    }
    std::string list;
    for (size_t i = 0; i < wrong.size() && i < 40; ++i) list += "\n  " + wrong[i];
    EXPECT_TRUE(wrong.empty()) << wrong.size() << " wrong of " << runs << " operations:" << list;
    EXPECT_GT(runs, 600u);
    // Nothing at the target: no remote CQ data was asked for.
    poll_for(kQuiet);
    EXPECT_TRUE(b().log.comps.empty() && b().log.errs.empty()) << b().log.summary();
}

// The largest count the valid call allows works, in every kind.
TEST_P(AtomicTest, TheValidCountItselfIsAccepted) {
    const size_t n = expected_count(FI_UINT64);
    auto target = buf(n * 8, 0, true);
    auto local = buf(3 * n * 8);
    auto *t = reinterpret_cast<uint64_t *>(target->data());
    auto *ones = reinterpret_cast<uint64_t *>(local->data());
    auto *cmp = ones + n, *res = ones + 2 * n;
    for (size_t i = 0; i < n; ++i) {
        t[i] = 1000 + i;
        ones[i] = 1;
        cmp[i] = 1001 + i;  // CSWAP below: equal to the target after the SUM
    }
    AtomicOp o = atomic_op(*local, *target, 0, n * 8, 2 * n * 8);  // ones, cmp, res
    o.count = n;
    auto r = run(o, ctx(0));
    ASSERT_TRUE(r.ok()) << o.str() << ": " << r.str();
    o.kind = Kind::Fetch;
    o.op = FI_ATOMIC_READ;
    r = run(o, ctx(1));
    ASSERT_TRUE(r.ok()) << o.str() << ": " << r.str();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(res[i], 1001 + i) << "element " << i;
    o.kind = Kind::Compare;
    o.op = FI_CSWAP;
    r = run(o, ctx(2));
    ASSERT_TRUE(r.ok()) << o.str() << ": " << r.str();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(t[i], 1u) << "element " << i;
}

// ---- refused at the target ---------------------------------------------------------------------

TEST_P(AtomicTest, BadKeyFailsWithEaccesAndLeavesTheTargetUnchanged) {
    auto target = buf(4096, 0x5A, true);
    auto local = buf(4096, 1);
    int i = 0;
    for (Kind k : kKinds) {
        AtomicOp o = atomic_op(*local, *target, 64);
        o.kind = k;
        o.op = k == Kind::Compare ? FI_CSWAP : FI_SUM;
        o.key ^= 0x5A5A5A00ull;
        std::memset(o.compare, 0x5A, 64);  // would match the target
        auto r = run(o, ctx(i++));
        ASSERT_TRUE(r.err) << o.str() << " with a bad key: " << r.str();
        EXPECT_EQ(r.err->e.err, FI_EACCES) << o.str() << ": " << describe(*r.err);
        EXPECT_FALSE(r.comp);
        poll_for(Ms(20));
        EXPECT_EQ(check_fill(target->data(), 4096, 0x5A), -1) << o.str() << ": target written";
    }
    // The endpoint still works.
    AtomicOp o = atomic_op(*local, *target, 64);
    auto r = run(o, ctx(9));
    ASSERT_TRUE(r.ok()) << r.str();
    EXPECT_EQ(target->data()[64], 0x5A + 1);
}

// A region closed after atomics hit it refuses the next one: nothing at the target may keep
// resolving its key (the node-local target keeps the last resolution while the owner's
// regions stay as they were).
TEST_P(AtomicTest, ClosedRegionRefusesTheNextAtomic) {
    auto target = buf(4096, 0, true);
    auto local = buf(4096, 1);
    for (int i = 0; i < 3; ++i) {
        AtomicOp o = atomic_op(*local, *target, 64);
        o.kind = Kind::Fetch;
        o.op = FI_SUM;
        auto r = run(o, ctx(i));
        ASSERT_TRUE(r.ok()) << r.str();
    }
    EXPECT_EQ(target->data()[64], 3);
    AtomicOp o = atomic_op(*local, *target, 64);
    o.kind = Kind::Fetch;
    o.op = FI_SUM;
    ASSERT_FI_OK(fi_close(&target->mr.release()->fid));
    auto r = run(o, ctx(9));
    ASSERT_TRUE(r.err) << "an atomic on a closed region: " << r.str();
    EXPECT_EQ(r.err->e.err, FI_EACCES) << describe(*r.err);
    poll_for(Ms(20));
    EXPECT_EQ(target->data()[64], 3) << "a closed region was written";
}

TEST_P(AtomicTest, OutOfBoundsFailsWithEaccesAndWritesNothing) {
    constexpr size_t kLen = 4096;
    GuardedRegion g;
    ASSERT_NO_FATAL_FAILURE(guarded_region(g, kLen, 0xAA, FI_REMOTE_READ | FI_REMOTE_WRITE));
    auto local = buf(4096, 1);
    struct Oob {
        const char *name;
        long offset;  // of the first element, relative to the region
    } cases[] = {{"tail past the end", kLen - 16},
                 {"starts past the end", kLen + 64},
                 {"starts before the region", -64},
                 {"straddles the start", -16}};
    int i = 0;
    for (const Oob &c : cases) {
        for (Kind k : kKinds) {
            AtomicOp o = atomic_op(*local, g.base + static_cast<uint64_t>(c.offset), g.key);
            o.kind = k;
            o.op = k == Kind::Compare ? FI_CSWAP_NE : FI_SUM;
            auto r = run(o, ctx(i++));
            ASSERT_TRUE(r.err) << c.name << ", " << o.str() << ": " << r.str();
            EXPECT_EQ(r.err->e.err, FI_EACCES)
                << c.name << ", " << o.str() << ": " << describe(*r.err);
            poll_for(Ms(20));
            EXPECT_EQ(check_fill(g.mem->data(), 3 * kLen, 0xAA), -1)
                << c.name << ", " << o.str() << ": memory changed";
        }
    }
}

// Base atomics need FI_REMOTE_WRITE on the region, FI_ATOMIC_READ needs FI_REMOTE_READ, the
// other fetching and comparing ones need both.
TEST_P(AtomicTest, TheRegionsAccessDecidesWhichAtomicsAreAllowed) {
    struct Row {
        uint64_t access;
        Kind kind;
        int op;
        bool allowed;
    } rows[] = {
        {FI_REMOTE_READ, Kind::Base, FI_SUM, false},
        {FI_REMOTE_READ, Kind::Base, FI_ATOMIC_WRITE, false},
        {FI_REMOTE_READ, Kind::Fetch, FI_ATOMIC_READ, true},
        {FI_REMOTE_READ, Kind::Fetch, FI_SUM, false},
        {FI_REMOTE_READ, Kind::Compare, FI_CSWAP, false},
        {FI_REMOTE_WRITE, Kind::Base, FI_SUM, true},
        {FI_REMOTE_WRITE, Kind::Base, FI_ATOMIC_WRITE, true},
        {FI_REMOTE_WRITE, Kind::Fetch, FI_ATOMIC_READ, false},
        {FI_REMOTE_WRITE, Kind::Fetch, FI_SUM, false},
        {FI_REMOTE_WRITE, Kind::Fetch, FI_ATOMIC_WRITE, false},
        {FI_REMOTE_WRITE, Kind::Compare, FI_CSWAP, false},
        {FI_REMOTE_READ | FI_REMOTE_WRITE, Kind::Fetch, FI_SUM, true},
        {FI_REMOTE_READ | FI_REMOTE_WRITE, Kind::Compare, FI_CSWAP, true},
    };
    auto local = buf(4096);
    auto *ops = reinterpret_cast<uint64_t *>(local->data());
    int i = 0;
    for (const Row &row : rows) {
        auto target = buf(64, 0, true, row.access);
        auto *t = reinterpret_cast<uint64_t *>(target->data());
        for (size_t e = 0; e < kCount; ++e) {
            t[e] = 40 + e;
            ops[e] = 2;             // operand
            ops[128 + e] = 40 + e;  // compare: equal to the target
            ops[256 + e] = 0;       // results
        }
        AtomicOp o = atomic_op(*local, *target);  // ops, ops + 128, ops + 256
        o.kind = row.kind;
        o.op = row.op;
        const std::string what = o.str() + " on a region with" +
                                 (row.access & FI_REMOTE_READ ? " FI_REMOTE_READ" : "") +
                                 (row.access & FI_REMOTE_WRITE ? " FI_REMOTE_WRITE" : "");
        auto r = run(o, ctx(i++));
        if (row.allowed) {
            EXPECT_TRUE(r.ok()) << what << ": " << r.str();
            if (row.op == FI_ATOMIC_READ) {
                EXPECT_EQ(ops[256 + 3], 43u) << what;
            } else {
                EXPECT_EQ(t[3], row.op == FI_SUM ? 45u : 2u) << what;
            }
        } else {
            ASSERT_TRUE(r.err) << what << ": " << r.str();
            EXPECT_EQ(r.err->e.err, FI_EACCES) << what << ": " << describe(*r.err);
            poll_for(Ms(20));
            for (size_t e = 0; e < kCount; ++e) EXPECT_EQ(t[e], 40 + e) << what;
        }
    }
}

// ---- refused at the initiator ------------------------------------------------------------------

TEST_P(AtomicTest, InvalidPairIsRefusedAtPostWithEopnotsupp) {
    struct Pair {
        Kind kind;
        int op, dt;
    } pairs[] = {
        {Kind::Base, FI_BOR, FI_FLOAT},
        {Kind::Base, FI_BXOR, FI_DOUBLE_COMPLEX},
        {Kind::Base, FI_MIN, FI_FLOAT_COMPLEX},
        {Kind::Base, FI_ATOMIC_READ, FI_UINT64},
        {Kind::Base, FI_CSWAP, FI_UINT64},
        {Kind::Fetch, FI_MAX, FI_LONG_DOUBLE_COMPLEX},
        {Kind::Fetch, FI_BAND, FI_LONG_DOUBLE},
        {Kind::Fetch, FI_MSWAP, FI_UINT32},
        {Kind::Compare, FI_CSWAP_LT, FI_FLOAT_COMPLEX},
        {Kind::Compare, FI_MSWAP, FI_DOUBLE},
        {Kind::Compare, FI_SUM, FI_INT32},
        {Kind::Compare, FI_ATOMIC_WRITE, FI_INT8},
    };
    auto target = buf(4096, 0x33, true);
    auto local = buf(4096, 0x11);
    int i = 0;
    for (const Pair &p : pairs) {
        for (Form f : {Form::Short, Form::Msg}) {
            AtomicOp o = atomic_op(*local, *target, 256);
            o.kind = p.kind;
            o.op = p.op;
            o.dt = p.dt;
            o.form = f;
            expect_refused_at_post(o, -FI_EOPNOTSUPP, ctx(i++));
        }
    }
    EXPECT_EQ(check_fill(target->data(), 4096, 0x33), -1) << "target written";
}

TEST_P(AtomicTest, OutOfRangeOpOrDatatypeIsRefusedAtPostWithEinval) {
    auto target = buf(4096, 0x33, true);
    auto local = buf(4096, 0x11);
    int i = 0;
    for (Kind k : kKinds) {
        for (auto [op, dt] :
             {std::pair{FI_MSWAP + 1, int(FI_UINT64)}, std::pair{int(FI_SUM), FI_UINT128 + 1}}) {
            AtomicOp o = atomic_op(*local, *target, 256);
            o.kind = k;
            o.op = op;
            o.dt = dt;
            o.count = 1;
            expect_refused_at_post(o, -FI_EINVAL, ctx(i++));
        }
    }
    EXPECT_EQ(check_fill(target->data(), 4096, 0x33), -1) << "target written";
}

TEST_P(AtomicTest, CountAboveTheValidCountIsEmsgsize) {
    auto target = buf(8192, 0x33, true);
    auto local = buf(3 * 4096, 0x11);
    int i = 0;
    for (Kind k : kKinds) {
        for (int dt : {int(FI_INT8), int(FI_UINT64), int(FI_LONG_DOUBLE_COMPLEX)}) {
            AtomicOp o = atomic_op(*local, *target, 0, 4096, 8192);
            o.kind = k;
            o.op = k == Kind::Compare ? FI_CSWAP : FI_SUM;
            o.dt = dt;
            o.count = expected_count(dt) + 1;
            expect_refused_at_post(o, -FI_EMSGSIZE, ctx(i++));
        }
    }
    EXPECT_EQ(check_fill(target->data(), 8192, 0x33), -1) << "target written";
}

TEST_P(AtomicTest, ZeroCountIsEinval) {
    auto target = buf(4096, 0x33, true);
    auto local = buf(4096, 0x11);
    int i = 0;
    for (Kind k : kKinds) {
        for (Form f : {Form::Short, Form::Vec}) {
            AtomicOp o = atomic_op(*local, *target);
            o.kind = k;
            o.op = k == Kind::Compare ? FI_CSWAP : FI_SUM;
            o.form = f;
            o.count = 0;
            expect_refused_at_post(o, -FI_EINVAL, ctx(i++));
        }
    }
    EXPECT_EQ(fi_inject_atomic(a().ep, local->data(), 0, a().peer[1], rma_addr(*target),
                               target->key, FI_UINT64, FI_SUM),
              -FI_EINVAL);
    poll_for(kQuiet);
    EXPECT_EQ(check_fill(target->data(), 4096, 0x33), -1) << "target written";
}

// The v and msg forms: the results (and compare values) must cover as many elements as the
// operand.
TEST_P(AtomicTest, ResultOrCompareCountMismatchIsEinval) {
    auto target = buf(4096, 0x33, true);
    auto local = buf(4096, 0x11);
    int i = 0;
    for (Form f : {Form::Vec, Form::Msg}) {
        AtomicOp o = atomic_op(*local, *target);
        o.kind = Kind::Fetch;
        o.form = f;
        o.result_count = kCount - 1;
        expect_refused_at_post(o, -FI_EINVAL, ctx(i++));
        o.result_count = kCount + 1;
        expect_refused_at_post(o, -FI_EINVAL, ctx(i++));
        o.kind = Kind::Compare;
        o.op = FI_CSWAP;
        o.result_count = kCount - 1;
        expect_refused_at_post(o, -FI_EINVAL, ctx(i++));
        o.result_count = 0;
        o.compare_count = kCount - 1;
        expect_refused_at_post(o, -FI_EINVAL, ctx(i++));
    }
    EXPECT_EQ(check_fill(target->data(), 4096, 0x33), -1) << "target written";
}

// fi_atomic(3): "For FI_ATOMIC_READ operations, the source buffer operand (e.g.
// fi_fetch_atomic buf parameter) is ignored and may be NULL."
TEST_P(AtomicTest, AtomicReadTakesANullOperand) {
    auto target = buf(64, 0, true);
    auto local = buf(4096);
    auto *t = reinterpret_cast<uint64_t *>(target->data());
    auto *res = reinterpret_cast<uint64_t *>(local->data());
    int i = 0;
    for (Form f : {Form::Short, Form::Vec, Form::Msg}) {
        for (size_t e = 0; e < kCount; ++e) {
            t[e] = 0x1111 * (e + 1) + i;
            res[e] = 0;
        }
        AtomicOp o = atomic_op(*local, *target, 0, 1024, 0);  // the results in res
        o.kind = Kind::Fetch;
        o.op = FI_ATOMIC_READ;
        o.form = f;
        o.operand = nullptr;
        auto r = run(o, ctx(i++));
        ASSERT_TRUE(r.ok()) << o.str() << " without an operand: " << r.str();
        for (size_t e = 0; e < kCount; ++e)
            EXPECT_EQ(res[e], t[e]) << o.str() << " without an operand, element " << e;
    }
}

// FI_INJECT on the msg forms: the constant buffers (operand, compare values) are the
// application's again when the call returns; the operation still completes.
TEST_P(AtomicTest, InjectFlagFreesTheOperandsWhenTheCallReturns) {
    auto target = buf(64, 0, true);
    auto local = buf(4096);
    auto *t = reinterpret_cast<uint64_t *>(target->data());
    auto *operand = reinterpret_cast<uint64_t *>(local->data());
    auto *compare = operand + 128;  // the results at operand + 256
    int i = 0;
    for (Kind k : kKinds) {
        for (size_t e = 0; e < kCount; ++e) {
            t[e] = 10 + e;
            operand[e] = 5;
            compare[e] = 10 + e;  // equal: CSWAP swaps
        }
        AtomicOp o = atomic_op(*local, *target);  // operand, compare
        o.kind = k;
        o.op = k == Kind::Compare ? FI_CSWAP : FI_SUM;
        o.form = Form::Msg;
        o.msg_flags = FI_INJECT;
        void *c = ctx(i++);
        ASSERT_FI_OK(post([&] { return issue(o, c); })) << o.str();
        for (size_t e = 0; e < kCount; ++e) operand[e] = compare[e] = 0xBAD;
        ASSERT_TRUE(wait_comp(a(), c)) << o.str() << ": " << a().log.summary();
        for (size_t e = 0; e < kCount; ++e)
            EXPECT_EQ(t[e], k == Kind::Compare ? 5u : 15 + e) << o.str() << ", element " << e;
    }
}

// ---- fi_inject_atomic ------------------------------------------------------------------------

TEST_P(AtomicTest, InjectAtomicUpdatesTheTargetWithoutACompletion) {
    auto target = buf(64, 0, true);
    auto *t = reinterpret_cast<uint64_t *>(target->data());
    for (size_t e = 0; e < kCount; ++e) t[e] = 100 * e;
    uint64_t operand[kCount] = {1, 2, 3, 4};
    ASSERT_FI_OK(post([&] {
        return fi_inject_atomic(a().ep, operand, kCount, a().peer[1], rma_addr(*target),
                                target->key, FI_UINT64, FI_SUM);
    }));
    for (auto &v : operand) v = 0xBAD;  // ours again at once
    EXPECT_TRUE(poll_until([&] { return t[0] == 1 && t[1] == 102 && t[2] == 203 && t[3] == 304; }))
        << "target " << t[0] << " " << t[1] << " " << t[2] << " " << t[3];
    poll_for(kQuiet);
    EXPECT_TRUE(a().log.comps.empty() && a().log.errs.empty()) << a().log.summary();
    EXPECT_TRUE(b().log.comps.empty() && b().log.errs.empty()) << b().log.summary();
}

TEST_P(AtomicTest, InjectAtomicOfMoreThanInjectSizeIsEmsgsize) {
    const size_t inject = info->tx_attr->inject_size;
    ASSERT_GE(inject, 8u);
    auto target = buf(8192, 0x33, true);
    std::vector<uint64_t> operand(inject / 8 + 2, 1);
    EXPECT_EQ(fi_inject_atomic(a().ep, operand.data(), inject / 8 + 1, a().peer[1],
                               rma_addr(*target), target->key, FI_UINT64, FI_SUM),
              -FI_EMSGSIZE)
        << "inject_size " << inject;
    poll_for(kQuiet);
    EXPECT_EQ(check_fill(target->data(), 8192, 0x33), -1) << "target written";
    EXPECT_TRUE(a().log.comps.empty() && a().log.errs.empty()) << a().log.summary();
}

// ---- what the target sees ------------------------------------------------------------------

TEST_P(AtomicTest, RemoteCqDataReportsTheAtomicAtTheTarget) {
    auto target = buf(4096, 0, true);
    auto local = buf(4096);
    struct Row {
        Kind kind;
        int op, dt;
        uint64_t data, flags;
    } rows[] = {
        {Kind::Base, FI_SUM, FI_UINT64, 0xA7000001,
         FI_ATOMIC | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA},
        {Kind::Fetch, FI_SUM, FI_INT32, 0xA7000002, FI_ATOMIC | FI_REMOTE_READ | FI_REMOTE_CQ_DATA},
        {Kind::Fetch, FI_ATOMIC_READ, FI_DOUBLE, 0xA7000003,
         FI_ATOMIC | FI_REMOTE_READ | FI_REMOTE_CQ_DATA},
        {Kind::Compare, FI_CSWAP, FI_UINT16, 0xA7000004,
         FI_ATOMIC | FI_REMOTE_READ | FI_REMOTE_CQ_DATA},
    };
    int i = 0;
    for (const Row &row : rows) {
        b().log.clear();
        auto *t = reinterpret_cast<uint32_t *>(target->data());
        t[0] = 0;
        auto *op = reinterpret_cast<uint32_t *>(local->data());
        op[0] = 7;
        AtomicOp o = atomic_op(*local, *target);
        o.kind = row.kind;
        o.op = row.op;
        o.dt = row.dt;
        o.form = Form::Msg;
        o.msg_flags = FI_REMOTE_CQ_DATA;
        o.data = row.data;
        auto r = run(o, ctx(i++));
        ASSERT_TRUE(r.ok()) << o.str() << ": " << r.str();
        ASSERT_TRUE(poll_until([&] { return !b().log.comps.empty() || !b().log.errs.empty(); }))
            << o.str() << ": no completion at the target";
        poll_for(Ms(20));
        ASSERT_EQ(b().log.comps.size(), 1u) << o.str() << ": " << b().log.summary();
        const Completion &rc = b().log.comps[0];
        EXPECT_EQ(rc.flags, row.flags) << o.str() << ": flags 0x" << std::hex << rc.flags;
        EXPECT_EQ(rc.data, row.data) << o.str();
        EXPECT_EQ(rc.len, kCount * element_size(row.dt)) << o.str();
    }
}

// A refused atomic reports nothing at the target: the first remote CQ data the target sees is
// that of the good atomic posted after the refused ones.
TEST_P(AtomicTest, RefusedAtomicDeliversNoRemoteCqData) {
    auto target = buf(4096, 0, true);
    auto local = buf(4096);
    int i = 0;
    for (Kind k : kKinds) {
        AtomicOp o = atomic_op(*local, *target);
        o.kind = k;
        o.op = k == Kind::Compare ? FI_CSWAP : FI_SUM;
        o.form = Form::Msg;
        o.msg_flags = FI_REMOTE_CQ_DATA;
        o.data = 0xBAD0 + i;
        o.key ^= 0x5A5A5A00ull;
        auto r = run(o, ctx(i++));
        ASSERT_TRUE(r.err) << o.str() << " with a bad key: " << r.str();
    }
    AtomicOp o = atomic_op(*local, *target);
    o.form = Form::Msg;
    o.msg_flags = FI_REMOTE_CQ_DATA;
    o.data = 0x600D;
    auto r = run(o, ctx(9));
    ASSERT_TRUE(r.ok()) << r.str();
    ASSERT_TRUE(poll_until([&] { return !b().log.comps.empty(); })) << b().log.summary();
    EXPECT_EQ(b().log.comps[0].data, 0x600Du) << "a refused atomic's CQ data was delivered";
    poll_for(kQuiet);
    EXPECT_EQ(b().log.comps.size(), 1u) << b().log.summary();
    EXPECT_TRUE(b().log.errs.empty()) << b().log.summary();
}

class AtomicCounterTest : public AtomicFixture {
  protected:
    void configure(FabricOptions &o) override {
        AtomicFixture::configure(o);
        o.caps |= FI_RMA_EVENT;
    }
    void before_enable(Endpoint &e, size_t) override {
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.read_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.write_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.rread_cntr));
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.rwrite_cntr));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.read_cntr->fid, FI_READ));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.write_cntr->fid, FI_WRITE));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.rread_cntr->fid, FI_REMOTE_READ));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.rwrite_cntr->fid, FI_REMOTE_WRITE));
    }
    bool cntr_reaches(fid_cntr *c, uint64_t v) {
        return poll_until([&] { return fi_cntr_read(c) >= v; });
    }
};

// Base atomics count on the initiator's write counter and the target's remote-write counter;
// fetching and comparing ones on the read and remote-read counters.
TEST_F(AtomicCounterTest, InitiatorAndRemoteCountersCountAtomics) {
    auto target = buf(4096, 0, true);
    auto local = buf(4096);
    int i = 0;
    auto go = [&](Kind k, int op, Form f) {
        AtomicOp o = atomic_op(*local, *target);
        o.kind = k;
        o.op = op;
        o.form = f;
        auto r = run(o, ctx(i++));
        EXPECT_TRUE(r.ok()) << o.str() << ": " << r.str();
    };
    go(Kind::Base, FI_SUM, Form::Short);
    go(Kind::Base, FI_BOR, Form::Vec);
    go(Kind::Base, FI_ATOMIC_WRITE, Form::Msg);
    go(Kind::Fetch, FI_SUM, Form::Short);
    go(Kind::Fetch, FI_ATOMIC_READ, Form::Msg);
    go(Kind::Compare, FI_CSWAP, Form::Vec);
    go(Kind::Compare, FI_MSWAP, Form::Short);
    EXPECT_TRUE(cntr_reaches(a().write_cntr, 3)) << fi_cntr_read(a().write_cntr);
    EXPECT_TRUE(cntr_reaches(a().read_cntr, 4)) << fi_cntr_read(a().read_cntr);
    EXPECT_TRUE(cntr_reaches(b().rwrite_cntr, 3)) << fi_cntr_read(b().rwrite_cntr);
    EXPECT_TRUE(cntr_reaches(b().rread_cntr, 4)) << fi_cntr_read(b().rread_cntr);
    poll_for(kQuiet);
    EXPECT_EQ(fi_cntr_read(a().write_cntr), 3u);
    EXPECT_EQ(fi_cntr_read(a().read_cntr), 4u);
    EXPECT_EQ(fi_cntr_read(b().rwrite_cntr), 3u);
    EXPECT_EQ(fi_cntr_read(b().rread_cntr), 4u);
    EXPECT_EQ(fi_cntr_read(a().rwrite_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(a().rread_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(b().write_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(b().read_cntr), 0u);
    EXPECT_EQ(fi_cntr_readerr(a().write_cntr), 0u);
    EXPECT_EQ(fi_cntr_readerr(a().read_cntr), 0u);
}

TEST_F(AtomicCounterTest, RefusedAtomicsCountAsErrorsAndNotAtTheTarget) {
    auto target = buf(4096, 0, true);
    auto local = buf(4096);
    AtomicOp o = atomic_op(*local, *target);
    o.key += 0x5151;  // a bad key
    auto r = run(o, ctx(0));
    EXPECT_TRUE(r.err) << o.str() << " with a bad key: " << r.str();
    o.kind = Kind::Fetch;
    r = run(o, ctx(1));
    EXPECT_TRUE(r.err) << o.str() << " with a bad key: " << r.str();
    EXPECT_TRUE(poll_until([&] {
        return fi_cntr_readerr(a().write_cntr) >= 1 && fi_cntr_readerr(a().read_cntr) >= 1;
    }));
    poll_for(kQuiet);
    EXPECT_EQ(fi_cntr_readerr(a().write_cntr), 1u);
    EXPECT_EQ(fi_cntr_readerr(a().read_cntr), 1u);
    EXPECT_EQ(fi_cntr_read(a().write_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(a().read_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(b().rwrite_cntr), 0u);
    EXPECT_EQ(fi_cntr_read(b().rread_cntr), 0u);
}

// ---- alignment ------------------------------------------------------------------------------

// With FI_MR_VIRT_ADDR the initiator knows the target address: a misaligned one is refused at
// post.
class AtomicVirtAddrTest : public AtomicFixture {};

TEST_F(AtomicVirtAddrTest, MisalignedTargetIsRefusedAtPost) {
    if (!virt_addr())
        GTEST_SKIP() << "tandem addresses by offset unless FI_TANDEM_MR_VIRT_ADDR=1 (the "
                        "api_virt.atomic run)";
    auto target = buf(4096, 0x33, true);
    auto local = buf(4096, 0x11);
    int i = 0;
    for (Kind k : kKinds) {
        for (Form f : {Form::Short, Form::Vec, Form::Msg}) {
            AtomicOp o = atomic_op(*local, *target, 64 + 1);
            o.kind = k;
            o.op = k == Kind::Compare ? FI_CSWAP : FI_SUM;
            o.form = f;
            expect_refused_at_post(o, -FI_EINVAL, ctx(i++));
        }
    }
    EXPECT_EQ(fi_inject_atomic(a().ep, local->data(), 1, a().peer[1], rma_addr(*target, 64) + 4,
                               target->key, FI_UINT64, FI_SUM),
              -FI_EINVAL);
    // 16-byte types need 16-byte alignment.
    AtomicOp o = atomic_op(*local, *target, 64 + 8);
    o.dt = FI_LONG_DOUBLE;
    expect_refused_at_post(o, -FI_EINVAL, ctx(i++));
    poll_for(kQuiet);
    EXPECT_EQ(check_fill(target->data(), 4096, 0x33), -1) << "target written";
}

// With offsets into the region, only the target knows the address: an FI_EINVAL error
// completion.
class AtomicOffsetTest : public AtomicFixture {
  protected:
    int mode() const override { return 0; }
};

TEST_F(AtomicOffsetTest, MisalignedTargetFailsWithAnEinvalCompletion) {
    ASSERT_FALSE(virt_addr());
    auto target = buf(4096, 0x33, true);
    auto local = buf(4096, 0x11);
    int i = 0;
    for (Kind k : kKinds) {
        AtomicOp o = atomic_op(*local, *target, 64 + 1);
        o.kind = k;
        o.op = k == Kind::Compare ? FI_CSWAP : FI_SUM;
        auto r = run(o, ctx(i++));
        ASSERT_TRUE(r.err) << o.str() << " at a misaligned offset: " << r.str();
        EXPECT_EQ(r.err->e.err, FI_EINVAL) << o.str() << ": " << describe(*r.err);
    }
    poll_for(kQuiet);
    EXPECT_EQ(check_fill(target->data(), 4096, 0x33), -1) << "target written";
}

// ---- ordering ----------------------------------------------------------------------------------

// FI_ORDER_ATOMIC_RAW: a fetch posted right behind 1000 sums (nothing waited for in between)
// reads all of them.
TEST_P(AtomicTest, FetchPostedRightAfter1000SumsReadsAllOfThem) {
    constexpr uint64_t kAll =
        FI_ORDER_ATOMIC_RAR | FI_ORDER_ATOMIC_RAW | FI_ORDER_ATOMIC_WAR | FI_ORDER_ATOMIC_WAW;
    ASSERT_EQ(info->tx_attr->msg_order & kAll, kAll)
        << "msg_order 0x" << std::hex << info->tx_attr->msg_order;
    constexpr size_t kSums = 1000;
    auto target = buf(64, 0, true);
    auto local = buf(64);
    auto *one = reinterpret_cast<uint64_t *>(local->data());
    auto *read = one + 1;
    *one = 1;
    *read = 0xBAD;
    std::vector<fi_context2> cs(kSums + 1);
    for (size_t i = 0; i < kSums; ++i)
        ASSERT_FI_OK(post([&] {
            return fi_atomic(a().ep, one, 1, local->desc, a().peer[1], rma_addr(*target),
                             target->key, FI_UINT64, FI_SUM, &cs[i]);
        })) << "sum "
            << i;
    ASSERT_FI_OK(post([&] {
        return fi_fetch_atomic(a().ep, one, 1, local->desc, read, local->desc, a().peer[1],
                               rma_addr(*target), target->key, FI_UINT64, FI_ATOMIC_READ,
                               &cs[kSums]);
    }));
    ASSERT_TRUE(poll_until([&] { return a().log.has(&cs[kSums]) || a().log.has_err(&cs[kSums]); }))
        << a().log.summary();
    ASSERT_TRUE(a().log.has(&cs[kSums])) << a().log.summary();
    EXPECT_EQ(*read, kSums);
    EXPECT_TRUE(poll_until([&] { return a().log.comps.size() + a().log.errs.size() >= kSums + 1; }))
        << a().log.summary();
    EXPECT_TRUE(a().log.errs.empty()) << a().log.summary();
    EXPECT_EQ(a().log.count_flags(FI_ATOMIC | FI_WRITE), kSums);
    EXPECT_EQ(*reinterpret_cast<uint64_t *>(target->data()), kSums);
}

// FI_ORDER_RAW and FI_ORDER_WAW (fi_endpoint(3): "RMA and atomic" reads and writes) between
// large RMA writes and atomics. Node-local, writes of 256 KiB and more are copied in two halves
// by both processes at once; what follows them must still find them whole. The atomics touch
// the region's first and last elements (one in each half). Over the link: the same promises.
const size_t kLargeWriteSizes[] = {size_t{256} << 10, (size_t{1} << 20) + 4096, size_t{4} << 20};

TEST_P(AtomicTest, AtomicFetchPostedRightAfterALargeWriteReadsWhatItWrote) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_RAW);
    uint32_t seed = 900;
    for (size_t len : kLargeWriteSizes) {
        auto target = buf(len, 0xEE, true);
        auto local = buf(len);
        fill_pattern(local->data(), len, seed);
        auto res = buf(64, 0x11);
        ASSERT_FI_OK(post([&] {
            return fi_write(a().ep, local->data(), len, local->desc, a().peer[1], rma_addr(*target),
                            target->key, ctx(1));
        }));
        ASSERT_FI_OK(post([&] {
            return fi_fetch_atomic(a().ep, nullptr, 2, nullptr, res->data(), res->desc, a().peer[1],
                                   rma_addr(*target, len - 16), target->key, FI_UINT64,
                                   FI_ATOMIC_READ, ctx(2));
        }));
        ASSERT_FI_OK(post([&] {
            return fi_fetch_atomic(a().ep, nullptr, 2, nullptr, res->data() + 16, res->desc,
                                   a().peer[1], rma_addr(*target), target->key, FI_UINT64,
                                   FI_ATOMIC_READ, ctx(3));
        }));
        ASSERT_TRUE(wait_comp(a(), ctx(2))) << a().log.summary();
        ASSERT_TRUE(wait_comp(a(), ctx(3))) << a().log.summary();
        ASSERT_TRUE(wait_comp(a(), ctx(1))) << a().log.summary();
        EXPECT_EQ(check_pattern(res->data(), 16, seed, len - 16), -1)
            << len << " bytes: the fetch of the last elements overtook the write";
        EXPECT_EQ(check_pattern(res->data() + 16, 16, seed), -1)
            << len << " bytes: the fetch of the first elements overtook the write";
        a().log.clear();
        ++seed;
    }
}

TEST_P(AtomicTest, AtomicUpdatePostedRightAfterALargeWriteLandsOnIt) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_WAW);
    uint32_t seed = 910;
    for (size_t len : kLargeWriteSizes) {
        auto target = buf(len, 0xEE, true);
        auto local = buf(len);
        fill_pattern(local->data(), len, seed);
        uint64_t first, last;
        std::memcpy(&first, local->data(), 8);
        std::memcpy(&last, local->data() + len - 8, 8);
        auto one = buf(64);
        *reinterpret_cast<uint64_t *>(one->data()) = 1;
        ASSERT_FI_OK(post([&] {
            return fi_write(a().ep, local->data(), len, local->desc, a().peer[1], rma_addr(*target),
                            target->key, ctx(1));
        }));
        for (size_t off : {len - 8, size_t{0}})
            ASSERT_FI_OK(post([&] {
                return fi_atomic(a().ep, one->data(), 1, one->desc, a().peer[1],
                                 rma_addr(*target, off), target->key, FI_UINT64, FI_SUM,
                                 ctx(off ? 2 : 3));
            }));
        ASSERT_TRUE(wait_comp(a(), ctx(1))) << a().log.summary();
        ASSERT_TRUE(wait_comp(a(), ctx(2))) << a().log.summary();
        ASSERT_TRUE(wait_comp(a(), ctx(3))) << a().log.summary();
        uint64_t got_first, got_last;
        std::memcpy(&got_first, target->data(), 8);
        std::memcpy(&got_last, target->data() + len - 8, 8);
        EXPECT_EQ(got_last, last + 1) << len << " bytes: the sum at the end did not land on the "
                                      << "write (the write's second half came after it?)";
        EXPECT_EQ(got_first, first + 1) << len << " bytes: the sum at the start";
        EXPECT_EQ(check_pattern(target->data() + 8, len - 16, seed, 8), -1) << len;
        a().log.clear();
        ++seed;
    }
}

// Small RMA operations and atomics on the same word, the second posted right behind the first
// (nothing waited for in between), 50 rounds each. tandem advertises FI_ORDER_RAW, WAW, WAR
// and SAW with max_order_*_size 2 GiB; fi_endpoint(3): "an RMA or atomic read operation issued
// after an RMA or atomic write operation [...] will see the results of the previous RMA or
// atomic write", and likewise for writes after writes and after reads.
class AtomicRmaOrderTest : public AtomicTest {
  protected:
    static constexpr int kRounds = 50;
    void SetUp() override {
        ASSERT_NO_FATAL_FAILURE(AtomicTest::SetUp());
        if (IsSkipped()) return;
        target = buf(64, 0, true);
        local = buf(4096);
        t = reinterpret_cast<uint64_t *>(target->data());
        l = reinterpret_cast<uint64_t *>(local->data());
    }
    void TearDown() override {
        target.reset();  // their MRs before the domain
        local.reset();
        AtomicTest::TearDown();
    }
    ssize_t atomic(Kind k, int op, uint64_t *operand, uint64_t *result, void *c) {
        AtomicOp o = atomic_op(*local, *target);
        o.kind = k;
        o.op = op;
        o.count = 1;
        o.operand = o.compare = operand;
        o.result = result;
        return post([&] { return issue(o, c); });
    }
    ssize_t rma(bool write, uint64_t *p, void *c) {
        return post([&] {
            return write ? fi_write(a().ep, p, 8, local->desc, a().peer[1], rma_addr(*target),
                                    target->key, c)
                         : fi_read(a().ep, p, 8, local->desc, a().peer[1], rma_addr(*target),
                                   target->key, c);
        });
    }
    void wait_all(std::initializer_list<int> cs) {
        for (int c : cs) ASSERT_TRUE(wait_comp(a(), ctx(c))) << a().log.summary();
        a().log.clear();
        b().log.clear();
    }
    std::unique_ptr<DataBuf> target, local;
    uint64_t *t = nullptr, *l = nullptr;
};

TEST_P(AtomicRmaOrderTest, RmaReadPostedRightAfterAnAtomicWriteReadsIt) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_RAW);
    int wrong = 0;
    for (int round = 0; round < kRounds; ++round) {
        l[0] = 1000 + round;
        l[1] = 0;
        ASSERT_FI_OK(atomic(Kind::Base, FI_ATOMIC_WRITE, &l[0], nullptr, ctx(1)));
        ASSERT_FI_OK(rma(false, &l[1], ctx(2)));
        ASSERT_NO_FATAL_FAILURE(wait_all({1, 2}));
        wrong += l[1] != l[0];
    }
    EXPECT_EQ(wrong, 0) << "of " << kRounds << " fi_reads posted right after an FI_ATOMIC_WRITE "
                        << "of the same word, these read the value from before it";
}

TEST_P(AtomicRmaOrderTest, AtomicFetchPostedRightAfterAnRmaWriteReadsIt) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_RAW);
    int wrong = 0;
    for (int round = 0; round < kRounds; ++round) {
        l[0] = 2000 + round;
        l[1] = 0;
        ASSERT_FI_OK(rma(true, &l[0], ctx(1)));
        ASSERT_FI_OK(atomic(Kind::Fetch, FI_ATOMIC_READ, &l[2], &l[1], ctx(2)));
        ASSERT_NO_FATAL_FAILURE(wait_all({1, 2}));
        wrong += l[1] != l[0];
    }
    EXPECT_EQ(wrong, 0) << "of " << kRounds << " FI_ATOMIC_READs posted right after an fi_write "
                        << "of the same word, these read the value from before it";
}

TEST_P(AtomicRmaOrderTest, RmaWritePostedRightAfterAnAtomicWriteWins) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_WAW);
    int wrong = 0;
    for (int round = 0; round < kRounds; ++round) {
        l[0] = 3000 + round;  // the atomic's
        l[1] = 4000 + round;  // the RMA write's, which comes second
        ASSERT_FI_OK(atomic(Kind::Base, FI_ATOMIC_WRITE, &l[0], nullptr, ctx(1)));
        ASSERT_FI_OK(rma(true, &l[1], ctx(2)));
        ASSERT_NO_FATAL_FAILURE(wait_all({1, 2}));
        wrong += t[0] != l[1];
    }
    EXPECT_EQ(wrong, 0) << "of " << kRounds << " fi_writes posted right after an "
                        << "FI_ATOMIC_WRITE of the same word, these were overwritten by it";
}

TEST_P(AtomicRmaOrderTest, AtomicWritePostedRightAfterAnRmaWriteWins) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_WAW);
    int wrong = 0;
    for (int round = 0; round < kRounds; ++round) {
        l[0] = 5000 + round;  // the RMA write's
        l[1] = 6000 + round;  // the atomic's, which comes second
        ASSERT_FI_OK(rma(true, &l[0], ctx(1)));
        ASSERT_FI_OK(atomic(Kind::Base, FI_ATOMIC_WRITE, &l[1], nullptr, ctx(2)));
        ASSERT_NO_FATAL_FAILURE(wait_all({1, 2}));
        wrong += t[0] != l[1];
    }
    EXPECT_EQ(wrong, 0) << "of " << kRounds << " FI_ATOMIC_WRITEs posted right after an fi_write "
                        << "of the same word, these were overwritten by it";
}

TEST_P(AtomicRmaOrderTest, RmaWritePostedRightAfterAnAtomicFetchIsNotSeenByIt) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_WAR);
    int wrong = 0;
    for (int round = 0; round < kRounds; ++round) {
        t[0] = 7000 + round;
        l[0] = 8000 + round;  // the RMA write's
        l[1] = 0;
        ASSERT_FI_OK(atomic(Kind::Fetch, FI_ATOMIC_READ, &l[2], &l[1], ctx(1)));
        ASSERT_FI_OK(rma(true, &l[0], ctx(2)));
        ASSERT_NO_FATAL_FAILURE(wait_all({1, 2}));
        wrong += l[1] != 7000u + round;
    }
    EXPECT_EQ(wrong, 0) << "of " << kRounds << " FI_ATOMIC_READs followed by an fi_write of the "
                        << "same word, these fetched the write's value";
}

TEST_P(AtomicRmaOrderTest, MessageSentRightAfterAnAtomicFindsItApplied) {
    ASSERT_TRUE(info->tx_attr->msg_order & FI_ORDER_SAW);
    auto got = buf(64);
    int wrong = 0;
    for (int round = 0; round < kRounds; ++round) {
        l[0] = 9000 + round;
        ASSERT_FI_OK(post(
            [&] { return fi_recv(b().ep, got->data(), 8, got->desc, FI_ADDR_UNSPEC, ctx(3)); }));
        ASSERT_FI_OK(atomic(Kind::Base, FI_ATOMIC_WRITE, &l[0], nullptr, ctx(1)));
        ASSERT_FI_OK(post([&] { return fi_send(a().ep, l, 8, local->desc, a().peer[1], ctx(2)); }));
        ASSERT_TRUE(poll_until([&] { return b().log.has(ctx(3)) || b().log.has_err(ctx(3)); }))
            << b().log.summary();
        // Looked at the moment the message is seen.
        wrong += t[0] != l[0];
        ASSERT_NO_FATAL_FAILURE(wait_all({1, 2}));
    }
    EXPECT_EQ(wrong, 0) << "of " << kRounds << " messages sent right after an FI_ATOMIC_WRITE, "
                        << "these arrived before it was applied";
}

std::string mode_name(const ::testing::TestParamInfo<int> &p) {
    return p.param ? "all_modes" : "no_modes";
}
INSTANTIATE_TEST_SUITE_P(Modes, AtomicTest, ::testing::Values(kAllModes, 0), mode_name);
INSTANTIATE_TEST_SUITE_P(Modes, AtomicRmaOrderTest, ::testing::Values(kAllModes, 0), mode_name);

}  // namespace
}  // namespace tandem_test

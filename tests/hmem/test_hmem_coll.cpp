// fi_collective(3) with device memory (FI_HMEM, FI_MR_HMEM; every device buffer registered with
// fi_mr_regattr as FI_HMEM_CUDA, device 0, and passed with its fi_mr_desc) between three
// processes, one per rank:
//   - Staged.*: the seven collectives that move data (fi_allreduce FI_SUM of FI_UINT64,
//     fi_broadcast from rank 1, fi_allgather, fi_reduce_scatter FI_SUM, fi_alltoall, fi_gather
//     and fi_scatter with root 0) at counts 1 and 9001 (72 KB: above the 64 KiB ring threshold
//     of allreduce by messages), input and result in device memory; then allreduce and
//     allgather with the input in host memory and the result in device memory, and the other
//     way round. Each result is copied back with the driver and checked against the reference
//     of tests/common/coll_reference.h, and the element behind it must be untouched. tandem
//     stages device buffers through host memory (docs/user-guide.md, "Collectives"): under the
//     emulated driver, whose counters this process reads, each call must have copied exactly
//     the bytes it reads from the device before, and exactly those it writes to the device
//     after, and nothing device to device or through IPC; the reduction itself ran on the host
//     (the emulator has no kernels), which the test says in its output.
//   - P2pRequired.*: fi_setopt(FI_OPT_FI_HMEM_P2P, FI_HMEM_P2P_REQUIRED). Where tandem takes it
//     (the node-local path), a collective given a device buffer returns -FI_EOPNOTSUPP at once:
//     nothing copied, nothing completes, and a host-memory collective still runs. Where it
//     cannot (FI_TANDEM_LOCAL=0: the TCP link only stages, or FI_HMEM_DISABLE_P2P), the
//     setopt itself is -FI_EOPNOTSUPP and the mode stays as it was.
// Device memory is written and read back only with the driver's cuMemcpyHtoD / cuMemcpyDtoH (the
// emulator's device memory is PROT_NONE: the CPU touching it kills the process, which the test
// then reports with the address).
//
// Black-box as test_hmem_atomic.cpp, on the role processes of tests/common/atomic_processes.h:
// libfabric and the CUDA driver are loaded with dlopen (tests/common/hmem_driver.h) in the rank
// processes only, never in the gtest process. The ranks (tests/common/coll_rank.h, as in
// tests/peer/test_coll_processes.cpp) share a block made before the fork: each publishes its
// endpoint name, all insert every name in rank order (rank q is fi_addr_t q), a counter is their
// barrier, and a rank that gives up raises an abort flag so that the others stop waiting for it.
// Each rank joins one group of all three (an AV set of every rank, fi_av_set_addr,
// fi_join_collective, FI_JOIN_COMPLETE on the EQ, fi_mc_addr). ctest variants: hmem.emu.coll.*
// (the emulated driver, node-local path: the group runs on a shared segment), hmem.emu_net.coll.*
// (the same with FI_TANDEM_LOCAL=0: by messages over the TCP link), hmem.gpu.coll.* (the real
// driver: without a GPU every test skips with the reason).
#include "tests/common/atomic_processes.h"
#include "tests/common/coll_rank.h"
#include "tests/common/coll_reference.h"
#include "tests/common/hmem_driver.h"
#include "tests/common/shared_map.h"

#include <rdma/fi_collective.h>

#include <gtest/gtest.h>

#include <strings.h>

namespace {

using namespace tandem_test;
using namespace tandem_test::atomic_procs;
using namespace tandem_test::coll_procs;
using namespace tandem_test::coll_ref;

constexpr int kRanks = 3;
constexpr uint64_t kCaps = FI_MSG | FI_COLLECTIVE | FI_HMEM;
constexpr int kMrMode = FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
constexpr auto kRankWait = 10s;          // any one wait of a rank
constexpr auto kDeadline = 30s;          // the gtest process's, for all ranks
constexpr size_t kCounts[] = {1, 9001};  // 9001 x 8 B: above the 64 KiB ring threshold

// Device 0's memory is the device memory of every test here.
#define REQUIRE_DEVICE() HMEM_REQUIRE_DEVICE(device_probe<DeviceNeed::kDevice0Context>())

// libfabric's FI_HMEM_DISABLE_P2P set to a true value: every endpoint's P2P mode is DISABLED.
bool p2p_disabled_by_env() {
    const char *v = getenv("FI_HMEM_DISABLE_P2P");
    if (!v) return false;
    for (const char *yes : {"1", "yes", "on", "true"})
        if (strcasecmp(v, yes) == 0) return true;
    return false;
}

const char *coll_name(int coll) {
    switch (coll) {
        case FI_ALLREDUCE:
            return "fi_allreduce FI_SUM FI_UINT64";
        case FI_BROADCAST:
            return "fi_broadcast";
        case FI_ALLGATHER:
            return "fi_allgather";
        case FI_REDUCE_SCATTER:
            return "fi_reduce_scatter FI_SUM FI_UINT64";
        case FI_ALLTOALL:
            return "fi_alltoall";
        case FI_GATHER:
            return "fi_gather";
        case FI_SCATTER:
            return "fi_scatter";
        default:
            return "?";
    }
}

// ---- one rank ----------------------------------------------------------------------------------

// A rank of the group of every rank (tests/common/coll_rank.h), reporting to run_roles's pipe,
// with libfabric loaded in its process.
class Rank : public CollRank<Report> {
  public:
    Rank(Report &rep, RankBoard &b, int q)
        : CollRank(rep, libfabric_table<Lib>(), b, q, kRanks, kRankWait) {}

    fi_addr_t group = FI_ADDR_NOTAVAIL;  // fi_mc_addr of the group of every rank

    // The endpoint open, every rank's name inserted (rank q at fi_addr_t q), the group of every
    // rank joined: an AV set of them all, joined through the set's address.
    bool start() {
        if (!CollRank::start(kCaps, kMrMode)) return false;
        fid_av_set *set = range(0, kRanks - 1, 1);
        if (!set) return false;
        const fi_addr_t set_address = set_addr(set);
        if (set_address == FI_ADDR_NOTAVAIL) return false;
        fid_mc *mc = join(set, set_address, "the join");
        if (!mc) return false;
        group = fi_mc_addr(mc);
        return true;
    }

    int set_p2p(int mode) {
        return fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_FI_HMEM_P2P, &mode, sizeof mode);
    }
    int get_p2p(int *mode) {
        size_t len = sizeof *mode;
        return fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_FI_HMEM_P2P, mode, &len);
    }
};

// ---- buffers -----------------------------------------------------------------------------------

// Memory a rank uses: device 0's (moved only with the driver's copies), or the host's.
Memory host_memory() {
    return Memory{};
}

// `elems` FI_UINT64 elements of memory `m`, filled with `init`; device memory is registered
// (FI_HMEM_CUDA, device 0) and passed with its descriptor, host memory with none. At scope end
// the registration is closed, then the memory freed.
class Buffer {
  public:
    Buffer(Rank &k, const Memory &m) : k_(k), m_(m) {}
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    ~Buffer() {
        if (mr_) {
            int ret = fi_close(&mr_->fid);
            if (ret) AP_FAIL(k_.r, "fi_close(MR) -> ", k_.str(ret));
        }
        if (p_) m_.release(p_);
    }
    bool device() const { return m_.iface != FI_HMEM_SYSTEM; }
    void *p() const { return p_; }
    void *desc() const { return mr_ ? fi_mr_desc(mr_) : nullptr; }
    size_t elems() const { return elems_; }

    bool make(const std::vector<uint64_t> &init) {
        elems_ = init.size();
        const size_t len = elems_ * sizeof(uint64_t);
        std::string err = m_.alloc(len, &p_);
        if (!err.empty()) return AP_FAIL(k_.r, "allocating ", len, " B of ", m_.name, ": ", err);
        if (!(err = m_.put(p_, init.data(), len)).empty())
            return AP_FAIL(k_.r, "filling the ", m_.name, " buffer: ", err);
        if (!device()) return true;
        iovec iov{p_, len};
        fi_mr_attr attr{};
        attr.mr_iov = &iov;
        attr.iov_count = 1;
        attr.access = FI_SEND | FI_RECV;
        attr.iface = FI_HMEM_CUDA;
        attr.device.cuda = 0;
        int ret = fi_mr_regattr(k_.domain, &attr, 0, &mr_);
        if (ret) {
            mr_ = nullptr;
            return AP_FAIL(k_.r, "fi_mr_regattr(FI_HMEM_CUDA, ", len, " B) -> ", k_.str(ret));
        }
        return true;
    }
    // The whole buffer, read back (device memory with cuMemcpyDtoH).
    bool read(std::vector<uint64_t> &out) {
        out.assign(elems_, 0);
        std::string err = m_.get(out.data(), p_, elems_ * sizeof(uint64_t));
        return err.empty() ? true : AP_FAIL(k_.r, "reading the ", m_.name, " buffer: ", err);
    }

  private:
    Rank &k_;
    const Memory &m_;
    void *p_ = nullptr;
    size_t elems_ = 0;
    fid_mr *mr_ = nullptr;
};

// ---- the emulated driver's copies --------------------------------------------------------------

// What this process's driver did between reset() and read() (the emulated driver only: with a
// real one there is nothing to count, and `counted` is false).
struct Copies {
    bool counted = false;
    unsigned long long htod_bytes = 0, dtoh_bytes = 0, dtod = 0, ipc_opens = 0;

    static void reset() {
        if (cuda_driver().emulated()) cuda_driver().reset_stats();
    }
    static Copies read() {
        Copies c;
        if (!cuda_driver().emulated()) return c;
        emucuda_stats s{};
        cuda_driver().get_stats(&s);
        c.counted = true;
        c.htod_bytes = s.bytes_htod;
        c.dtoh_bytes = s.bytes_dtoh;
        c.dtod = s.dtod_copies;
        c.ipc_opens = s.ipc_opens;
        return c;
    }
};

// What the ranks' calls staged, summed over a test.
struct Tally {
    int calls = 0;
    unsigned long long from_device = 0, to_device = 0;
};

// ---- one collective ----------------------------------------------------------------------------

struct Call {
    int coll;
    size_t count;
    int root = 0;         // of the rooted ones (fi_broadcast, fi_gather, fi_scatter)
    bool in_dev = true;   // the input (fi_broadcast: its one buffer) in device memory
    bool out_dev = true;  // the result in device memory
};

std::string describe(const Call &c) {
    std::string s = cat(coll_name(c.coll), " count ", c.count);
    if (c.coll == FI_BROADCAST || c.coll == FI_GATHER || c.coll == FI_SCATTER)
        s += cat(" root ", c.root);
    if (c.coll == FI_BROADCAST) return s + cat(" (buffer in ", c.in_dev ? "device" : "host", ")");
    return s + cat(" (input in ", c.in_dev ? "device" : "host", ", result in ",
                   c.out_dev ? "device" : "host", ")");
}

ssize_t issue(Rank &k, const Call &c, Buffer &in, Buffer &out, void *ctx) {
    fid_ep *ep = k.ep;
    const fi_addr_t g = k.group, root = fi_addr_t(c.root);
    switch (c.coll) {
        case FI_ALLREDUCE:
            return fi_allreduce(ep, in.p(), c.count, in.desc(), out.p(), out.desc(), g, FI_UINT64,
                                FI_SUM, 0, ctx);
        case FI_BROADCAST:
            return fi_broadcast(ep, in.p(), c.count, in.desc(), g, root, FI_UINT64, 0, ctx);
        case FI_ALLGATHER:
            return fi_allgather(ep, in.p(), c.count, in.desc(), out.p(), out.desc(), g, FI_UINT64,
                                0, ctx);
        case FI_REDUCE_SCATTER:
            return fi_reduce_scatter(ep, in.p(), c.count, in.desc(), out.p(), out.desc(), g,
                                     FI_UINT64, FI_SUM, 0, ctx);
        case FI_ALLTOALL:
            return fi_alltoall(ep, in.p(), c.count, in.desc(), out.p(), out.desc(), g, FI_UINT64, 0,
                               ctx);
        case FI_GATHER:
            return fi_gather(ep, in.p(), c.count, in.desc(), out.p(), out.desc(), g, root,
                             FI_UINT64, 0, ctx);
        case FI_SCATTER:
            return fi_scatter(ep, in.p(), c.count, in.desc(), out.p(), out.desc(), g, root,
                              FI_UINT64, 0, ctx);
        default:
            return -FI_ENOSYS;
    }
}

// Runs one collective at every rank with its buffers where `c` says; checks the result and,
// under the emulated driver, what was staged. False when the call could not run (the ranks
// cannot go on in step); a wrong result is reported and the ranks go on.
bool collective(Rank &k, const Memory &dev, const Memory &host, const Call &c, Tally &tally) {
    Report &r = k.r;
    const std::string what = describe(c);
    Plan p = plan(fi_collective_op(c.coll), c.count, c.root, kRanks, k.rank,
                  salt_of(c.coll, c.count, c.root));
    const bool bcast = c.coll == FI_BROADCAST;
    Buffer in(k, c.in_dev ? dev : host), out(k, c.out_dev ? dev : host);
    if (!in.make(p.in)) return false;
    if (!bcast && !out.make(p.out)) return false;
    Copies::reset();
    if (!k.run(what, [&](void *ctx) { return issue(k, c, in, out, ctx); })) return false;
    const Copies staged = Copies::read();
    std::vector<uint64_t> got;
    if (!(bcast ? in : out).read(got)) return false;
    RK_EXPECT_EQUAL(k, what, got, p.want);
    const unsigned long long want_from = c.in_dev ? p.reads : 0,
                             want_to = (bcast ? c.in_dev : c.out_dev) ? p.writes : 0;
    if (staged.counted) {
        AP_CHECK(r, staged.dtoh_bytes == want_from, what, ": ", staged.dtoh_bytes,
                 " B copied from the device, expected ", want_from, " (the input the call reads)");
        AP_CHECK(r, staged.htod_bytes == want_to, what, ": ", staged.htod_bytes,
                 " B copied to the device, expected ", want_to, " (the result the call writes)");
        AP_CHECK(r, staged.dtod == 0 && staged.ipc_opens == 0, what, ": ", staged.dtod,
                 " device-to-device copies and ", staged.ipc_opens,
                 " IPC opens: the buffers were not only staged through host memory");
    }
    ++tally.calls;
    tally.from_device += want_from;
    tally.to_device += want_to;
    return true;
}

// ---- running the ranks -------------------------------------------------------------------------

void report(const RunResult &res) {
    for (const auto &n : res.roles) printf("[coll]   %s\n", n.c_str());
    for (const auto &n : res.notes) printf("%s\n", n.c_str());
    for (const auto &f : res.failures) ADD_FAILURE() << f;
}

// Forks kRanks rank processes; each loads libfabric and the driver, makes device 0's context
// current, opens its endpoint, joins the group of every rank and runs `body`, then meets the
// others at a last barrier before closing.
void run_ranks(const std::string &what, const std::function<void(Rank &)> &body) {
    SharedMap<RankBoard> board;
    ASSERT_NE(board.get(), nullptr);
    SharedBlock block;  // run_roles's (none of its fields is used here)
    ASSERT_NE(block.get(), nullptr);
    RankBoard *b = board.get();
    std::vector<RoleDef> roles;
    for (int q = 0; q < kRanks; ++q) {
        auto rank = [b, q, &body](Report &r) {
            Rank k(r, *b, q);
            RK_REQUIRE(k, libfabric_table<Lib>().ok(), "libfabric could not be loaded");
            std::string err = use_device0();
            RK_REQUIRE(k, err.empty(), err);
            RK_TRY(k, k.start());
            body(k);
            if (!k.gave_up()) k.finish();
        };
        roles.push_back({cat("rank ", q), cat("coll-rank-", q), rank, {}});
    }
    printf("[coll] %s, %d ranks, path: %s\n", what.c_str(), kRanks, path_name());
    fflush(stdout);
    RunResult res = run_roles(roles, *block.get(), kDeadline);
    printf("[coll] %.2f s\n", res.seconds);
    report(res);
}

// ---- Staged: device buffers through host memory ------------------------------------------------

// Rank 0 says what was staged, once its counts were checked.
void say_staged(Rank &k, const Tally &t) {
    if (k.rank != 0) return;
    if (cuda_driver().emulated())
        k.r.note(cat("device buffers staged through host memory (emulated driver: host ",
                     "reductions): rank 0's ", t.calls, " collectives copied ", t.from_device,
                     " B from the device before and ", t.to_device,
                     " B to it after, as counted by the driver, none device to device"));
    else
        k.r.note(cat("device buffers staged through host memory (real driver: host reductions; ",
                     "copies not counted): rank 0 ran ", t.calls, " collectives"));
}

TEST(Staged, EveryCollectiveDeviceToDevice) {
    REQUIRE_DEVICE();
    run_ranks("seven collectives, input and result in device memory", [](Rank &k) {
        const Memory dev = device0_memory<Memory>(), host = host_memory();
        Tally t;
        for (size_t count : kCounts) {
            for (Call c :
                 {Call{FI_ALLREDUCE, count}, Call{FI_BROADCAST, count, 1},
                  Call{FI_ALLGATHER, count}, Call{FI_REDUCE_SCATTER, count},
                  Call{FI_ALLTOALL, count}, Call{FI_GATHER, count, 0}, Call{FI_SCATTER, count, 0}})
                RK_TRY(k, collective(k, dev, host, c, t));
        }
        say_staged(k, t);
    });
}

void mixed(Rank &k, bool in_dev, bool out_dev) {
    const Memory dev = device0_memory<Memory>(), host = host_memory();
    Tally t;
    for (size_t count : kCounts) {
        for (int coll : {FI_ALLREDUCE, FI_ALLGATHER}) {
            Call c{coll, count};
            c.in_dev = in_dev;
            c.out_dev = out_dev;
            RK_TRY(k, collective(k, dev, host, c, t));
        }
    }
    say_staged(k, t);
}

TEST(Staged, HostInputDeviceResult) {
    REQUIRE_DEVICE();
    run_ranks("allreduce and allgather, input in host memory, result in device memory",
              [](Rank &k) { mixed(k, false, true); });
}

TEST(Staged, DeviceInputHostResult) {
    REQUIRE_DEVICE();
    run_ranks("allreduce and allgather, input in device memory, result in host memory",
              [](Rank &k) { mixed(k, true, false); });
}

// ---- P2pRequired: staging forbidden ------------------------------------------------------------

// Where fi_setopt(FI_HMEM_P2P_REQUIRED) is refused: no path of the endpoint can move device
// memory peer to peer (the TCP link only stages), or the environment disabled P2P.
bool required_refused() {
    return net_variant() || p2p_disabled_by_env();
}

void p2p_required(Rank &k) {
    Report &r = k.r;
    int before = -1;
    int ret = k.get_p2p(&before);
    RK_REQUIRE(k, ret == 0, "fi_getopt(FI_OPT_FI_HMEM_P2P) -> ", k.str(ret));
    ret = k.set_p2p(FI_HMEM_P2P_REQUIRED);
    if (required_refused()) {
        // This variant's one outcome: the setopt itself is refused, the mode stays.
        AP_CHECK(r, ret == -FI_EOPNOTSUPP, "fi_setopt(FI_HMEM_P2P_REQUIRED) ",
                 net_variant() ? "with FI_TANDEM_LOCAL=0" : "with FI_HMEM_DISABLE_P2P", " -> ",
                 k.str(ret), ", expected -FI_EOPNOTSUPP");
        int after = -1;
        ret = k.get_p2p(&after);
        AP_CHECK(r, ret == 0 && after == before,
                 "FI_OPT_FI_HMEM_P2P after the refused setopt: ", p2p_name(after), " (", k.str(ret),
                 "), before it ", p2p_name(before));
        if (k.rank == 0)
            r.note(cat("fi_setopt(FI_HMEM_P2P_REQUIRED) refused with -FI_EOPNOTSUPP (",
                       net_variant() ? "FI_TANDEM_LOCAL=0: the TCP link only stages"
                                     : "FI_HMEM_DISABLE_P2P",
                       "); the mode stays ", p2p_name(before)));
        return;
    }
    // This variant's one outcome: REQUIRED taken, every collective given a device buffer
    // refused by the call itself.
    RK_REQUIRE(k, ret == 0, "fi_setopt(FI_HMEM_P2P_REQUIRED) on the node-local path -> ",
               k.str(ret));
    int mode = -1;
    ret = k.get_p2p(&mode);
    AP_CHECK(r, ret == 0 && mode == FI_HMEM_P2P_REQUIRED, "FI_OPT_FI_HMEM_P2P after setting ",
             "REQUIRED: ", p2p_name(mode), " (", k.str(ret), ")");
    const Memory dev = device0_memory<Memory>(), host = host_memory();
    const size_t count = 64;
    std::vector<Call> calls;
    for (int coll : {FI_ALLREDUCE, FI_BROADCAST, FI_ALLGATHER, FI_REDUCE_SCATTER, FI_ALLTOALL,
                     FI_GATHER, FI_SCATTER})
        calls.push_back({coll, count, coll == FI_BROADCAST ? 1 : 0});
    calls.push_back({FI_ALLREDUCE, count, 0, false, true});
    calls.push_back({FI_ALLREDUCE, count, 0, true, false});
    int refused = 0;
    for (const Call &c : calls) {
        const std::string what = describe(c) + " under FI_HMEM_P2P_REQUIRED";
        Plan p = plan(fi_collective_op(c.coll), c.count, c.root, kRanks, k.rank,
                      salt_of(c.coll, c.count, c.root));
        Buffer in(k, c.in_dev ? dev : host), out(k, c.out_dev ? dev : host);
        RK_TRY(k, in.make(p.in));
        if (c.coll != FI_BROADCAST) RK_TRY(k, out.make(p.out));
        Copies::reset();
        fi_context2 ctx{};
        const auto t0 = Clock::now();
        const ssize_t got = issue(k, c, in, out, &ctx);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        const Copies staged = Copies::read();
        AP_CHECK(r, got == -FI_EOPNOTSUPP, what, " -> ", k.str(got), ", expected -FI_EOPNOTSUPP");
        if (got == 0) {  // it runs: the ranks are no longer in step
            k.give_up();
            return;
        }
        refused += got == -FI_EOPNOTSUPP;
        AP_CHECK(r, ms < 100, what, ": the call took ", ms, " ms to return");
        if (staged.counted)
            AP_CHECK(r, staged.dtoh_bytes == 0 && staged.htod_bytes == 0, what, ": ",
                     staged.dtoh_bytes, " B copied from the device and ", staged.htod_bytes,
                     " B to it by a refused call");
        RK_TRY(k, k.quiet_for(5, what));
        std::vector<uint64_t> back;
        RK_TRY(k, (c.coll == FI_BROADCAST ? in : out).read(back));
        RK_EXPECT_EQUAL(k, what + ": the buffer the refused call was given", back,
                        c.coll == FI_BROADCAST ? p.in : p.out);
    }
    // Host memory is not affected: the group still runs (every rank in step).
    Tally t;
    for (size_t n : kCounts)
        RK_TRY(k, collective(k, dev, host, {FI_ALLREDUCE, n, 0, false, false}, t));
    if (k.rank == 0)
        r.note(cat("under FI_HMEM_P2P_REQUIRED ", refused, " of ", calls.size(),
                   " collectives given a device buffer returned -FI_EOPNOTSUPP at once, nothing ",
                   "staged or completed; host-memory allreduces still ran"));
}

TEST(P2pRequired, DeviceBufferRefusedAtOnce) {
    REQUIRE_DEVICE();
    run_ranks(required_refused() ? "FI_HMEM_P2P_REQUIRED, refused by fi_setopt here"
                                 : "collectives with device buffers under FI_HMEM_P2P_REQUIRED",
              p2p_required);
}

}  // namespace

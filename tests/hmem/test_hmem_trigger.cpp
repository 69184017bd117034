// fi_trigger(3) with device memory (FI_HMEM, FI_MR_HMEM; buffers registered with fi_mr_regattr
// as FI_HMEM_CUDA) between processes:
//   - Threshold.*: FI_TRIGGER_THRESHOLD operations held until fi_cntr_add moves their counter: a
//     send from device memory into a device receive buffer, an RMA write from host memory into
//     a peer's device region and an RMA read from it; nothing moves before the add.
//   - Xpu.*: FI_TRIGGER_XPU (FI_XPU_TRIGGER endpoints): the shape fi_getopt(FI_OPT_XPU_TRIGGER)
//     gives, tagged sends from device memory started by the device writing the value tandem
//     returned into the trigger variable (cuStreamWriteValue64 on a stream of the test's,
//     never waited for: tandem's progress must see the device's write), in the order queued;
//     the calls refused (another iface, a device that does not exist, an endpoint without
//     FI_XPU_TRIGGER); an endpoint closed with an XPU operation pending (no crash, and under
//     the emulated driver no device allocation left behind).
// Device memory is written and read back only with the driver's cuMemcpyHtoD / cuMemcpyDtoH (the
// emulator's device memory is PROT_NONE: the CPU touching it kills the process, which the test
// then reports with the address).
//
// Black-box as test_hmem_atomic.cpp, on the same role processes (tests/common/atomic_processes.h):
// libfabric and the CUDA driver are loaded with dlopen (tests/common/hmem_driver.h) in the role
// processes only, never in the gtest process. A test runs a receiver (or, for RMA, the shared
// target role with its region in device memory) and a sender; a second shared block carries what
// the receiver got and a "progress a little, then answer" handshake, so that "nothing arrived" is
// said only once the receiver has progressed after the sender's quiet period. ctest variants:
// hmem.emu.trigger.* (the emulated driver, node-local path), hmem.emu_net.trigger.* (the same over
// the TCP link, FI_TANDEM_LOCAL=0), hmem.gpu.trigger.* (the real driver: without a GPU every test
// skips with the reason).
#include "common/fabric_compat.h"
#include "tests/common/atomic_processes.h"
#include "tests/common/hmem_driver.h"
#include "tests/common/shared_map.h"

#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>

#include <gtest/gtest.h>

#include <memory>

namespace {

using namespace tandem_test;
using namespace tandem_test::atomic_procs;

// Device allocations this process holds, as the emulated driver counts them; -1 with a real
// driver (which has no such count).
long long live_device_allocs() {
    if (!cuda_driver().emulated()) return -1;
    emucuda_stats s{};
    cuda_driver().get_stats(&s);
    return static_cast<long long>(s.live_allocs);
}

constexpr uint64_t kCaps = FI_MSG | FI_TAGGED | FI_RMA | FI_SEND | FI_RECV | FI_READ | FI_WRITE |
                           FI_REMOTE_READ | FI_REMOTE_WRITE | FI_HMEM | FI_TRIGGER;
constexpr uint64_t kXpuCaps = kCaps | tandem::compat::kXpuTriggerCap;
constexpr int kMrMode = FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
constexpr uint64_t kTag = 0x7419;
constexpr auto kQuiet = 50ms;  // how long "nothing moves yet" is watched
constexpr auto kDrain = 10ms;  // the receiver's progress after the sender's quiet period

// Device 0's memory is the device memory of every test here.
#define REQUIRE_DEVICE() HMEM_REQUIRE_DEVICE(device_probe<DeviceNeed::kDevice0Context>())

void report(const RunResult &r) {
    for (const auto &n : r.roles) printf("[trigger]   %s\n", n.c_str());
    for (const auto &n : r.notes) printf("%s\n", n.c_str());
    for (const auto &f : r.failures) ADD_FAILURE() << f;
}

std::vector<uint8_t> pattern_bytes(size_t len, uint32_t seed) {
    std::vector<uint8_t> v(len);
    for (size_t i = 0; i < len; ++i) v[i] = pattern(i, seed);
    return v;
}
// "" when got == pattern(seed), else the first differing byte and how many differ.
std::string diff(const uint8_t *got, size_t len, uint32_t seed) {
    for (size_t i = 0; i < len; ++i) {
        if (got[i] == pattern(i, seed)) continue;
        size_t bad = 0;
        for (size_t j = i; j < len; ++j) bad += got[j] != pattern(j, seed);
        return cat("byte ", i, " of ", len, " is ", int(got[i]), ", expected ",
                   int(pattern(i, seed)), " (", bad, " bytes differ)");
    }
    return std::string();
}

// ---- what the receiver tells the sender (a second shared block) --------------------------------

constexpr int kMaxRecvs = 4;
constexpr size_t kMaxMsg = 64 * 1024;

struct Arrival {
    std::atomic<int> done;  // 1 once the fields below are valid
    int err;                // the error completion's err, or 0
    uint64_t len, tag;
    uint8_t data[kMaxMsg];  // the receive buffer, copied out of device memory
};

struct Trig {
    // The sender's "progress a little, then answer" (quiet()), and the receiver's answer.
    std::atomic<uint64_t> sync_seq, sync_ack;
    Arrival arrivals[kMaxRecvs];  // by the receive's index
};

// ---- buffers and the device's writes ------------------------------------------------------------

// As AP_REQUIRE, in a helper that returns false (the failure reported) when cond does not hold.
#define ENSURE(r, cond, ...) ((cond) ? true : AP_FAIL(r, #cond __VA_OPT__(, ": ", ) __VA_ARGS__))

// A buffer of `len` bytes of memory `m`, registered with the access of the operations it serves
// and filled with 0xA5 (as RoleBuf, whose access is fixed); at scope end its registration is
// closed, then the memory freed.
struct Buf {
    const Memory &m;
    void *p = nullptr;
    size_t len = 0;
    fid_mr *mr = nullptr;
    Node *node = nullptr;
    explicit Buf(const Memory &mem) : m(mem) {}
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    ~Buf() {
        if (mr) node->unreg(mr);
        if (p) m.release(p);
    }
    bool make(Report &r, Node &n, size_t bytes, uint64_t access) {
        std::string err = m.alloc(bytes, &p);
        if (!err.empty()) return AP_FAIL(r, "allocating ", bytes, " B of ", m.name, ": ", err);
        len = bytes;
        std::vector<uint8_t> stale(len, 0xA5);
        if (!(err = m.put(p, stale.data(), len)).empty()) return AP_FAIL(r, err);
        node = &n;
        mr = n.reg(p, len, m, access);
        return mr != nullptr;
    }
    // The same, then filled with pattern(seed).
    bool make(Report &r, Node &n, size_t bytes, uint64_t access, uint32_t seed) {
        return make(r, n, bytes, access) && fill(r, seed);
    }
    bool fill(Report &r, uint32_t seed) {
        std::string err = m.put(p, pattern_bytes(len, seed).data(), len);
        return err.empty() ? true : AP_FAIL(r, "filling the ", m.name, " buffer: ", err);
    }
    void *desc() const { return fi_mr_desc(mr); }
};

// The whole of `b` sent (tagged: with `tag`), or written into or read from b.len bytes at `addr`
// of the peer's region of `key`, with FI_TRIGGER: the operation waits for the trigger of `tctx`.
ssize_t triggered_send(Node &n, const Buf &b, fi_addr_t peer, fi_triggered_context *tctx) {
    iovec iov{b.p, b.len};
    void *desc = b.desc();
    fi_msg msg{&iov, &desc, 1, peer, tctx, 0};
    return fi_sendmsg(n.ep, &msg, FI_TRIGGER);
}
ssize_t triggered_tsend(Node &n, const Buf &b, fi_addr_t peer, uint64_t tag,
                        fi_triggered_context *tctx) {
    iovec iov{b.p, b.len};
    void *desc = b.desc();
    fi_msg_tagged msg{&iov, &desc, 1, peer, tag, 0, tctx, 0};
    return fi_tsendmsg(n.ep, &msg, FI_TRIGGER);
}
ssize_t triggered_rma(Node &n, bool write, const Buf &b, fi_addr_t peer, uint64_t addr,
                      uint64_t key, fi_triggered_context *tctx) {
    iovec iov{b.p, b.len};
    void *desc = b.desc();
    fi_rma_iov rma{addr, b.len, key};
    fi_msg_rma msg{&iov, &desc, 1, peer, &rma, 1, tctx, 0};
    return write ? fi_writemsg(n.ep, &msg, FI_TRIGGER) : fi_readmsg(n.ep, &msg, FI_TRIGGER);
}

// A stream of the test's on device 0, on which the device writes trigger variables; at scope end
// it is waited for and destroyed.
class DeviceStream {
  public:
    DeviceStream() = default;
    DeviceStream(const DeviceStream &) = delete;
    DeviceStream &operator=(const DeviceStream &) = delete;
    ~DeviceStream() {
        if (s_) {
            cuda_driver().stream_synchronize(s_);
            cuda_driver().stream_destroy(s_);
        }
    }
    // The device writes the variable's value into its word; not waited for.
    bool write(Report &r, const fi_trigger_var &v) {
        if (!s_) {
            if (CUresult rc = cuda_driver().stream_create(&s_, CU_STREAM_NON_BLOCKING);
                rc != CUDA_SUCCESS)
                return AP_FAIL(r, "cuStreamCreate gives ", rc);
        }
        CUresult rc =
            cuda_driver().stream_write_value64(s_, reinterpret_cast<CUdeviceptr>(v.addr),
                                               v.value.val64, CU_STREAM_WRITE_VALUE_DEFAULT);
        return rc == CUDA_SUCCESS ? true
                                  : AP_FAIL(r, "cuStreamWriteValue64(", v.addr, ", ", v.value.val64,
                                            ") gives ", rc);
    }

  private:
    CUstream s_ = nullptr;
};

// ---- the sender's completions, its peer and its counter -----------------------------------------

// Every completion the sender read, in order, so that a test can ask whether one came without
// waiting, and wait for another later.
class Completions {
  public:
    explicit Completions(Node &n) : n_(n) {}
    void poll() {
        n_.progress();
        Comp c;
        while (n_.take_any(c)) kept_.push_back(c);
    }
    // Progresses for `d`.
    void poll_for(Clock::duration d) {
        const auto until = Clock::now() + d;
        while (Clock::now() < until) {
            poll();
            sched_yield();
        }
    }
    // Progresses until done() (bounded: kWait); false, with the failure `late`, at the deadline.
    template <typename Done>
    bool poll_until(Report &r, Done done, const std::string &late) {
        const auto deadline = Clock::now() + kWait;
        while (!done()) {
            if (Clock::now() > deadline) return AP_FAIL(r, late);
            poll();
            sched_yield();
        }
        return true;
    }
    const Comp *find(const void *ctx) const {
        for (const Comp &c : kept_)
            if (c.ctx() == ctx) return &c;
        return nullptr;
    }
    size_t count() const { return kept_.size(); }
    // The completion of the operation with this context (bounded), progressing meanwhile.
    bool wait(Report &r, const void *ctx, Comp &out, const std::string &what) {
        if (!poll_until(
                r, [&] { return find(ctx) != nullptr; },
                cat("no completion of ", what, " in time")))
            return false;
        out = *find(ctx);
        return true;
    }
    // The first completion read since the start (bounded).
    bool wait_first(Report &r, Comp &out, const std::string &what) {
        if (!poll_until(
                r, [&] { return !kept_.empty(); }, cat("no completion of ", what, " in time")))
            return false;
        out = kept_.front();
        return true;
    }
    Node &node() { return n_; }

  private:
    Node &n_;
    std::vector<Comp> kept_;
};

// A counter of the node's domain, closed at scope end (before the node's domain).
struct Counter {
    fid_cntr *c = nullptr;
    Counter() = default;
    Counter(const Counter &) = delete;
    Counter &operator=(const Counter &) = delete;
    ~Counter() {
        if (c) fi_close(&c->fid);
    }
    bool open(Report &r, Node &n) {
        fi_cntr_attr attr{};
        attr.events = FI_CNTR_EVENTS_COMP;
        attr.wait_obj = FI_WAIT_NONE;
        int ret = fi_cntr_open(n.domain, &attr, &c, nullptr);
        return ret == 0 ? true : AP_FAIL(r, "fi_cntr_open -> ", n.str(ret));
    }
    // The context of an operation that waits until the counter reaches `threshold`.
    fi_triggered_context trigger_at(size_t threshold) const {
        fi_triggered_context t{};
        t.event_type = FI_TRIGGER_THRESHOLD;
        t.trigger.threshold.cntr = c;
        t.trigger.threshold.threshold = threshold;
        return t;
    }
    // fi_cntr_add(1), which starts what waits for threshold 1; then the completion of the
    // operation with context `ctx` (bounded).
    bool add_and_wait(Report &r, Completions &cq, const void *ctx, Comp &out,
                      const std::string &what) {
        Node &n = cq.node();
        int ret = fi_cntr_add(c, 1);
        return ENSURE(r, ret == 0, "fi_cntr_add -> ", n.str(ret)) && cq.wait(r, ctx, out, what);
    }
};

// What a sender works with besides its buffers: its peer (the receiver or the target role, once
// connected) and the completions it read. A test names them with a structured binding.
struct Link {
    fi_addr_t peer = FI_ADDR_UNSPEC;
    Completions cq;
    explicit Link(Node &n) : cq(n) {}
    bool connect(Report &r, Shared &sh) { return connect_to_target(r, sh, cq.node(), &peer); }
};

// The same with a counter of its own, opened (at 0) before connecting, and the context of an
// operation that fi_cntr_add(1) starts (threshold 1).
struct ThresholdLink {
    Counter cntr;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    Completions cq;
    fi_triggered_context tctx{};
    explicit ThresholdLink(Node &n) : cq(n) {}
    bool connect(Report &r, Shared &sh) {
        if (!cntr.open(r, cq.node())) return false;
        tctx = cntr.trigger_at(1);
        return connect_to_target(r, sh, cq.node(), &peer);
    }
};

// The sender progresses for kQuiet, then has the receiver progress for kDrain and answer: what
// the sender's operations sent during the quiet period has reached the receiver's records by
// the time this returns.
bool quiet(Report &r, Completions &cq, Trig &tr) {
    cq.poll_for(kQuiet);
    const uint64_t seq = tr.sync_seq.load() + 1;
    tr.sync_seq.store(seq, std::memory_order_release);
    return cq.poll_until(
        r, [&] { return tr.sync_ack.load(std::memory_order_acquire) == seq; },
        "the receiver did not answer");
}

bool arrived(const Trig &tr, int i) {
    return tr.arrivals[i].done.load(std::memory_order_acquire) != 0;
}

// Receive i of the receiver completes (bounded), the sender progressing meanwhile.
bool wait_arrival(Report &r, Completions &cq, Trig &tr, int i) {
    return cq.poll_until(
        r, [&] { return arrived(tr, i); },
        cat("receive #", i, " did not complete within ",
            std::chrono::duration_cast<std::chrono::seconds>(kWait).count(), " s"));
}

// Receive i completed without error, with `len` bytes of pattern(seed).
void check_arrival(Report &r, Trig &tr, int i, size_t len, uint32_t seed, const char *what) {
    const Arrival &a = tr.arrivals[i];
    AP_REQUIRE(r, a.err == 0, what, ": the receive completed with error ", a.err, " (",
               libfabric_table<Lib>().strerror(a.err), ")");
    AP_REQUIRE(r, a.len == len, what, ": received ", a.len, " bytes, expected ", len);
    std::string d = diff(a.data, len, seed);
    AP_CHECK(r, d.empty(), what, ": the device receive buffer holds other bytes: ", d);
}

// Receive i completes (bounded, the sender progressing meanwhile) without error, with `len` bytes
// of pattern(seed).
void check_received(Report &r, Completions &cq, Trig &tr, int i, size_t len, uint32_t seed,
                    const char *what) {
    AP_TRY(wait_arrival(r, cq, tr, i));
    check_arrival(r, tr, i, len, seed, what);
}

// ---- the roles
// ------------------------------------------------------------------------------------

struct Receiver {
    int count = 1;        // receives posted, each into a device buffer of its own
    size_t len = 64;      // of each
    bool tagged = false;  // fi_trecv of tag kTag + i (else fi_recv)
};

// What every role here does first: libfabric loaded, `dev` initialised (device 0's context
// current), then n's endpoint of `caps` opened (`wait`: a completion queue it can sleep on).
bool start_role(Report &r, Node &n, const Memory &dev, uint64_t caps, bool wait) {
    const Lib &lf = libfabric_table<Lib>();
    if (!ENSURE(r, lf.ok(), "libfabric could not be loaded")) return false;
    std::string err = dev.init();
    return ENSURE(r, err.empty(), err) && n.open(caps, kMrMode, wait);
}

// Opens an endpoint, posts cfg.count receives into device memory, publishes its name (in Shared,
// as the target role does) and progresses until the sender exited: each completion is recorded
// in tr.arrivals with the buffer's bytes; a sender's quiet() is answered after kDrain more of
// progress.
void receiver_role(Report &r, Shared &sh, Trig &tr, const Receiver &cfg) {
    struct Guard {
        Shared &sh;
        ~Guard() {
            if (sh.target_state.load() == 0) sh.target_state.store(-1);
        }
    } guard{sh};
    AP_REQUIRE(r, cfg.count <= kMaxRecvs && cfg.len <= kMaxMsg);
    const Memory dev = device0_memory<Memory>();
    Node n(libfabric_table<Lib>(), r);
    AP_TRY(start_role(r, n, dev, kCaps, true));
    std::vector<std::unique_ptr<Buf>> bufs;
    std::vector<fi_context2> ctx(size_t(cfg.count));
    for (int i = 0; i < cfg.count; ++i) {
        bufs.push_back(std::make_unique<Buf>(dev));
        AP_TRY(bufs.back()->make(r, n, cfg.len, FI_RECV));
        Buf &b = *bufs.back();
        AP_TRY(n.post("posting a receive", [&] {
            return cfg.tagged
                       ? fi_trecv(n.ep, b.p, b.len, b.desc(), FI_ADDR_UNSPEC, kTag + i, 0,
                                  &ctx[size_t(i)])
                       : fi_recv(n.ep, b.p, b.len, b.desc(), FI_ADDR_UNSPEC, &ctx[size_t(i)]);
        }));
    }
    size_t len = sizeof sh.name;
    int ret = fi_getname(&n.ep->fid, sh.name, &len);
    AP_REQUIRE(r, ret == 0, "fi_getname -> ", n.str(ret));
    sh.name_len = static_cast<uint32_t>(len);
    sh.target_state.store(1, std::memory_order_release);

    auto record = [&] {
        Comp c;
        while (n.take_any(c)) {
            int i = 0;
            while (i < cfg.count && c.ctx() != &ctx[size_t(i)]) ++i;
            if (i == cfg.count) {
                AP_FAIL(r, "a completion of no receive at the receiver: ", n.show(c));
                continue;
            }
            Arrival &a = tr.arrivals[i];
            a.err = c.err ? c.ee.err : 0;
            a.len = c.err ? c.ee.len : c.e.len;
            a.tag = c.err ? c.ee.tag : c.e.tag;
            std::string e = dev.get(a.data, bufs[size_t(i)]->p, cfg.len);
            if (!e.empty()) AP_FAIL(r, "reading receive #", i, " back: ", e);
            a.done.store(1, std::memory_order_release);
        }
    };
    uint64_t answered = 0;
    // Until the sender exited. The gtest process's deadline bounds this loop.
    while (!sh.initiators_exited.load(std::memory_order_acquire)) {
        n.progress(2);
        record();
        const uint64_t seq = tr.sync_seq.load(std::memory_order_acquire);
        if (seq != answered) {
            const auto until = Clock::now() + kDrain;
            while (Clock::now() < until) {
                n.progress(1);
                record();
            }
            answered = seq;
            tr.sync_ack.store(seq, std::memory_order_release);
        }
    }
}

// The sender's part, in its process: the device's driver initialised, an endpoint open.
using SenderWork = std::function<void(Report &, Shared &, Trig &, Node &, const Memory &dev)>;
// The role the sender works with (the receiver, or the target role), made for the shared blocks.
using PeerRole = std::function<RoleDef(Shared &, Trig &)>;

// Runs `peer` (none: the sender alone) and a sender doing `work` on an endpoint of `caps`; `what`
// says what it does.
void run_sender(const std::string &what, uint64_t caps, SenderWork work,
                const PeerRole &peer = nullptr) {
    SharedBlock block;
    SharedMap<Trig> trig;
    ASSERT_NE(block.get(), nullptr);
    ASSERT_NE(trig.get(), nullptr);
    Shared &sh = *block.get();
    Trig &tr = *trig.get();
    std::vector<RoleDef> roles;
    if (peer) {
        printf("[trigger] %s, path: %s\n", what.c_str(), path_name());
        roles.push_back(peer(sh, tr));
    } else {
        printf("[trigger] %s\n", what.c_str());
    }
    fflush(stdout);
    roles.push_back({cat("sender (", what, ")"),
                     "trig-sender",
                     [&sh, &tr, caps, work](Report &r) {
                         const Memory dev = device0_memory<Memory>();
                         Node n(libfabric_table<Lib>(), r);
                         AP_TRY(start_role(r, n, dev, caps, false));
                         work(r, sh, tr, n, dev);
                     },
                     {}});
    RunResult r = run_roles(roles, sh, 30s);
    if (peer) printf("[trigger] %.2f s\n", r.seconds);
    report(r);
}

// Runs a receiver and a sender doing `work` on an endpoint of `caps`; `what` says what it does.
void run_pair(const Receiver &rx, uint64_t caps, const std::string &what, SenderWork work) {
    run_sender(what, caps, std::move(work), [rx](Shared &sh, Trig &tr) {
        return RoleDef{
            cat("receiver (", rx.count, " receives into device memory, ", path_name(), ")"),
            "trig-receiver",
            [&sh, &tr, rx](Report &rep) { receiver_role(rep, sh, tr, rx); },
            {}};
    });
}

// Runs one process with an endpoint of `caps` (no peer).
void run_alone(uint64_t caps, const std::string &what, SenderWork work) {
    run_sender(what, caps, std::move(work));
}

// Runs the target role (tests/common/atomic_processes.h) with its region in device memory, and
// an initiator doing `work`.
void run_with_device_target(const std::string &what, SenderWork work) {
    run_sender(what, kCaps, std::move(work), [](Shared &sh, Trig &) {
        TargetConfig t;
        t.lib = lazy_libfabric_table<Lib>();
        t.mem = device0_memory<Memory>();
        t.caps = kCaps;
        t.mr_mode = kMrMode;
        t.sleep = true;
        return RoleDef{cat("target (device memory, ", path_name(), ")"),
                       "trig-target",
                       [t, &sh](Report &rep) { target_role(rep, sh, t); },
                       {}};
    });
}

// ---- Threshold: started by fi_cntr_add --------------------------------------------------------

constexpr size_t kThresholdSendLen = 64 * 1024;

// A send of 64 KiB from device memory with FI_TRIGGER (threshold 1 of a counter at 0): nothing
// reaches the receiver while the sender progresses; fi_cntr_add(1) starts it, and the device
// receive buffer gets the bytes.
void threshold_send(Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev) {
    Buf src(dev);
    AP_TRY(src.make(r, n, kThresholdSendLen, FI_SEND, 0x5e4d));
    ThresholdLink link(n);
    AP_TRY(link.connect(r, sh));
    auto &[cntr, peer, cq, tctx] = link;
    ssize_t ret = triggered_send(n, src, peer, &tctx);
    AP_REQUIRE(r, ret == 0, "fi_sendmsg(FI_TRIGGER) -> ", n.str(ret));
    AP_TRY(quiet(r, cq, tr));
    AP_REQUIRE(r, !arrived(tr, 0), "the message arrived before fi_cntr_add");
    AP_REQUIRE(r, !cq.find(&tctx), "the triggered send completed before fi_cntr_add");
    Comp c;
    AP_TRY(cntr.add_and_wait(r, cq, &tctx, c, "the triggered send"));
    AP_REQUIRE(r, !c.err, "the triggered send: ", n.show(c));
    check_received(r, cq, tr, 0, kThresholdSendLen, 0x5e4d, "the triggered send");
}

TEST(Threshold, SendFromDeviceMemoryWaitsForFiCntrAdd) {
    REQUIRE_DEVICE();
    run_pair({.count = 1, .len = kThresholdSendLen}, kCaps,
             "threshold-triggered send of 64 KiB, device to device", threshold_send);
}

constexpr size_t kRmaLen = 1024;
constexpr uint64_t kWriteOff = 0, kReadOff = 2048;  // in the target's 4 KiB region

// An RMA write of 1 KiB from host memory into the target's device region with FI_TRIGGER: the
// region stays zero while the initiator progresses; fi_cntr_add(1) starts it and the region
// holds the bytes.
void threshold_write(Report &r, Shared &sh, Trig &, Node &n, const Memory &) {
    const Memory host{};
    Buf src(host);
    AP_TRY(src.make(r, n, kRmaLen, FI_WRITE, 0x3417e));
    ThresholdLink link(n);
    AP_TRY(link.connect(r, sh));
    auto &[cntr, peer, cq, tctx] = link;
    ssize_t ret =
        triggered_rma(n, true, src, peer, sh.region_addr + kWriteOff, sh.region_key, &tctx);
    AP_REQUIRE(r, ret == 0, "fi_writemsg(FI_TRIGGER) -> ", n.str(ret));
    cq.poll_for(kQuiet);
    std::vector<uint8_t> got(kRmaLen);
    AP_TRY(target_request(r, sh, kCmdGet, kWriteOff, got.data(), kRmaLen));
    AP_REQUIRE(r, std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == 0; }),
               "the target's region was written before fi_cntr_add");
    AP_REQUIRE(r, !cq.find(&tctx), "the triggered write completed before fi_cntr_add");
    Comp c;
    AP_TRY(cntr.add_and_wait(r, cq, &tctx, c, "the triggered write"));
    AP_REQUIRE(r, !c.err, "the triggered write: ", n.show(c));
    AP_TRY(target_request(r, sh, kCmdGet, kWriteOff, got.data(), kRmaLen));
    std::string d = diff(got.data(), kRmaLen, 0x3417e);
    AP_CHECK(r, d.empty(), "the target's device region after the triggered write: ", d);
}

TEST(Threshold, RmaWriteFromHostIntoPeerDeviceRegion) {
    REQUIRE_DEVICE();
    run_with_device_target("threshold-triggered RMA write of 1 KiB, host to the peer's device",
                           threshold_write);
}

// An RMA read of 1 KiB of the target's device region into host memory with FI_TRIGGER: the host
// buffer keeps its bytes while the initiator progresses; fi_cntr_add(1) starts it and the buffer
// holds the region's bytes.
void threshold_read(Report &r, Shared &sh, Trig &, Node &n, const Memory &) {
    const Memory host{};
    Buf dst(host);
    AP_TRY(dst.make(r, n, kRmaLen, FI_READ));
    ThresholdLink link(n);
    AP_TRY(link.connect(r, sh));
    auto &[cntr, peer, cq, tctx] = link;
    std::vector<uint8_t> region = pattern_bytes(kRmaLen, 0x4ead);
    AP_TRY(target_request(r, sh, kCmdSet, kReadOff, region.data(), kRmaLen));
    ssize_t ret =
        triggered_rma(n, false, dst, peer, sh.region_addr + kReadOff, sh.region_key, &tctx);
    AP_REQUIRE(r, ret == 0, "fi_readmsg(FI_TRIGGER) -> ", n.str(ret));
    cq.poll_for(kQuiet);
    AP_REQUIRE(r, !cq.find(&tctx), "the triggered read completed before fi_cntr_add");
    const auto *p = static_cast<const uint8_t *>(dst.p);
    AP_REQUIRE(r, std::all_of(p, p + kRmaLen, [](uint8_t b) { return b == 0xA5; }),
               "the host buffer was written before fi_cntr_add");
    Comp c;
    AP_TRY(cntr.add_and_wait(r, cq, &tctx, c, "the triggered read"));
    AP_REQUIRE(r, !c.err, "the triggered read: ", n.show(c));
    std::string d = diff(p, kRmaLen, 0x4ead);
    AP_CHECK(r, d.empty(), "the host buffer after the triggered read: ", d);
}

TEST(Threshold, RmaReadFromPeerDeviceRegionIntoHost) {
    REQUIRE_DEVICE();
    run_with_device_target("threshold-triggered RMA read of 1 KiB, the peer's device to host",
                           threshold_read);
}

// ---- Xpu: started by the device's write ---------------------------------------------------------

std::string show(const fi_trigger_var &v) {
    return cat("datatype ", int(v.datatype), ", count ", v.count, ", addr ", v.addr, ", val64 ",
               v.value.val64);
}

// An XPU trigger of (iface, device) with `count` variables at `vars`.
fi_trigger_xpu xpu_trigger(fi_hmem_iface iface, int device, int count, fi_trigger_var *vars) {
    fi_trigger_xpu xpu{};
    xpu.count = count;
    xpu.iface = iface;
    xpu.device.cuda = device;
    xpu.var = vars;
    return xpu;
}

// fi_getopt(FI_OPT_XPU_TRIGGER) of the node's endpoint, with and into `xpu`.
int getopt_xpu(Node &n, fi_trigger_xpu &xpu) {
    size_t len = sizeof xpu;
    return fi_getopt(&n.ep->fid, FI_OPT_ENDPOINT, FI_OPT_XPU_TRIGGER, &xpu, &len);
}

// One XPU-triggered operation: its context and the variable tandem fills in.
struct XpuOp {
    fi_trigger_var var{};
    fi_triggered_context ctx{};
};

// A tagged send of buf with FI_TRIGGER and an XPU trigger of (iface, device).
ssize_t xpu_tsend(Node &n, XpuOp &op, const Buf &buf, fi_addr_t peer, uint64_t tag,
                  fi_hmem_iface iface = FI_HMEM_CUDA, int device = 0) {
    op.var = {};
    op.ctx = {};
    op.ctx.event_type = FI_TRIGGER_XPU;
    op.ctx.trigger.xpu = xpu_trigger(iface, device, 1, &op.var);
    return triggered_tsend(n, buf, peer, tag, &op.ctx);
}

// The variable of an XPU operation that was queued: one 64-bit word in device memory, a value
// to write that the word (zero at first) does not hold yet.
bool check_var(Report &r, const XpuOp &op) {
    const fi_trigger_var &v = op.var;
    if (op.ctx.trigger.xpu.count != 1)
        return AP_FAIL(r, "the XPU trigger's count is ", op.ctx.trigger.xpu.count,
                       " after the call, expected 1");
    if (v.datatype != FI_UINT64 || v.count != 1 || !v.addr || v.value.val64 == 0)
        return AP_FAIL(r, "the trigger variable is not a 64-bit word with a value: ", show(v));
    return true;
}

constexpr size_t kXpuLen = 64;

TEST(Xpu, GetoptGivesOneUint64Variable) {
    REQUIRE_DEVICE();
    run_alone(kXpuCaps, "fi_getopt(FI_OPT_XPU_TRIGGER), CUDA device 0",
              [](Report &r, Shared &, Trig &, Node &n, const Memory &) {
                  fi_trigger_var vars[2]{};
                  vars[1].count = 77;  // must stay as it is: one variable is returned
                  fi_trigger_xpu xpu = xpu_trigger(FI_HMEM_CUDA, 0, 0, vars);
                  int ret = getopt_xpu(n, xpu);
                  AP_REQUIRE(r, ret == 0, "fi_getopt(count 0) -> ", n.str(ret));
                  AP_CHECK(r, xpu.count == 1, "count 0 in: ", xpu.count, " variables out");
                  xpu.count = 2;
                  ret = getopt_xpu(n, xpu);
                  AP_REQUIRE(r, ret == 0, "fi_getopt(count 2) -> ", n.str(ret));
                  AP_CHECK(r, xpu.count == 1, "count 2 in: ", xpu.count, " variables out");
                  AP_CHECK(r, vars[0].datatype == FI_UINT64 && vars[0].count == 1,
                           "the variable: ", show(vars[0]), " (expected FI_UINT64, count 1)");
                  AP_CHECK(r, vars[1].count == 77,
                           "a second variable was written: ", show(vars[1]));
              });
}

TEST(Xpu, GetoptRefusesOtherIfacesAndDevices) {
    REQUIRE_DEVICE();
    run_alone(kXpuCaps, "fi_getopt(FI_OPT_XPU_TRIGGER) of FI_HMEM_SYSTEM and a missing device",
              [](Report &r, Shared &, Trig &, Node &n, const Memory &) {
                  const int devices = cuda_driver().devices;
                  struct Case {
                      fi_hmem_iface iface;
                      int device;
                  } cases[] = {{FI_HMEM_SYSTEM, 0}, {FI_HMEM_CUDA, devices}};
                  for (const Case &c : cases) {
                      fi_trigger_var var{};
                      fi_trigger_xpu xpu = xpu_trigger(c.iface, c.device, 1, &var);
                      int ret = getopt_xpu(n, xpu);
                      AP_CHECK(r, ret == -FI_EOPNOTSUPP, "iface ", int(c.iface), ", device ",
                               c.device, " (of ", devices, "): fi_getopt -> ", n.str(ret),
                               ", expected -FI_EOPNOTSUPP");
                  }
              });
}

// A tagged send of 64 B from device memory with an XPU trigger: it does not reach the receiver
// while the sender progresses; the device writes the value into the variable (on the test's
// stream, not waited for), the sender progresses, and the send completes first, with the
// triggered context, and the bytes arrive.
// host_asleep (FI_PROGRESS_AUTO): after the device's write the sender's host thread sleeps in
// nanosleep, making no libfabric call, until the receiver has the message: tandem's progress
// thread polls the variable (every FI_TANDEM_PROGRESS_POLL_US while XPU work waits).
void xpu_send(Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev, bool host_asleep) {
    Buf src(dev);
    AP_TRY(src.make(r, n, kXpuLen, FI_SEND, 0x8b1));
    Link link(n);
    AP_TRY(link.connect(r, sh));
    auto &[peer, cq] = link;
    XpuOp op;
    ssize_t ret = xpu_tsend(n, op, src, peer, kTag);
    AP_REQUIRE(r, ret == 0, "fi_tsendmsg(FI_TRIGGER, FI_TRIGGER_XPU) -> ", n.str(ret));
    AP_TRY(check_var(r, op));
    AP_TRY(quiet(r, cq, tr));
    AP_REQUIRE(r, !arrived(tr, 0), "the message arrived before the device wrote the variable");
    AP_REQUIRE(r, cq.count() == 0, cq.count(),
               " completion(s) at the sender before the device wrote the variable");
    DeviceStream stream;
    AP_TRY(stream.write(r, op.var));
    if (host_asleep) {
        const auto start = Clock::now();
        while (!arrived(tr, 0) && Clock::now() - start < kWait) {
            timespec nap{0, 50'000};
            nanosleep(&nap, nullptr);
        }
        AP_REQUIRE(r, arrived(tr, 0), "the XPU-triggered send did not arrive while the host slept");
    }
    Comp c;
    AP_TRY(cq.wait_first(r, c, "the XPU-triggered send"));
    AP_REQUIRE(r, c.ctx() == &op.ctx, "the first completion's op_context is ", c.ctx(),
               ", not the triggered context ", static_cast<void *>(&op.ctx));
    AP_REQUIRE(r, !c.err, "the XPU-triggered send: ", n.show(c));
    check_received(r, cq, tr, 0, kXpuLen, 0x8b1, "the XPU-triggered send");
}

TEST(Xpu, TaggedSendStartsWhenTheDeviceWritesTheValue) {
    REQUIRE_DEVICE();
    run_pair({.count = 1, .len = kXpuLen, .tagged = true}, kXpuCaps,
             "XPU-triggered tagged send of 64 B from device memory",
             [](Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev) {
                 xpu_send(r, sh, tr, n, dev, false);
             });
}

TEST(Xpu, AutoProgressStartsTheSendWhileTheHostSleeps) {
    REQUIRE_DEVICE();
    // (The role processes inherit it: both ask for automatic progress.)
    setenv("TANDEM_TEST_PROGRESS", "auto", 1);
    run_pair({.count = 1, .len = kXpuLen, .tagged = true}, kXpuCaps,
             "XPU-triggered tagged send, automatic progress, the sender's host asleep",
             [](Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev) {
                 xpu_send(r, sh, tr, n, dev, true);
             });
    unsetenv("TANDEM_TEST_PROGRESS");
}

// Two XPU-triggered sends (tags kTag, kTag + 1) get one variable and consecutive values; the
// device writing the first value starts the first only, the second value the second.
void xpu_order(Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev) {
    Buf src0(dev), src1(dev);
    AP_TRY(src0.make(r, n, kXpuLen, FI_SEND, 0x0f1) && src1.make(r, n, kXpuLen, FI_SEND, 0x0f2));
    Link link(n);
    AP_TRY(link.connect(r, sh));
    auto &[peer, cq] = link;
    XpuOp op[2];
    ssize_t ret = xpu_tsend(n, op[0], src0, peer, kTag);
    AP_REQUIRE(r, ret == 0, "the first fi_tsendmsg(FI_TRIGGER_XPU) -> ", n.str(ret));
    ret = xpu_tsend(n, op[1], src1, peer, kTag + 1);
    AP_REQUIRE(r, ret == 0, "the second fi_tsendmsg(FI_TRIGGER_XPU) -> ", n.str(ret));
    AP_TRY(check_var(r, op[0]) && check_var(r, op[1]));
    AP_REQUIRE(
        r, op[1].var.addr == op[0].var.addr && op[1].var.value.val64 == op[0].var.value.val64 + 1,
        "the two operations' variables: ", show(op[0].var), " and ", show(op[1].var),
        " (expected one word, values n and n + 1)");
    AP_TRY(quiet(r, cq, tr));
    AP_REQUIRE(r, !arrived(tr, 0) && !arrived(tr, 1), "a message arrived before any device write");
    DeviceStream stream;
    AP_TRY(stream.write(r, op[0].var));
    Comp c;
    AP_TRY(cq.wait(r, &op[0].ctx, c, "the first XPU-triggered send"));
    AP_REQUIRE(r, !c.err, "the first XPU-triggered send: ", n.show(c));
    AP_TRY(wait_arrival(r, cq, tr, 0));
    AP_TRY(quiet(r, cq, tr));
    AP_REQUIRE(r, !arrived(tr, 1), "the second message arrived when the device wrote only ",
               op[0].var.value.val64);
    AP_REQUIRE(r, !cq.find(&op[1].ctx), "the second send completed when the device wrote only ",
               op[0].var.value.val64);
    AP_TRY(stream.write(r, op[1].var));
    AP_TRY(cq.wait(r, &op[1].ctx, c, "the second XPU-triggered send"));
    AP_REQUIRE(r, !c.err, "the second XPU-triggered send: ", n.show(c));
    AP_TRY(wait_arrival(r, cq, tr, 1));
    check_arrival(r, tr, 0, kXpuLen, 0x0f1, "the first XPU-triggered send");
    check_arrival(r, tr, 1, kXpuLen, 0x0f2, "the second XPU-triggered send");
}

TEST(Xpu, TwoSendsStartInOrderEachByItsValue) {
    REQUIRE_DEVICE();
    run_pair({.count = 2, .len = kXpuLen, .tagged = true}, kXpuCaps,
             "two XPU-triggered tagged sends, values written one at a time", xpu_order);
}

// An XPU trigger naming (iface, device) that tandem cannot watch: the send gives -FI_EOPNOTSUPP
// and queues nothing: the endpoint's next XPU operation is its first (value 1), and the refused
// send (tag kTag + 1, which the receiver's second receive waits for) never goes or completes.
void xpu_refused(Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev, fi_hmem_iface iface,
                 int device) {
    Buf src(dev), other(dev);
    AP_TRY(src.make(r, n, kXpuLen, FI_SEND, 0xbad) && other.make(r, n, kXpuLen, FI_SEND, 0x600d));
    Link link(n);
    AP_TRY(link.connect(r, sh));
    auto &[peer, cq] = link;
    XpuOp bad, good;
    ssize_t ret = xpu_tsend(n, bad, src, peer, kTag + 1, iface, device);
    AP_REQUIRE(r, ret == -FI_EOPNOTSUPP, "an XPU trigger of iface ", int(iface), ", device ",
               device, " (the driver has ", cuda_driver().devices, "): fi_tsendmsg -> ", n.str(ret),
               ", expected -FI_EOPNOTSUPP");
    ret = xpu_tsend(n, good, other, peer, kTag);
    AP_REQUIRE(r, ret == 0, "the XPU-triggered send after the refused one -> ", n.str(ret));
    AP_TRY(check_var(r, good));
    AP_REQUIRE(r, good.var.value.val64 == 1, "the first XPU operation queued has value ",
               good.var.value.val64, ", expected 1: the refused call counted");
    DeviceStream stream;
    AP_TRY(stream.write(r, good.var));
    Comp c;
    AP_TRY(cq.wait(r, &good.ctx, c, "the XPU-triggered send after the refused one"));
    AP_TRY(wait_arrival(r, cq, tr, 0));
    AP_TRY(quiet(r, cq, tr));
    AP_CHECK(r, !arrived(tr, 1), "the refused send reached the receiver");
    AP_CHECK(r, !cq.find(&bad.ctx), "the refused send completed");
    AP_CHECK(r, cq.count() == 1, cq.count(), " completions at the sender, expected 1");
    check_arrival(r, tr, 0, kXpuLen, 0x600d, "the XPU-triggered send after the refused one");
}

TEST(Xpu, SystemIfaceIsRefusedAndNothingQueued) {
    REQUIRE_DEVICE();
    run_pair({.count = 2, .len = kXpuLen, .tagged = true}, kXpuCaps,
             "an XPU trigger of FI_HMEM_SYSTEM, then a valid one",
             [](Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev) {
                 xpu_refused(r, sh, tr, n, dev, FI_HMEM_SYSTEM, 0);
             });
}

TEST(Xpu, DeviceBeyondTheCountIsRefusedAndNothingQueued) {
    REQUIRE_DEVICE();
    run_pair({.count = 2, .len = kXpuLen, .tagged = true}, kXpuCaps,
             "an XPU trigger of a CUDA device that does not exist, then a valid one",
             [](Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev) {
                 xpu_refused(r, sh, tr, n, dev, FI_HMEM_CUDA, cuda_driver().devices);
             });
}

// An endpoint opened without FI_XPU_TRIGGER: an XPU-triggered send is -FI_EINVAL. The same send
// with a threshold trigger is taken and delivered (the call was otherwise valid).
void xpu_without_cap(Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev) {
    AP_REQUIRE(r, !(n.info->caps & tandem::compat::kXpuTriggerCap),
               "the endpoint has FI_XPU_TRIGGER though the hints did not ask for it");
    Buf src(dev);
    AP_TRY(src.make(r, n, kXpuLen, FI_SEND, 0xe1a));
    ThresholdLink link(n);
    AP_TRY(link.connect(r, sh));
    auto &[cntr, peer, cq, tctx] = link;
    XpuOp op;
    ssize_t ret = xpu_tsend(n, op, src, peer, kTag);
    AP_REQUIRE(r, ret == -FI_EINVAL, "fi_tsendmsg(FI_TRIGGER_XPU) without FI_XPU_TRIGGER -> ",
               n.str(ret), ", expected -FI_EINVAL");
    ret = triggered_tsend(n, src, peer, kTag, &tctx);
    AP_REQUIRE(r, ret == 0, "the same send with a threshold trigger -> ", n.str(ret));
    Comp c;
    AP_TRY(cntr.add_and_wait(r, cq, &tctx, c, "the threshold-triggered send"));
    AP_TRY(wait_arrival(r, cq, tr, 0));
    AP_CHECK(r, !cq.find(&op.ctx), "the refused XPU-triggered send completed");
    check_arrival(r, tr, 0, kXpuLen, 0xe1a, "the threshold-triggered send");
}

TEST(Xpu, EndpointWithoutXpuTriggerGivesEinval) {
    REQUIRE_DEVICE();
    run_pair({.count = 1, .len = kXpuLen, .tagged = true}, kCaps,
             "an XPU-triggered send on an endpoint without FI_XPU_TRIGGER", xpu_without_cap);
}

// An endpoint closed while an XPU-triggered send waits (a read of its variable under way): the
// close succeeds without a report of the send, nothing reaches the receiver, and under the
// emulated driver the endpoint's trigger variable is freed with it and nothing of the device's
// memory is left once everything is closed.
void xpu_close_pending(Report &r, Shared &sh, Trig &tr, Node &n, const Memory &dev) {
    const long long at_start = live_device_allocs();
    {
        Buf src(dev);
        AP_TRY(src.make(r, n, kXpuLen, FI_SEND, 0xc105e));
        Link link(n);
        AP_TRY(link.connect(r, sh));
        auto &[peer, cq] = link;
        const long long before = live_device_allocs();
        XpuOp op;
        ssize_t ret = xpu_tsend(n, op, src, peer, kTag);
        AP_REQUIRE(r, ret == 0, "fi_tsendmsg(FI_TRIGGER_XPU) -> ", n.str(ret));
        AP_TRY(check_var(r, op));
        const auto until = Clock::now() + 20ms;
        while (Clock::now() < until) cq.poll();
        const long long pending = live_device_allocs();
        int cret = fi_close(&n.ep->fid);
        n.ep = nullptr;
        AP_REQUIRE(r, cret == 0, "fi_close(endpoint) with an XPU-triggered send pending -> ",
                   n.str(cret));
        const long long after = live_device_allocs();
        r.note(cat("device allocations: ", before, " before the XPU send, ", pending,
                   " with it pending, ", after, " after the endpoint closed"));
        AP_TRY(quiet(r, cq, tr));
        AP_CHECK(r, !cq.find(&op.ctx),
                 "the discarded send was reported: ", n.show(*cq.find(&op.ctx)));
        AP_CHECK(r, !arrived(tr, 0), "the discarded send reached the receiver");
        if (after >= 0)
            AP_CHECK(r, after == before, after - before,
                     " device allocation(s) of the closed endpoint left (its trigger variable)");
    }
    n.close();
    const long long at_end = live_device_allocs();
    if (at_end >= 0)
        AP_CHECK(r, at_end == at_start, "after closing everything the process holds ", at_end,
                 " device allocations, ", at_start, " at the start");
}

TEST(Xpu, ClosingTheEndpointWithAPendingOpLeaksNothing) {
    REQUIRE_DEVICE();
    run_pair({.count = 1, .len = kXpuLen, .tagged = true}, kXpuCaps,
             "closing an endpoint with an XPU-triggered send pending", xpu_close_pending);
}

}  // namespace

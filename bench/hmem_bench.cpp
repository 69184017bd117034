// hmem_bench: GPU-memory transfers through tandem, under each FI_OPT_FI_HMEM_P2P policy.
//
//   hmem_bench [-n ITERS] [-s SIZE,SIZE,...]
//   hmem_bench --xpu [-n ITERS] [--nap-us US]
//
// Two processes (forked, joined by a socketpair for addresses only) each allocate device
// memory with the CUDA driver API (loaded at run time) and ping-pong tagged messages between
// device buffers through tandem: node-local (off_tandem: IPC handles and the device's copy
// engine, or staging through shared-memory cells) and, with FI_TANDEM_LOCAL=0 in the
// environment, over the TCP link (staged through host bounce buffers). It also times host<->
// device copies of the driver alone, the floor of every staged transfer.
//
// Where libcuda.so.1 is the emulated driver of the tests (it exports emucuda_get_stats), the
// table says so: its "device" is host memory behind a copy routine, so the figures say
// nothing about a GPU; they show what tandem's own paths cost and which mechanism ran.
//
// --xpu (one process, no fork): how soon an XPU-triggered send (FI_TRIGGER_XPU) starts once a
// stream of the device writes its trigger variable (cuStreamWriteValue64) while the sender's
// host thread sleeps, making no libfabric call: under FI_PROGRESS_AUTO tandem's progress thread
// reads the variable every FI_TANDEM_PROGRESS_POLL_US and starts the send; under
// FI_PROGRESS_MANUAL nothing can start it until the host calls in again (shown for contrast,
// with a bounded wait). The send goes from device memory to a second endpoint of the same
// domain, into host memory that the sleeping thread reads to see the arrival.
#include "common/fabric_compat.h"
#include "hmem/cuda_abi.h"
#include "tests/emucuda/emucuda_control.h"  // (only looked up: absent from a real driver)

#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>
#include <getopt.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char *what, long err) {
    fprintf(stderr, "hmem_bench: %s: %ld (%s)\n", what, err,
            err < 0 ? fi_strerror(int(-err)) : "CUDA error");
    exit(1);
}

struct Driver : tandem::hmem::CudaDriverCalls {
    bool emulated = false;
    void *lib = nullptr;
    const char *load() {
        lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!lib) return "no CUDA driver (libcuda.so.1 not found)";
        if (!resolve(lib)) return "the CUDA driver lacks calls tandem uses";
        emulated = dlsym(lib, "emucuda_get_stats") != nullptr;
        int count = 0;
        CUdevice dev;
        CUcontext ctx;
        if (init(0) || device_get_count(&count) || count == 0) return "no CUDA device";
        if (device_get(&dev, 0) || primary_ctx_retain(&ctx, dev) || ctx_set_current(ctx))
            return "CUDA context failed";
        return nullptr;
    }
    // Device-to-device copies (a receiver copying out of a peer's IPC mapping) and
    // host<->device copies so far (emulated driver only).
    void mechanism(unsigned long long &opens, unsigned long long &staged) {
        auto *get = reinterpret_cast<decltype(&emucuda_get_stats)>(dlsym(lib, "emucuda_get_stats"));
        if (!get) return;
        emucuda_stats s{};
        get(&s);
        opens = s.dtod_copies;
        staged = s.htod_copies + s.dtoh_copies;
    }
};

Driver cu;

struct Side {
    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_cq *cq = nullptr;
    fid_av *av = nullptr;
    fid_ep *ep = nullptr;
    fid_mr *mr = nullptr;
    void *desc = nullptr;
    CUdeviceptr buf = 0;
    fi_addr_t peer = 0;

    int open(size_t max_size, int policy) {
        fi_info *hints = fi_allocinfo();
        hints->caps = FI_TAGGED | FI_HMEM;
        hints->ep_attr->type = FI_EP_RDM;
        hints->domain_attr->mr_mode =
            FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_LOCAL;
        hints->fabric_attr->prov_name = strdup("tandem");
        hints->addr_format = FI_SOCKADDR_IN;
        fi_info *list = nullptr;
        long ret = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &list);
        fi_freeinfo(hints);
        if (ret) die("fi_getinfo (FI_HMEM)", ret);
        // tandem itself, not a utility provider layered over it ("tandem;ofi_rxm").
        for (fi_info *i = list; i && !info; i = i->next)
            if (!strcmp(i->fabric_attr->prov_name, "tandem")) info = fi_dupinfo(i);
        fi_freeinfo(list);
        if (!info) die("no tandem FI_HMEM endpoint", -FI_ENODATA);
        if ((ret = fi_fabric(info->fabric_attr, &fabric, nullptr))) die("fi_fabric", ret);
        if ((ret = fi_domain(fabric, info, &domain, nullptr))) die("fi_domain", ret);
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        if ((ret = fi_cq_open(domain, &cq_attr, &cq, nullptr))) die("fi_cq_open", ret);
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        if ((ret = fi_av_open(domain, &av_attr, &av, nullptr))) die("fi_av_open", ret);
        if ((ret = fi_endpoint(domain, info, &ep, nullptr))) die("fi_endpoint", ret);
        fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
        fi_ep_bind(ep, &av->fid, 0);
        int set = fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_FI_HMEM_P2P, &policy, sizeof policy);
        if (set) {  // this policy cannot be met on this path
            if (getenv("HMEM_BENCH_DEBUG")) fprintf(stderr, "setopt: %d\n", set);
            return set;
        }
        if ((ret = fi_enable(ep))) die("fi_enable", ret);
        if ((ret = cu.mem_alloc(&buf, max_size))) die("cuMemAlloc", ret);
        std::vector<uint8_t> init(max_size, 0x5a);
        cu.memcpy_htod(buf, init.data(), max_size);
        iovec iov{reinterpret_cast<void *>(buf), max_size};
        fi_mr_attr attr{};
        attr.mr_iov = &iov;
        attr.iov_count = 1;
        attr.access = FI_SEND | FI_RECV;
        attr.iface = FI_HMEM_CUDA;
        attr.device.cuda = 0;
        if ((ret = fi_mr_regattr(domain, &attr, 0, &mr))) die("fi_mr_regattr (CUDA)", ret);
        desc = fi_mr_desc(mr);
        return 0;
    }
    void close() {
        if (mr) fi_close(&mr->fid);
        if (ep) fi_close(&ep->fid);
        if (av) fi_close(&av->fid);
        if (cq) fi_close(&cq->fid);
        if (domain) fi_close(&domain->fid);
        if (fabric) fi_close(&fabric->fid);
        if (buf) cu.mem_free(buf);
        if (info) fi_freeinfo(info);
        *this = Side{};
    }
    void wait_one() {
        fi_cq_tagged_entry e;
        auto deadline = Clock::now() + std::chrono::seconds(20);
        for (;;) {
            ssize_t n = fi_cq_read(cq, &e, 1);
            if (n == 1) return;
            if (n == -FI_EAVAIL) {
                fi_cq_err_entry err{};
                fi_cq_readerr(cq, &err, 0);
                die("transfer failed", -long(err.err));
            }
            if (Clock::now() > deadline) die("timed out", -FI_ETIMEDOUT);
        }
    }
    void send(size_t len) {
        ssize_t ret;
        while ((ret = fi_tsend(ep, reinterpret_cast<void *>(buf), len, desc, peer, 1, nullptr)) ==
               -FI_EAGAIN)
            fi_cq_read(cq, nullptr, 0);
        if (ret) die("fi_tsend", ret);
        wait_one();
    }
    void recv(size_t len) {
        ssize_t ret = fi_trecv(ep, reinterpret_cast<void *>(buf), len, desc, peer, 1, 0, nullptr);
        if (ret) die("fi_trecv", ret);
        wait_one();
    }
};

// Swap endpoint names over the control socket and insert the peer's.
void exchange(int sock, Side &s) {
    char name[64];
    size_t len = sizeof name;
    if (fi_getname(&s.ep->fid, name, &len)) die("fi_getname", -1);
    char peer[64];
    if (write(sock, &len, sizeof len) != sizeof len || write(sock, name, len) != ssize_t(len))
        die("control write", -1);
    size_t plen = 0;
    if (read(sock, &plen, sizeof plen) != sizeof plen || plen > sizeof peer ||
        read(sock, peer, plen) != ssize_t(plen))
        die("control read", -1);
    if (fi_av_insert(s.av, peer, 1, &s.peer, 0, nullptr) != 1) die("fi_av_insert", -1);
}

void sync_byte(int sock) {
    char b = 1;
    if (write(sock, &b, 1) != 1 || read(sock, &b, 1) != 1) die("control sync", -1);
}

const char *policy_name(int p) {
    switch (p) {
        case FI_HMEM_P2P_ENABLED:
            return "ENABLED";
        case FI_HMEM_P2P_PREFERRED:
            return "PREFERRED";
        case FI_HMEM_P2P_REQUIRED:
            return "REQUIRED";
        default:
            return "DISABLED";
    }
}

// ---- --xpu: a triggered send that the device starts while the host sleeps ------------------

constexpr size_t kXpuLen = 64;
constexpr uint64_t kXpuTag = 0x7419;
constexpr auto kXpuBound = std::chrono::seconds(1);  // per auto iteration: the bench never hangs
constexpr auto kManualBound = std::chrono::milliseconds(100);
constexpr int kManualIters = 5;  // each one waits the whole bound
constexpr double kTargetUs = 50;
// The sleeping host's nap between looks at the receive buffer, which bounds how late an arrival
// is seen. Not 5 us: on two shared, loaded cores naps that short made the progress thread's
// timed wake-ups ~3 ms late (median 3.1 ms at 5 us naps against 60-90 us at 15-20 us naps),
// so the observer would measure itself.
constexpr long kNapUs = 20;

// Sleeps the calling thread for `us` microseconds. The thread's timer slack is 1 ns (xpu_main),
// else every nap would last 50 us more and hide the latency being measured.
void nap_us(long us) {
    timespec t{us / 1000000, us % 1000000 * 1000};
    nanosleep(&t, nullptr);
}

// One domain of the given progress model with two endpoints: `tx` sends from a device buffer
// with XPU triggers, `rx` receives into host memory. The host's sleeping thread observes an
// arrival by reading the receive buffer itself, never by a libfabric call (which would progress
// the domain in manual mode and so measure the host, not the progress thread).
struct XpuPair {
    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_cq *tx_cq = nullptr, *rx_cq = nullptr;
    fid_av *av = nullptr;
    fid_ep *tx = nullptr, *rx = nullptr;
    fid_mr *mr = nullptr;
    CUdeviceptr src = 0;
    CUstream stream = nullptr;
    fi_addr_t rx_addr = 0;
    alignas(64) uint8_t rbuf[kXpuLen];
    uint8_t pattern[kXpuLen];

    void open(fi_progress progress) {
        fi_info *hints = fi_allocinfo();
        hints->caps = FI_MSG | FI_TAGGED | FI_HMEM | FI_TRIGGER | tandem::compat::kXpuTriggerCap;
        hints->ep_attr->type = FI_EP_RDM;
        hints->domain_attr->mr_mode =
            FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
        hints->domain_attr->control_progress = progress;
        hints->domain_attr->data_progress = progress;
        hints->fabric_attr->prov_name = strdup("tandem");
        hints->addr_format = FI_SOCKADDR_IN;
        fi_info *list = nullptr;
        long ret = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &list);
        fi_freeinfo(hints);
        if (ret) die("fi_getinfo (FI_HMEM, FI_TRIGGER, FI_XPU_TRIGGER)", ret);
        for (fi_info *i = list; i && !info; i = i->next)
            if (!strcmp(i->fabric_attr->prov_name, "tandem")) info = fi_dupinfo(i);
        fi_freeinfo(list);
        if (!info) die("no tandem endpoint with XPU triggers", -FI_ENODATA);
        // The comparison means nothing unless the domain runs the model asked for.
        if (info->domain_attr->data_progress != progress)
            die("fi_getinfo: the progress model asked for", -FI_ENODATA);
        if ((ret = fi_fabric(info->fabric_attr, &fabric, nullptr))) die("fi_fabric", ret);
        if ((ret = fi_domain(fabric, info, &domain, nullptr))) die("fi_domain", ret);
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        if ((ret = fi_cq_open(domain, &cq_attr, &tx_cq, nullptr))) die("fi_cq_open", ret);
        if ((ret = fi_cq_open(domain, &cq_attr, &rx_cq, nullptr))) die("fi_cq_open", ret);
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        if ((ret = fi_av_open(domain, &av_attr, &av, nullptr))) die("fi_av_open", ret);
        for (auto [ep, cq] : {std::pair{&tx, tx_cq}, std::pair{&rx, rx_cq}}) {
            if ((ret = fi_endpoint(domain, info, ep, nullptr))) die("fi_endpoint", ret);
            fi_ep_bind(*ep, &cq->fid, FI_TRANSMIT | FI_RECV);
            fi_ep_bind(*ep, &av->fid, 0);
            if ((ret = fi_enable(*ep))) die("fi_enable", ret);
        }
        char name[64];
        size_t len = sizeof name;
        if ((ret = fi_getname(&rx->fid, name, &len))) die("fi_getname", ret);
        if (fi_av_insert(av, name, 1, &rx_addr, 0, nullptr) != 1) die("fi_av_insert", -1);
        // Every 64-bit word of the payload is non-zero: the zeroed receive buffer tells
        // "arrived" from "not yet" by content alone.
        for (size_t k = 0; k < kXpuLen; ++k) pattern[k] = uint8_t(0x80 | k);
        if ((ret = cu.mem_alloc(&src, kXpuLen))) die("cuMemAlloc", ret);
        if ((ret = cu.memcpy_htod(src, pattern, kXpuLen))) die("cuMemcpyHtoD", ret);
        iovec iov{reinterpret_cast<void *>(src), kXpuLen};
        fi_mr_attr attr{};
        attr.mr_iov = &iov;
        attr.iov_count = 1;
        attr.access = FI_SEND;
        attr.iface = FI_HMEM_CUDA;
        attr.device.cuda = 0;
        if ((ret = fi_mr_regattr(domain, &attr, 0, &mr))) die("fi_mr_regattr (CUDA)", ret);
        // Non-blocking: the write must not wait for the legacy null stream, which tandem's own
        // copies may use.
        if ((ret = cu.stream_create(&stream, CU_STREAM_NON_BLOCKING))) die("cuStreamCreate", ret);
    }
    void close() {
        if (stream) {
            cu.stream_synchronize(stream);
            cu.stream_destroy(stream);
        }
        if (mr) fi_close(&mr->fid);
        if (tx) fi_close(&tx->fid);
        if (rx) fi_close(&rx->fid);
        if (av) fi_close(&av->fid);
        if (tx_cq) fi_close(&tx_cq->fid);
        if (rx_cq) fi_close(&rx_cq->fid);
        if (domain) fi_close(&domain->fid);
        if (fabric) fi_close(&fabric->fid);
        if (src) cu.mem_free(src);
        if (info) fi_freeinfo(info);
    }

    // Whether the whole message is in the receive buffer. The provider writes the buffer from
    // another thread (tandem-progress) while this one reads it: atomic loads, word by word.
    bool arrived() const {
        for (size_t k = 0; k < kXpuLen; k += 8) {
            uint64_t got =
                __atomic_load_n(reinterpret_cast<const uint64_t *>(rbuf + k), __ATOMIC_ACQUIRE);
            uint64_t want;
            memcpy(&want, pattern + k, 8);
            if (got != want) return false;
        }
        return true;
    }
    void post_recv(void *ctx) {
        memset(rbuf, 0, sizeof rbuf);
        ssize_t ret = fi_trecv(rx, rbuf, kXpuLen, nullptr, FI_ADDR_UNSPEC, kXpuTag, 0, ctx);
        if (ret) die("fi_trecv", ret);
    }
    // Reads the CQ until the completion of `ctx` (polling both CQs: in manual mode this is
    // what progresses the domain), within a second.
    void wait_completion(fid_cq *cq, void *ctx, const char *what) {
        auto deadline = Clock::now() + kXpuBound;
        for (;;) {
            fi_cq_tagged_entry e;
            ssize_t n = fi_cq_read(cq, &e, 1);
            if (n == 1) {
                if (e.op_context != ctx) die(what, -FI_EOTHER);
                return;
            }
            if (n == -FI_EAVAIL) {
                fi_cq_err_entry err{};
                fi_cq_readerr(cq, &err, 0);
                die(what, -long(err.err));
            }
            fi_cq_read(cq == tx_cq ? rx_cq : tx_cq, nullptr, 0);
            if (Clock::now() > deadline) die(what, -FI_ETIMEDOUT);
        }
    }
    // An untriggered send and its receive, to make the connection before anything is timed.
    void warm_up() {
        char rctx, sctx;
        post_recv(&rctx);
        ssize_t ret;
        void *desc = fi_mr_desc(mr);
        while ((ret = fi_tsend(tx, reinterpret_cast<void *>(src), kXpuLen, desc, rx_addr, kXpuTag,
                               &sctx)) == -FI_EAGAIN)
            fi_cq_read(tx_cq, nullptr, 0);
        if (ret) die("fi_tsend (warm-up)", ret);
        wait_completion(tx_cq, &sctx, "warm-up send");
        wait_completion(rx_cq, &rctx, "warm-up receive");
        if (!arrived()) die("warm-up: wrong payload", -FI_EOTHER);
    }

    struct Outcome {
        bool fired;      // arrived while the host slept, within the bound
        double us;       // from the start (the device's write, or fi_tsend) until seen arrived
        double lo_us;    // ... until the last look that saw nothing: the arrival lies between
        double wake_us;  // not fired: from the host's first libfabric call until arrival
    };
    // One send of the device buffer while this thread sleeps in naps of `nap` us, making no
    // libfabric call, for at most `bound`; then the completions are read (which, in manual
    // mode, is what starts it). triggered: an XPU-triggered send, queued and left alone 200 us
    // (it must not start), timed from cuStreamWriteValue64 issued; otherwise a plain fi_tsend,
    // timed from the call, for reference: the transfer without the trigger.
    Outcome once(bool triggered, std::chrono::microseconds bound, long nap) {
        char rctx, sctx;
        post_recv(&rctx);
        fi_trigger_var var{};
        fi_triggered_context tctx{};
        tctx.event_type = FI_TRIGGER_XPU;
        tctx.trigger.xpu.count = 1;
        tctx.trigger.xpu.iface = FI_HMEM_CUDA;
        tctx.trigger.xpu.device.cuda = 0;
        tctx.trigger.xpu.var = &var;
        iovec iov{reinterpret_cast<void *>(src), kXpuLen};
        void *desc = fi_mr_desc(mr);
        void *ctx = triggered ? static_cast<void *>(&tctx) : &sctx;
        fi_msg_tagged msg{&iov, &desc, 1, rx_addr, kXpuTag, 0, ctx, 0};
        // The progress thread settles into its sleep (timed polling while the variable waits),
        // as it would while a kernel runs.
        auto settle = [&] {
            for (int i = 0; i < 200 / nap + 1; ++i) nap_us(nap);
        };
        Outcome out{};
        auto t0 = Clock::now();
        if (triggered) {
            ssize_t ret = fi_tsendmsg(tx, &msg, FI_TRIGGER);
            if (ret) die("fi_tsendmsg (FI_TRIGGER, FI_TRIGGER_XPU)", ret);
            if (tctx.trigger.xpu.count != 1 || var.datatype != FI_UINT64 || !var.addr ||
                !var.value.val64)
                die("the trigger variable tandem returned", -FI_EOTHER);
            settle();
            if (arrived()) die("the send started before the device wrote its variable", -FI_EOTHER);
            t0 = Clock::now();
            CUresult rc = cu.stream_write_value64(stream, reinterpret_cast<CUdeviceptr>(var.addr),
                                                  var.value.val64, CU_STREAM_WRITE_VALUE_DEFAULT);
            if (rc) die("cuStreamWriteValue64", rc);
        } else {
            settle();
            t0 = Clock::now();
            ssize_t ret = fi_tsendmsg(tx, &msg, 0);
            if (ret) die("fi_tsendmsg", ret);
        }
        // A look that sees nothing began before the arrival; one that sees it ended after.
        auto lo = t0, t = t0;
        for (;;) {
            const auto look = Clock::now();
            if ((out.fired = arrived())) {
                t = Clock::now();
                break;
            }
            lo = look;
            if (look - t0 >= bound) break;
            nap_us(nap);
        }
        out.us = std::chrono::duration<double, std::micro>(t - t0).count();
        out.lo_us = std::chrono::duration<double, std::micro>(lo - t0).count();
        if (!out.fired) {
            const auto c0 = Clock::now();
            while (!arrived() && Clock::now() - c0 < kXpuBound) {
                fi_cq_read(tx_cq, nullptr, 0);
                fi_cq_read(rx_cq, nullptr, 0);
            }
            if (!arrived()) die("the send never arrived", -FI_ETIMEDOUT);
            out.wake_us = std::chrono::duration<double, std::micro>(Clock::now() - c0).count();
        }
        wait_completion(tx_cq, ctx, "the send");
        wait_completion(rx_cq, &rctx, "its receive");
        return out;
    }
};

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double> &v, double p) {
    size_t rank = size_t(std::ceil(p / 100 * v.size()));
    return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

// One row of the table: `iters` sends of the kind asked, each bounded; 0 when every one
// arrived while the host slept.
int xpu_row(XpuPair &p, const char *progress, const char *send, bool triggered, int iters,
            std::chrono::microseconds bound, long nap, bool target) {
    std::vector<double> us, lo, wake;
    for (int i = 0; i < iters; ++i) {
        auto o = p.once(triggered, bound, nap);
        if (o.fired) {
            us.push_back(o.us);
            lo.push_back(o.lo_us);
        } else {
            wake.push_back(o.wake_us);
        }
    }
    std::sort(us.begin(), us.end());
    std::sort(lo.begin(), lo.end());
    std::sort(wake.begin(), wake.end());
    printf("%-8s %-9s %6d ", progress, send, iters);
    if (us.empty())
        printf("%10s %10s %10s %10s  ", "-", "-", "-", "-");
    else
        printf("%10.1f %10.1f %10.1f %10.1f  ", percentile(us, 50), percentile(us, 90), us.back(),
               percentile(lo, 50));
    const long ms = long(std::chrono::duration_cast<std::chrono::milliseconds>(bound).count());
    if (!wake.empty())
        printf(
            "%s within %ld ms while the host slept (%zu of %d); then %.1f us (median) after "
            "the host's next fi_cq_read",
            us.empty() ? "does not fire" : "some did not fire", ms, wake.size(), iters,
            percentile(wake, 50));
    else if (target)
        printf("%s the target (p90)", percentile(us, 90) <= kTargetUs ? "meets" : "MISSES");
    else
        printf("(reference)");
    printf("\n");
    fflush(stdout);
    return wake.empty() ? 0 : 1;
}

int xpu_main(int iters, long nap) {
    iters = std::max(iters, 1);
    if (const char *why = cu.load()) {
        printf("hmem_bench --xpu: SKIPPED: %s\n", why);
        return 0;
    }
    // nanosleep's default slack (50 us) would dwarf what is measured.
    prctl(PR_SET_TIMERSLACK, 1UL);
    const char *local = getenv("FI_TANDEM_LOCAL");
    const bool net = local && !strcmp(local, "0");
    const char *poll = getenv("FI_TANDEM_PROGRESS_POLL_US");
    printf("# hmem_bench --xpu: XPU-triggered tagged send of %zu B from device memory, %s path\n",
           kXpuLen, net ? "network (TCP link, FI_TANDEM_LOCAL=0)" : "node-local (off_tandem)");
    printf(
        "# time from cuStreamWriteValue64 issued (non-blocking stream) until the message is in "
        "the\n# receiver's host buffer (an endpoint of the same domain); the sender's host thread "
        "sleeps\n# in nanosleep (%ld us naps, --nap-us) and makes no libfabric call meanwhile; "
        "tandem-progress\n# polls the variable every %s us (FI_TANDEM_PROGRESS_POLL_US). "
        "'untrig' rows: a plain fi_tsend,\n# timed from the call, the transfer without the "
        "trigger\n",
        nap, poll ? poll : "10");
    // What a nap really lasts here: how late an arrival may be seen.
    std::vector<double> naps;
    for (int i = 0; i < 100; ++i) {
        auto t = Clock::now();
        nap_us(nap);
        naps.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
    }
    std::sort(naps.begin(), naps.end());
    printf(
        "# a %ld us nap lasts %.1f us (median), %.1f (p90): arrivals are seen up to that late;\n"
        "# lo_med_us: the median time of the last look that still saw nothing\n",
        nap, percentile(naps, 50), percentile(naps, 90));
    if (cu.emulated)
        printf(
            "# EMULATED CUDA driver: the device's write is a store inside cuStreamWriteValue64; "
            "these\n# figures say nothing about a GPU.\n");
    printf("# target: fires within %.0f us of the write%s\n", kTargetUs,
           cu.emulated ? " (emulated driver)" : "");
    printf("%-8s %-9s %6s %10s %10s %10s %10s  %s\n", "progress", "send", "iters", "median_us",
           "p90_us", "max_us", "lo_med_us", "result");
    int status = 0;
    {
        XpuPair p;
        p.open(FI_PROGRESS_AUTO);
        p.warm_up();
        for (int i = 0; i < 2; ++i) p.once(true, kXpuBound, nap);  // the variable's first use
        status |= xpu_row(p, "auto", "xpu", true, iters, kXpuBound, nap, true);
        status |= xpu_row(p, "auto", "untrig", false, iters, kXpuBound, nap, false);
        p.close();
    }
    {
        XpuPair p;
        p.open(FI_PROGRESS_MANUAL);
        p.warm_up();
        // Expected not to fire: its bounded wait is the whole point, and nothing is wrong.
        xpu_row(p, "manual", "xpu", true, kManualIters, kManualBound, nap, false);
        p.close();
    }
    return status;
}

}  // namespace

int main(int argc, char **argv) {
    int iters = 200;
    std::vector<size_t> sizes = {8, 4096, 65536, 1 << 20, 4 << 20};
    bool xpu = false;
    long nap = kNapUs;
    const option longopts[] = {
        {"xpu", no_argument, nullptr, 'x'}, {"nap-us", required_argument, nullptr, 'N'}, {}};
    for (int c; (c = getopt_long(argc, argv, "n:s:h", longopts, nullptr)) != -1;) {
        if (c == 'x')
            xpu = true;
        else if (c == 'N')
            nap = std::max(1L, atol(optarg));
        else if (c == 'n')
            iters = atoi(optarg);
        else if (c == 's') {
            sizes.clear();
            for (char *tok = strtok(optarg, ","); tok; tok = strtok(nullptr, ","))
                sizes.push_back(strtoull(tok, nullptr, 0));
        } else {
            fprintf(
                stderr,
                "usage: %s [-n ITERS] [-s SIZE,...]\n       %s --xpu [-n ITERS] [--nap-us US]\n",
                argv[0], argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    if (xpu) return xpu_main(iters, nap);
    size_t max_size = 0;
    for (size_t s : sizes) max_size = std::max(max_size, s);
    const char *local = getenv("FI_TANDEM_LOCAL");
    bool net = local && !strcmp(local, "0");
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair", -1);
    pid_t child = fork();
    bool server = child == 0;
    int sock = server ? sv[1] : sv[0];
    // Each process initialises its own driver after the fork.
    if (const char *why = cu.load()) {
        if (!server) printf("hmem_bench: SKIPPED: %s\n", why);
        return 0;
    }
    if (!server) {
        printf("# hmem_bench: tagged ping-pong between device buffers, %s path, %d iterations\n",
               net ? "network (TCP link, FI_TANDEM_LOCAL=0)" : "node-local (off_tandem)", iters);
        if (cu.emulated)
            printf(
                "# EMULATED CUDA driver: its device memory is host memory behind a copy "
                "routine; these figures say nothing about a GPU.\n");
        // The floor of staging: the driver's own host<->device copies.
        CUdeviceptr d;
        cu.mem_alloc(&d, max_size);
        std::vector<uint8_t> h(max_size);
        auto t0 = Clock::now();
        for (int i = 0; i < 20; ++i) {
            cu.memcpy_htod(d, h.data(), max_size);
            cu.memcpy_dtoh(h.data(), d, max_size);
        }
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        printf("# host<->device copy (driver alone, %zu B): %.0f MB/s\n", max_size,
               40.0 * max_size / s / 1e6);
        cu.mem_free(d);
        printf("%-10s %10s %12s %12s %10s\n", "policy", "size", "latency_us", "MB/s", "mechanism");
    }
    for (int policy :
         {FI_HMEM_P2P_ENABLED, FI_HMEM_P2P_PREFERRED, FI_HMEM_P2P_DISABLED, FI_HMEM_P2P_REQUIRED}) {
        Side s;
        int ret = s.open(max_size, policy);
        // Both sides agree on whether this policy runs on this path.
        int peer_ret = 0;
        if (write(sock, &ret, sizeof ret) != sizeof ret ||
            read(sock, &peer_ret, sizeof peer_ret) != sizeof peer_ret)
            die("control", -1);
        if (ret || peer_ret) {
            if (!server)
                printf("%-10s %10s %12s %12s %10s\n", policy_name(policy), "-", "-", "-",
                       "fi_setopt refused (no P2P path)");
            s.close();
            continue;
        }
        exchange(sock, s);
        for (size_t size : sizes) {
            sync_byte(sock);
            unsigned long long opens0 = 0, staged0 = 0, opens1 = 0, staged1 = 0;
            cu.mechanism(opens0, staged0);
            int n = size >= (1 << 20) ? std::max(iters / 10, 10) : iters;
            auto t0 = Clock::now();
            for (int i = 0; i < n + 2; ++i) {
                if (i == 2) t0 = Clock::now();  // two warm-up rounds (connections, caches)
                if (server) {
                    s.recv(size);
                    s.send(size);
                } else {
                    s.send(size);
                    s.recv(size);
                }
            }
            double half = std::chrono::duration<double>(Clock::now() - t0).count() / n / 2;
            cu.mechanism(opens1, staged1);
            if (!server) {
                const char *how = !cu.emulated        ? "-"
                                  : opens1 > opens0   ? "p2p (IPC)"
                                  : staged1 > staged0 ? "staged"
                                                      : "-";
                printf("%-10s %10zu %12.2f %12.0f %10s\n", policy_name(policy), size, half * 1e6,
                       size / half / 1e6, how);
                fflush(stdout);
            }
        }
        sync_byte(sock);
        s.close();
    }
    if (!server) {
        int status = 0;
        waitpid(child, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    return 0;
}

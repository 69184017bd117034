// coll_bench: collective latency and bandwidth over libfabric (fi_collective(3)) or over MPI.
//
// One program, started the way users start jobs: under mpirun, N ranks. MPI starts the ranks
// and, in fabric mode, exchanges the endpoint names (MPI_Allgather); every measured operation
// goes through libfabric there, through MPI in mpi mode.
//
//   mpirun -np N coll_bench --mode fabric --provider tandem           [options]
//   mpirun -np N coll_bench --mode fabric --provider "tandem;ofi_rxm" [options]
//   mpirun -np N coll_bench --mode mpi                                [options]
//
// Measures allreduce (FI_SUM on FI_FLOAT, MPI_SUM on MPI_FLOAT; buffers of 8 B, 64 KiB,
// 1 MiB, 16 MiB by default, send and result buffers distinct) and barrier. Per measurement:
// warm-up iterations, then batches of a fixed number of iterations, each iteration posting
// one collective and waiting for its completion; a batch's latency is its elapsed time over
// its iterations, a rank's figure the median of its batches, and the figure printed the
// maximum of that over the ranks. Bandwidth is the buffer's bytes over that latency. Each
// allreduce size is verified once before it is timed (every element, every rank).
//
// Fabric mode: fi_getinfo(1.17) for FI_MSG | FI_COLLECTIVE on FI_EP_RDM from the named
// provider, fabric, domain, AV (FI_AV_TABLE), EQ, CQ, endpoint; the names of all ranks
// inserted in rank order, an AV set of them all (fi_av_set, start 0, end N-1, stride 1),
// fi_join_collective on the set's address, FI_JOIN_COMPLETE awaited on the EQ while the CQ
// is read (progress is manual), then the collectives on fi_mc_addr. Between measurements
// the ranks agree through MPI's nonblocking calls while still reading the CQ, so that no
// rank stops driving its provider while another may need it.
//
// Output (rank 0, stdout), '#' lines first describing the run, then one line per
// measurement:
//   coll allreduce SIZE lat_us L bw_gbs B iters I batches K
//   coll barrier 0 lat_us L iters I batches K
//   coll OP SIZE n/a (REASON)            the provider does not offer that operation
//   coll n/a (REASON)                    the provider offers no collectives at all
// L in microseconds, B in GB/s (10^9 bytes per second). Exit status: 0 when every
// measurement ran (or was n/a), 1 on a wrong result or error, 2 on bad options, 3 when the
// watchdog fired.

#include "bench/bench_common.h"
#include <mpi.h>

#include <rdma/fabric.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------
// Errors and small helpers

int g_rank = 0;
// What the rank is doing, for the watchdog's message (a string literal: async-signal safe).
const char *volatile g_phase = "startup";

[[noreturn]] void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "coll_bench[%d]: error: ", g_rank);
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    std::fflush(nullptr);
    // Not MPI_Abort: the other ranks may be inside a provider that needs no MPI to notice.
    // mpirun ends the job when a rank exits non-zero.
    std::_Exit(1);
}

void check_fi(int64_t rc, const char *what) {
    if (rc < 0) die("%s: %s (%" PRId64 ")", what, fi_strerror(static_cast<int>(-rc)), rc);
}

void check_mpi(int rc, const char *what) {
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        die("%s: %s", what, msg);
    }
}

double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

extern "C" void on_alarm(int) {
    char msg[200] = "coll_bench: error: watchdog timeout, giving up in ";
    size_t n = std::strlen(msg);
    for (const char *p = g_phase; *p && n < sizeof msg - 2; ++p) msg[n++] = *p;
    msg[n++] = '\n';
    ssize_t ignored = write(2, msg, n);
    (void)ignored;
    _exit(3);
}

// Every rank parses the same options: all of them leave here together.
[[noreturn]] void finish(int code) {
    std::fflush(nullptr);
    MPI_Finalize();
    std::exit(code);
}

bool parse_sizes(const std::string &s, std::vector<uint64_t> *out) {
    out->clear();
    size_t pos = 0;
    while (true) {
        size_t comma = s.find(',', pos);
        uint64_t v;
        if (!tandem_bench::parse_size(
                s.substr(pos, comma == std::string::npos ? comma : comma - pos), &v))
            return false;
        // Whole floats only, at least one.
        if (v < sizeof(float) || v % sizeof(float)) return false;
        out->push_back(v);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return !out->empty();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
    bool fabric = false;
    std::string prov = "tandem";
    std::string node = "127.0.0.1";  // empty: no node in fi_getinfo
    std::vector<uint64_t> sizes;
    uint32_t iters = 2000;  // per batch, for barrier and the smallest sizes
    uint32_t batches = 5;
    double budget_s = 2.0;  // the batches of one measurement, at most about this long
    int yield = -1;         // -1 auto, 0 off, 1 on
    unsigned timeout_s = 300;
};

void usage(FILE *f) {
    std::fprintf(
        f,
        "usage: mpirun -np N coll_bench --mode fabric|mpi [options]\n"
        "  --mode fabric|mpi   libfabric collectives (fi_allreduce, fi_barrier) or MPI's\n"
        "                      (MPI_Allreduce, MPI_Barrier)\n"
        "  --provider PROV     fabric mode: provider string (default tandem), e.g.\n"
        "                      \"tandem;ofi_rxm\"\n"
        "  --node HOST         fabric mode: fi_getinfo's node, with FI_SOURCE (default\n"
        "                      127.0.0.1); \"\" for none\n"
        "  --sizes LIST        allreduce buffer sizes, comma list (8,64k,1m,16m: the\n"
        "                      default), multiples of 4 bytes\n"
        "  --iters N           iterations per batch for barrier and allreduce up to 4 KiB\n"
        "                      (default 2000); larger sizes N / sqrt(size / 4 KiB), at\n"
        "                      least N / 100\n"
        "  --batches K         timed batches per measurement (default 5)\n"
        "  --budget SECONDS    fewer iterations where the K batches would take longer than\n"
        "                      this, by the warm-up's pace (default 2; 0: never fewer)\n"
        "  --yield auto|on|off fabric mode: sched_yield() after an empty CQ read. auto: when\n"
        "                      Open MPI tells its own ranks to yield (the node is\n"
        "                      oversubscribed: OMPI_MCA_mpi_yield_when_idle), else when this\n"
        "                      node has more ranks than CPUs\n"
        "  --timeout SECONDS   watchdog: a rank aborts after this long (default 300, 0: none)\n"
        "  -h, --help          this help\n"
        "Output (rank 0): \"coll allreduce SIZE lat_us L bw_gbs B iters I batches K\",\n"
        "\"coll barrier 0 lat_us L iters I batches K\" (L: the slowest rank's median batch\n"
        "latency in us; B = SIZE / L in GB/s), \"coll OP SIZE n/a (REASON)\" for an\n"
        "operation the provider does not offer, \"coll n/a (REASON)\" for a provider\n"
        "without collectives.\n");
}

Options parse_options(int argc, char **argv) {
    Options o;
    bool mode_given = false;
    static const option longs[] = {
        {"mode", required_argument, nullptr, 'm'},
        {"provider", required_argument, nullptr, 'p'},
        {"node", required_argument, nullptr, 'N'},
        {"sizes", required_argument, nullptr, 'S'},
        {"iters", required_argument, nullptr, 'i'},
        {"batches", required_argument, nullptr, 'k'},
        {"budget", required_argument, nullptr, 'B'},
        {"yield", required_argument, nullptr, 'y'},
        {"timeout", required_argument, nullptr, 'T'},
        {"help", no_argument, nullptr, 'h'},
        {nullptr, 0, nullptr, 0},
    };
    auto bad = [&](const char *opt, const char *arg) {
        if (g_rank == 0) std::fprintf(stderr, "coll_bench: bad %s %s (see --help)\n", opt, arg);
        finish(2);
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, nullptr)) != -1) {
        switch (c) {
            case 'm':
                if (std::strcmp(optarg, "fabric") == 0)
                    o.fabric = true;
                else if (std::strcmp(optarg, "mpi") != 0)
                    bad("--mode", optarg);
                mode_given = true;
                break;
            case 'p':
                o.prov = optarg;
                break;
            case 'N':
                o.node = optarg;
                break;
            case 'S':
                if (!parse_sizes(optarg, &o.sizes)) bad("--sizes", optarg);
                break;
            case 'i':
                o.iters = static_cast<uint32_t>(std::atoi(optarg));
                if (o.iters < 1) bad("--iters", optarg);
                break;
            case 'k':
                o.batches = static_cast<uint32_t>(std::atoi(optarg));
                if (o.batches < 1) bad("--batches", optarg);
                break;
            case 'B':
                o.budget_s = std::atof(optarg);
                if (o.budget_s < 0) bad("--budget", optarg);
                break;
            case 'y':
                if (std::strcmp(optarg, "auto") == 0)
                    o.yield = -1;
                else if (std::strcmp(optarg, "on") == 0)
                    o.yield = 1;
                else if (std::strcmp(optarg, "off") == 0)
                    o.yield = 0;
                else
                    bad("--yield", optarg);
                break;
            case 'T':
                o.timeout_s = static_cast<unsigned>(std::atoi(optarg));
                break;
            case 'h':
                if (g_rank == 0) usage(stdout);
                finish(0);
            default:
                if (g_rank == 0) usage(stderr);
                finish(2);
        }
    }
    if (optind != argc || !mode_given) {
        if (g_rank == 0) usage(stderr);
        finish(2);
    }
    if (o.sizes.empty()) parse_sizes("8,64k,1m,16m", &o.sizes);
    return o;
}

// Iterations per batch for an allreduce of `bytes`: the full count up to 4 KiB, then falling
// with the square root of the size, to a floor of a hundredth.
uint32_t iters_for(const Options &o, uint64_t bytes) {
    double n = o.iters;
    if (bytes > 4096) n /= std::sqrt(double(bytes) / 4096);
    return std::max<uint32_t>({1, o.iters / 100, static_cast<uint32_t>(n)});
}

// The value rank r contributes at element i, and the sum over n ranks: small integers, so the
// float sum is exact whatever order the ranks' values are added in.
float contribution(int r, size_t i) {
    return float((r + 1) * int(i % 13 + 1));
}
float expected_sum(int n, size_t i) {
    return float(n * (n + 1) / 2 * int(i % 13 + 1));
}

void *alloc_buffer(size_t len) {
    void *p = nullptr;
    if (posix_memalign(&p, 4096, len)) die("out of memory (%zu bytes)", len);
    std::memset(p, 0, len);  // fault the pages in now, not in the first timed iteration
    return p;
}

// ---------------------------------------------------------------------------------------------
// The two ways of running a collective. A Runner posts one operation and waits for it,
// verifies, and lets the ranks agree on a number between measurements.

class Runner {
  public:
    virtual ~Runner() = default;
    // Empty when the operation is offered (or cannot be told), else why not. Same on all ranks.
    virtual std::string allreduce_unsupported() { return {}; }
    virtual void allreduce(const float *send, float *result, size_t count) = 0;
    virtual void barrier() = 0;
    // MPI_Allreduce MAX of v over the ranks, without letting the provider starve meanwhile.
    virtual double agree_max(double v) = 0;
    // MPI_Reduce MAX to rank 0 (a double, per rank).
    virtual double reduce_max(double v) { return agree_max(v); }
};

class MpiRunner final : public Runner {
  public:
    void allreduce(const float *send, float *result, size_t count) override {
        check_mpi(MPI_Allreduce(send, result, int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                  "MPI_Allreduce");
    }
    void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
    double agree_max(double v) override {
        double out;
        check_mpi(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
        return out;
    }
    double reduce_max(double v) override {
        double out = 0;
        check_mpi(MPI_Reduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD), "MPI_Reduce");
        return out;
    }
};

// Why the provider offers no collectives (fi_getinfo found none, the join was refused): the
// mode is n/a.
struct Unavailable {
    std::string reason;
};

class FabricRunner final : public Runner {
  public:
    FabricRunner(const Options &o, int nranks, size_t max_bytes, bool yield)
        : o_(o), nranks_(nranks), yield_(yield) {
        open(max_bytes);
    }
    ~FabricRunner() override { close(); }

    const Unavailable *unavailable() const {
        return unavailable_.reason.empty() ? nullptr : &unavailable_;
    }
    const fi_info *info() const { return info_; }

    std::string allreduce_unsupported() override {
        fi_collective_attr attr{};
        attr.op = FI_SUM;
        attr.datatype = FI_FLOAT;
        int rc = fi_query_collective(domain_, FI_ALLREDUCE, &attr, 0);
        // -FI_ENOSYS: the provider cannot tell; try the operation.
        if (rc == 0 || rc == -FI_ENOSYS) return {};
        return std::string("fi_query_collective(FI_ALLREDUCE, FI_FLOAT, FI_SUM): ") +
               fi_strerror(-rc);
    }

    void allreduce(const float *send, float *result, size_t count) override {
        post_and_wait("fi_allreduce", [&] {
            return fi_allreduce(ep_, send, count, send_desc_, result, result_desc_, coll_addr_,
                                FI_FLOAT, FI_SUM, 0, &op_ctx_);
        });
    }
    void barrier() override {
        post_and_wait("fi_barrier", [&] { return fi_barrier(ep_, coll_addr_, &op_ctx_); });
    }

    double agree_max(double v) override {
        double out;
        MPI_Request req;
        check_mpi(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req),
                  "MPI_Iallreduce");
        wait_mpi(&req);
        return out;
    }
    double reduce_max(double v) override {
        double out = 0;
        MPI_Request req;
        check_mpi(MPI_Ireduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD, &req),
                  "MPI_Ireduce");
        wait_mpi(&req);
        return out;
    }
    // Everyone is past every operation: afterwards no rank needs another's progress.
    void quiesce() {
        MPI_Request req;
        check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier");
        wait_mpi(&req);
    }

  private:
    void open(size_t max_bytes) {
        fi_info *hints = fi_allocinfo();
        if (!hints) die("fi_allocinfo");
        hints->caps = FI_MSG | FI_COLLECTIVE;
        hints->mode = FI_CONTEXT | FI_CONTEXT2;
        hints->ep_attr->type = FI_EP_RDM;
        hints->domain_attr->mr_mode =
            FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
        hints->fabric_attr->prov_name = strdup(o_.prov.c_str());
        const char *node = o_.node.empty() ? nullptr : o_.node.c_str();
        int rc = fi_getinfo(FI_VERSION(1, 17), node, nullptr, node ? FI_SOURCE : 0, hints, &info_);
        fi_freeinfo(hints);
        if (rc) info_ = nullptr;
        // Exactly the provider asked for: the core also answers "tcp" with "tcp;ofi_rxm", and
        // a figure must not be labelled with a stack other than the one that ran.
        std::string offered;
        fi_info *match = nullptr;
        for (fi_info *i = info_; i; i = i->next) {
            if (!match && o_.prov == i->fabric_attr->prov_name) match = i;
            if (offered.find(i->fabric_attr->prov_name) == std::string::npos)
                offered += std::string(offered.empty() ? "" : ", ") + i->fabric_attr->prov_name;
        }
        if (match) {
            fi_info *dup = fi_dupinfo(match);
            if (!dup) die("fi_dupinfo");
            fi_freeinfo(info_);
            info_ = dup;
        }
        // The same answer everywhere, or no rank goes on (the others would wait for it).
        if (agree_max(match ? 0 : 1) != 0) {
            unavailable_.reason = "fi_getinfo(FI_MSG|FI_COLLECTIVE, FI_EP_RDM, provider " +
                                  o_.prov + (node ? ", node " + o_.node : std::string()) + "): ";
            if (rc)
                unavailable_.reason += fi_strerror(-rc);
            else if (!match)
                unavailable_.reason += "offered only " + offered;
            else
                unavailable_.reason += "nothing on another rank";
            return;
        }
        check_fi(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
        check_fi(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        av_attr.count = size_t(nranks_);
        check_fi(fi_av_open(domain_, &av_attr, &av_, nullptr), "fi_av_open");
        fi_eq_attr eq_attr{};
        eq_attr.size = 64;
        eq_attr.wait_obj = FI_WAIT_UNSPEC;
        check_fi(fi_eq_open(fabric_, &eq_attr, &eq_, nullptr), "fi_eq_open");
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_CONTEXT;
        cq_attr.size = 256;
        check_fi(fi_cq_open(domain_, &cq_attr, &cq_, nullptr), "fi_cq_open");
        check_fi(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
        check_fi(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind(av)");
        check_fi(fi_ep_bind(ep_, &eq_->fid, 0), "fi_ep_bind(eq)");
        check_fi(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
        check_fi(fi_enable(ep_), "fi_enable");

        send_ = static_cast<float *>(alloc_buffer(max_bytes));
        result_ = static_cast<float *>(alloc_buffer(max_bytes));
        if (info_->domain_attr->mr_mode & FI_MR_LOCAL) {
            const uint64_t access =
                FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
            check_fi(fi_mr_reg(domain_, send_, max_bytes, access, 0, 1, 0, &send_mr_, nullptr),
                     "fi_mr_reg(send)");
            check_fi(fi_mr_reg(domain_, result_, max_bytes, access, 0, 2, 0, &result_mr_, nullptr),
                     "fi_mr_reg(result)");
            send_desc_ = fi_mr_desc(send_mr_);
            result_desc_ = fi_mr_desc(result_mr_);
        }

        // Everyone's name, in rank order, into the AV: fi_addr_t i is rank i.
        g_phase = "exchanging endpoint names";
        std::vector<char> name(256);
        size_t len = name.size();
        check_fi(fi_getname(&ep_->fid, name.data(), &len), "fi_getname");
        int mylen = int(len), maxlen = 0;
        check_mpi(MPI_Allreduce(&mylen, &maxlen, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
                  "MPI_Allreduce");
        std::vector<char> names(size_t(maxlen) * size_t(nranks_));
        check_mpi(MPI_Allgather(name.data(), maxlen, MPI_BYTE, names.data(), maxlen, MPI_BYTE,
                                MPI_COMM_WORLD),
                  "MPI_Allgather");
        std::vector<fi_addr_t> addrs(size_t(nranks_), FI_ADDR_NOTAVAIL);
        for (int r = 0; r < nranks_; ++r) {
            int n = fi_av_insert(av_, names.data() + size_t(r) * size_t(maxlen), 1,
                                 &addrs[size_t(r)], 0, nullptr);
            if (n != 1) die("fi_av_insert of rank %d's name: %d", r, n);
            if (addrs[size_t(r)] != fi_addr_t(r))
                die("fi_av_insert gave rank %d fi_addr %" PRIu64, r, uint64_t(addrs[size_t(r)]));
        }

        g_phase = "fi_join_collective";
        fi_av_set_attr set_attr{};
        set_attr.count = size_t(nranks_);
        set_attr.start_addr = 0;
        set_attr.end_addr = fi_addr_t(nranks_ - 1);
        set_attr.stride = 1;
        check_fi(fi_av_set(av_, &set_attr, &set_, nullptr), "fi_av_set");
        fi_addr_t set_addr = FI_ADDR_NOTAVAIL;
        check_fi(fi_av_set_addr(set_, &set_addr), "fi_av_set_addr");
        rc = fi_join_collective(ep_, set_addr, set_, 0, &mc_, &join_ctx_);
        const bool refused = rc == -FI_EOPNOTSUPP || rc == -FI_ENOSYS;
        if (rc && !refused) check_fi(rc, "fi_join_collective");
        // Refused on one rank: n/a on all of them (the others' joins are left to fi_close).
        if (agree_max(refused ? 1 : 0) != 0) {
            unavailable_.reason = std::string("fi_join_collective: ") +
                                  fi_strerror(refused ? -rc : FI_EOPNOTSUPP) +
                                  (refused ? "" : " (on another rank)");
            return;
        }
        for (;;) {
            poll_cq(nullptr);
            uint32_t event = 0;
            fi_eq_entry entry{};
            ssize_t n = fi_eq_read(eq_, &event, &entry, sizeof entry, 0);
            if (n == -FI_EAGAIN) continue;
            if (n == -FI_EAVAIL) {
                fi_eq_err_entry err{};
                fi_eq_readerr(eq_, &err, 0);
                die("fi_join_collective failed: %s (%d)", fi_strerror(err.err), err.err);
            }
            check_fi(n, "fi_eq_read");
            if (event != FI_JOIN_COMPLETE)
                die("fi_eq_read: event %u while waiting for FI_JOIN_COMPLETE", event);
            if (entry.context != &join_ctx_) die("FI_JOIN_COMPLETE with a foreign context");
            break;
        }
        coll_addr_ = fi_mc_addr(mc_);
        g_phase = "after the join";
    }

    void close() {
        auto close_fid = [](fid *f, const char *what) {
            if (!f) return;
            int rc = fi_close(f);
            if (rc) std::fprintf(stderr, "coll_bench: fi_close(%s): %s\n", what, fi_strerror(-rc));
        };
        if (mc_) close_fid(&mc_->fid, "mc");
        if (set_) close_fid(&set_->fid, "av set");
        if (ep_) close_fid(&ep_->fid, "endpoint");
        if (send_mr_) close_fid(&send_mr_->fid, "mr");
        if (result_mr_) close_fid(&result_mr_->fid, "mr");
        if (cq_) close_fid(&cq_->fid, "cq");
        if (eq_) close_fid(&eq_->fid, "eq");
        if (av_) close_fid(&av_->fid, "av");
        if (domain_) close_fid(&domain_->fid, "domain");
        if (fabric_) close_fid(&fabric_->fid, "fabric");
        if (info_) fi_freeinfo(info_);
        std::free(send_);
        std::free(result_);
    }

    // One CQ read. Returns true when `want` completed; any other completion is an error (only
    // one operation is ever outstanding).
    bool poll_cq(const void *want) {
        fi_cq_entry e[8];
        ssize_t n = fi_cq_read(cq_, e, 8);
        if (n == -FI_EAGAIN) {
            if (yield_) sched_yield();
            return false;
        }
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            fi_cq_readerr(cq_, &err, 0);
            die("%s: error completion: %s (%d, prov_errno %d)", g_phase, fi_strerror(err.err),
                err.err, err.prov_errno);
        }
        check_fi(n, "fi_cq_read");
        bool got = false;
        for (ssize_t i = 0; i < n; ++i) {
            if (want && e[i].op_context == want && !got)
                got = true;
            else
                die("%s: unexpected completion (context %p)", g_phase, e[i].op_context);
        }
        return got;
    }

    template <class Post>
    void post_and_wait(const char *what, Post post) {
        for (;;) {
            ssize_t rc = post();
            if (rc == 0) break;
            if (rc != -FI_EAGAIN) check_fi(rc, what);
            poll_cq(nullptr);
        }
        while (!poll_cq(&op_ctx_)) {
        }
    }

    void wait_mpi(MPI_Request *req) {
        for (;;) {
            int done = 0;
            check_mpi(MPI_Test(req, &done, MPI_STATUS_IGNORE), "MPI_Test");
            if (done) return;
            if (cq_) poll_cq(nullptr);
        }
    }

    const Options &o_;
    int nranks_;
    bool yield_;
    Unavailable unavailable_;
    fi_info *info_ = nullptr;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_av *av_ = nullptr;
    fid_eq *eq_ = nullptr;
    fid_cq *cq_ = nullptr;
    fid_ep *ep_ = nullptr;
    fid_av_set *set_ = nullptr;
    fid_mc *mc_ = nullptr;
    fi_addr_t coll_addr_ = FI_ADDR_NOTAVAIL;
    fid_mr *send_mr_ = nullptr, *result_mr_ = nullptr;
    void *send_desc_ = nullptr, *result_desc_ = nullptr;
    float *send_ = nullptr, *result_ = nullptr;
    fi_context2 op_ctx_{}, join_ctx_{};

  public:
    float *send_buffer() const { return send_; }
    float *result_buffer() const { return result_; }
};

// ---------------------------------------------------------------------------------------------
// Measuring

struct Measurement {
    double lat_us;  // the slowest rank's median batch latency (valid on rank 0)
    uint32_t iters;
};

template <class Op>
Measurement measure(Runner &run, const Options &o, uint32_t iters, Op op) {
    // Pace first (two iterations), then a warm-up of a tenth of a batch, at most a tenth of the
    // budget; the warm-up's pace caps the batches to the budget. All ranks agree on each count.
    double t0 = now_us();
    for (int i = 0; i < 2; ++i) op();
    double pace = std::max(0.01, run.agree_max((now_us() - t0) / 2));
    uint32_t warm = std::max<uint32_t>(1, iters / 10);
    if (o.budget_s > 0)
        warm = std::clamp<uint32_t>(uint32_t(o.budget_s * 1e6 / 10 / pace), 1, warm);
    t0 = now_us();
    for (uint32_t i = 0; i < warm; ++i) op();
    pace = std::max(0.01, run.agree_max((now_us() - t0) / warm));
    if (o.budget_s > 0)
        iters = std::clamp<uint32_t>(uint32_t(o.budget_s * 1e6 / o.batches / pace), 1, iters);
    std::vector<double> lat;
    for (uint32_t b = 0; b < o.batches; ++b) {
        t0 = now_us();
        for (uint32_t i = 0; i < iters; ++i) op();
        lat.push_back((now_us() - t0) / iters);
    }
    return {run.reduce_max(median(lat)), iters};
}

// The number of CPUs this process may run on.
int cpus_available() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? int(n) : 1;
}

int run(const Options &o, int rank, int nranks) {
    // Ranks on this node, for --yield auto.
    MPI_Comm node_comm;
    check_mpi(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_comm),
        "MPI_Comm_split_type");
    int node_ranks = 1;
    MPI_Comm_size(node_comm, &node_ranks);
    MPI_Comm_free(&node_comm);
    const int cpus = cpus_available();
    const char *ompi_yield = std::getenv("OMPI_MCA_mpi_yield_when_idle");
    bool yield = o.yield == 1;
    if (o.yield < 0) {
        if (ompi_yield && *ompi_yield)
            yield = std::strcmp(ompi_yield, "0") != 0 && std::strcmp(ompi_yield, "false") != 0;
        else
            yield = node_ranks > cpus;
    }

    const uint64_t max_bytes = *std::max_element(o.sizes.begin(), o.sizes.end());
    std::unique_ptr<Runner> runner;
    float *send = nullptr, *result = nullptr;
    FabricRunner *fabric = nullptr;
    std::vector<float> mpi_send, mpi_result;
    if (o.fabric) {
        fabric = new FabricRunner(o, nranks, max_bytes, yield);
        runner.reset(fabric);
        if (const Unavailable *u = fabric->unavailable()) {
            if (rank == 0) std::printf("coll n/a (%s)\n", u->reason.c_str());
            return 0;
        }
        send = fabric->send_buffer();
        result = fabric->result_buffer();
    } else {
        runner = std::make_unique<MpiRunner>();
        mpi_send.resize(max_bytes / sizeof(float));
        mpi_result.resize(max_bytes / sizeof(float));
        send = mpi_send.data();
        result = mpi_result.data();
    }

    if (rank == 0) {
        std::printf("# coll_bench mode %s", o.fabric ? "fabric" : "mpi");
        if (o.fabric) {
            const fi_info *i = fabric->info();
            std::printf(" provider %s (asked %s) domain %s", i->fabric_attr->prov_name,
                        o.prov.c_str(), i->domain_attr->name);
        }
        std::printf(" ranks %d\n", nranks);
        std::printf("# %d ranks on this node, %d cpus; %s", node_ranks, cpus,
                    o.fabric ? (yield ? "fabric CQ polling yields" : "fabric CQ polling spins")
                             : "MPI's own polling");
        std::printf("; OMPI_MCA_mpi_yield_when_idle=%s\n", ompi_yield ? ompi_yield : "<unset>");
        std::printf(
            "# batches %u, budget %.1f s per measurement; lat_us: slowest rank's median "
            "batch; bw_gbs = size / lat_us / 1000\n",
            o.batches, o.budget_s);
        std::fflush(stdout);
    }

    int failures = 0;
    const std::string unsupported = runner->allreduce_unsupported();
    for (uint64_t bytes : o.sizes) {
        const size_t count = bytes / sizeof(float);
        if (!unsupported.empty()) {
            if (rank == 0)
                std::printf("coll allreduce %" PRIu64 " n/a (%s)\n", bytes, unsupported.c_str());
            continue;
        }
        // Verify once: every element of every rank's result.
        g_phase = "verifying the allreduce";
        for (size_t i = 0; i < count; ++i) {
            send[i] = contribution(rank, i);
            result[i] = -1.0f;
        }
        runner->allreduce(send, result, count);
        size_t bad = count;
        for (size_t i = 0; i < count && bad == count; ++i)
            if (result[i] != expected_sum(nranks, i)) bad = i;
        if (bad != count)
            std::fprintf(stderr,
                         "coll_bench[%d]: allreduce of %" PRIu64
                         " bytes: WRONG result at element %zu: %g, expected %g\n",
                         rank, bytes, bad, double(result[bad]), double(expected_sum(nranks, bad)));
        const int wrong = int(runner->agree_max(bad != count ? 1 : 0));
        if (wrong) {
            ++failures;
            if (rank == 0)
                std::printf("coll allreduce %" PRIu64 " n/a (WRONG result, see stderr)\n", bytes);
            std::fflush(stdout);
            continue;
        }
        g_phase = "timing allreduce";
        Measurement m = measure(*runner, o, iters_for(o, bytes),
                                [&] { runner->allreduce(send, result, count); });
        if (rank == 0) {
            // Three decimals, or three significant digits below 1 GB/s (8 B moves little).
            const double bw = double(bytes) / m.lat_us / 1e3;
            std::printf("coll allreduce %" PRIu64 " lat_us %.2f bw_gbs %.*g iters %u batches %u\n",
                        bytes, m.lat_us, bw >= 1 ? int(std::log10(bw)) + 4 : 3, bw, m.iters,
                        o.batches);
            std::fflush(stdout);
        }
    }
    g_phase = "timing barrier";
    Measurement m = measure(*runner, o, o.iters, [&] { runner->barrier(); });
    if (rank == 0) {
        std::printf("coll barrier 0 lat_us %.2f iters %u batches %u\n", m.lat_us, m.iters,
                    o.batches);
        std::fflush(stdout);
    }
    g_phase = "closing";
    if (fabric) fabric->quiesce();
    return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
    check_mpi(MPI_Init(&argc, &argv), "MPI_Init");
    int rank = 0, nranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    g_rank = rank;
    Options o = parse_options(argc, argv);
    if (o.timeout_s) {
        signal(SIGALRM, on_alarm);
        alarm(o.timeout_s);
    }
    int status = run(o, rank, nranks);
    alarm(0);
    int worst = 0;
    MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst && rank == 0) std::printf("coll_bench: FAILED (wrong results, see stderr)\n");
    MPI_Finalize();
    return worst;
}

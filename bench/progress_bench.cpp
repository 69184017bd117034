// progress_bench: what tandem's automatic progress (FI_PROGRESS_AUTO) gives an application that
// computes instead of calling libfabric, and what it costs.
//
//   progress_bench [-n RUNS] [-t overlap,idle,lat] [-P local,link] [-S 1m,64m] [-r FILE] ...
//
// Three measurements, each on two paths: node-local (off_tandem's shared memory, tandem's
// default) and tandem's TCP link (FI_TANDEM_LOCAL=0, set in each process before its first
// libfabric call, as between nodes):
//   overlap  two processes, RDM endpoints, tagged messages. The receiver posts a receive of N
//            bytes, both meet at a barrier over their control socket, the sender posts one
//            fi_tsend of N bytes, and both compute for 100 ms without any libfabric call (a
//            busy loop on the clock). Then the receiver reads its buffer directly: the share
//            of it, in fully landed 4 KiB pages, that holds the sender's data. Afterwards both
//            poll their CQs until the transfer completes and the receiver checks every byte.
//            Automatic progress against manual (where nothing moves without calls beyond what
//            the post itself did); N = 1 MiB and 64 MiB.
//   idle     one process, automatic progress: two endpoints of one domain exchange a message
//            each way (so connections exist), then the process sleeps 10 s without calls; its
//            CPU time (all threads, getrusage) over those 10 s as a share of one core, and the
//            progress thread's wake-ups (voluntary context switches).
//   lat      8-byte tagged ping-pong, half round trip (median of 10000 after 1000 warm-up),
//            both sides busy-polling fi_cq_read; automatic against manual progress.
// Each measurement runs in processes forked for it: this process never calls libfabric, so each
// child loads the provider with its own FI_TANDEM_LOCAL and asks for its own progress mode.
// overlap and lat share a process pair per (path, mode). Automatic and manual alternate, the
// order reversed every other run; the table gives the medians over the runs and each target's
// verdict (MISSED where missed). The provider comes from FI_PROVIDER_PATH (scripts/bench.sh
// --progress sets it to BUILD_DIR/lib).
//
// Every wait is bounded (-T, 30 s by default: a control-socket read, a completion, a barrier)
// and every child has a watchdog; a run that fails is reported and counted out of the medians.
// Exit status: 0 when every run ran, whether or not the targets were met (this is a
// measurement, not a test); 1 when a run failed; 2 on bad usage.

#include "bench/bench_common.h"
#include "peer/ep_diag.h"
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Errors and small helpers

// Who speaks in error messages: "progress_bench[main]" in the parent, "[local/auto receiver]"
// etc. in the children (tandem_bench::g_role).
using tandem_bench::check_fi;
using tandem_bench::die;
char (&g_who)[64] = tandem_bench::g_role;

double now_s() {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

extern "C" void on_alarm(int) {
    static const char msg[] = "progress_bench: error: a child's watchdog expired, giving up\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(3);
}

constexpr size_t kPage = 4096;

// "1 MiB", "64 KiB", "8 B": a size as the table names it; compact (no space) for keys.
std::string size_name(uint64_t b, bool compact = false) {
    const char *sep = compact ? "" : " ";
    char buf[48];
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        std::snprintf(buf, sizeof buf, "%" PRIu64 "%sMiB", b >> 20, sep);
    else if (b >= 1024 && b % 1024 == 0)
        std::snprintf(buf, sizeof buf, "%" PRIu64 "%sKiB", b >> 10, sep);
    else
        std::snprintf(buf, sizeof buf, "%" PRIu64 "%sB", b, sep);
    return buf;
}

// The sender's data: a hash of each 8-byte word's index and the transfer's seed (splitmix64's
// finaliser), so that neither a stale page nor a misplaced one matches by accident. The
// receiver's buffer starts as its complement, which differs in every byte.
uint64_t pattern_word(uint64_t index, uint64_t seed) {
    uint64_t z = index * 0x9e3779b97f4a7c15ull + seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fill_pattern(uint8_t *buf, size_t len, uint64_t seed, bool complement) {
    auto *w = reinterpret_cast<uint64_t *>(buf);  // 4 KiB aligned, len a multiple of 8
    for (size_t i = 0; i < len / 8; ++i)
        w[i] = complement ? ~pattern_word(i, seed) : pattern_word(i, seed);
}

// Whether buf[from, to) holds the pattern. Read without synchronisation on purpose (volatile:
// every word is loaded): tandem's progress thread, or the kernel for a cross-memory copy, may be
// writing it meanwhile; the CQ confirms afterwards.
bool holds_pattern(const uint8_t *buf, size_t from, size_t to, uint64_t seed) {
    const volatile uint64_t *w = reinterpret_cast<const volatile uint64_t *>(buf);
    for (size_t i = from / 8; i < to / 8; ++i)
        if (w[i] != pattern_word(i, seed)) return false;
    return true;
}

// The bytes of buf[0, len) in 4 KiB pages that fully hold the pattern. From the last page to
// the first: the data lands front to back, so what lands during the count falls in pages already
// looked at, and the figure is the buffer as it was when the count began (at worst a little
// less), not a mixture of later moments.
size_t landed_bytes(const uint8_t *buf, size_t len, uint64_t seed) {
    size_t landed = 0;
    for (size_t end = len; end > 0;) {
        const size_t begin = (end - 1) / kPage * kPage;
        if (holds_pattern(buf, begin, end, seed)) landed += end - begin;
        end = begin;
    }
    return landed;
}

// The threads tandem names "tandem-progress" in this process: one per domain with automatic
// progress.
std::vector<pid_t> progress_threads() {
    std::vector<pid_t> out;
    DIR *dir = opendir("/proc/self/task");
    if (!dir) return out;
    while (dirent *e = readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        const std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
        char name[32] = "";
        if (FILE *f = std::fopen(path.c_str(), "r")) {
            if (std::fgets(name, sizeof name, f)) name[std::strcspn(name, "\n")] = 0;
            std::fclose(f);
        }
        if (std::strcmp(name, "tandem-progress") == 0) out.push_back(std::atoi(e->d_name));
    }
    closedir(dir);
    return out;
}

// A thread's voluntary context switches: each one a sleep it began (and so a wake-up after).
uint64_t voluntary_switches(pid_t tid) {
    char path[96], line[128];
    std::snprintf(path, sizeof path, "/proc/self/task/%d/status", static_cast<int>(tid));
    FILE *f = std::fopen(path, "r");
    if (!f) return 0;
    const char *key = "voluntary_ctxt_switches:";
    uint64_t n = 0;
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, key, std::strlen(key)) == 0) {
            n = std::strtoull(line + std::strlen(key), nullptr, 10);
            break;
        }
    }
    std::fclose(f);
    return n;
}

// A thread's time on a CPU so far, in seconds (the scheduler's own count, in nanoseconds: finer
// than utime and stime's clock ticks).
double thread_cpu_s(pid_t tid) {
    char path[96];
    std::snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", static_cast<int>(tid));
    FILE *f = std::fopen(path, "r");
    if (!f) return 0;
    unsigned long long ns = 0;
    if (std::fscanf(f, "%llu", &ns) != 1) ns = 0;
    std::fclose(f);
    return double(ns) / 1e9;
}

// The CPU time of every thread of this process, in seconds.
double process_cpu_s() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    auto s = [](const timeval &tv) { return double(tv.tv_sec) + double(tv.tv_usec) / 1e6; };
    return s(ru.ru_utime) + s(ru.ru_stime);
}

// What an application does instead of calling libfabric: computes, here by reading the clock
// until the time is up. Touches nothing of libfabric's (nor the buffers).
void compute_until(Clock::time_point end) {
    while (Clock::now() < end) {
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
    unsigned runs = 5;
    bool overlap = true, idle = true, lat = true;
    std::vector<std::string> paths{"local", "link"};
    std::vector<uint64_t> sizes{1ull << 20, 64ull << 20};
    unsigned compute_ms = 100;
    unsigned idle_s = 10;
    unsigned iters = 10000;
    unsigned wait_s = 30;
    std::string domain;
    std::string results;  // -r: "LABEL KEY VALUE" lines for scripts/bench.sh --json
    bool verbose = false;
};

void usage(FILE *f) {
    std::fprintf(
        f,
        "usage: progress_bench [options]\n"
        "  -n RUNS     runs of each measurement (default 5); auto and manual alternate, the\n"
        "              order reversed every other run\n"
        "  -t TESTS    comma list of overlap, idle, lat (default all three)\n"
        "  -P PATHS    comma list of local (node-local, tandem's default) and link (the TCP\n"
        "              link, FI_TANDEM_LOCAL=0); default local,link\n"
        "  -S SIZES    overlap message sizes, comma list (1m,64m: the default), multiples of 8\n"
        "  -c MS       overlap: how long both processes compute without calls (default 100)\n"
        "  -s SECONDS  idle: how long the process sleeps (default 10)\n"
        "  -i ITERS    lat: ping-pongs measured, after ITERS/10 warm-up (default 10000)\n"
        "  -d DOMAIN   tandem's domain (default its first: fi_info -p tandem)\n"
        "  -T SECONDS  bound on every wait: control socket, completion, barrier (default 30)\n"
        "  -r FILE     also append \"LABEL KEY VALUE\" lines per figure to FILE (LABEL\n"
        "              PATH/auto, PATH/manual, PATH/idle; \"LABEL failed 1\" for a failed run)\n"
        "  -v          say each step (stderr)\n"
        "  -h          this help\n"
        "The provider is tandem, loaded from FI_PROVIDER_PATH (BUILD_DIR/lib).\n");
}

std::vector<std::string> split(const std::string &s) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (true) {
        size_t comma = s.find(',', pos);
        out.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
        if (comma == std::string::npos) return out;
        pos = comma + 1;
    }
}

unsigned parse_count(const char *opt, const char *arg, unsigned min) {
    char *end = nullptr;
    errno = 0;
    unsigned long v = std::strtoul(arg, &end, 10);
    if (errno || end == arg || *end || v < min || v > 1000000000ul) {
        std::fprintf(stderr, "progress_bench: bad %s %s\n", opt, arg);
        std::exit(2);
    }
    return static_cast<unsigned>(v);
}

Options parse_options(int argc, char **argv) {
    Options o;
    auto bad = [](const char *what, const char *arg) {
        std::fprintf(stderr, "progress_bench: bad %s %s (see -h)\n", what, arg);
        std::exit(2);
    };
    int c;
    while ((c = getopt(argc, argv, "n:t:P:S:c:s:i:d:T:r:vh")) != -1) {
        switch (c) {
            case 'n':
                o.runs = parse_count("-n", optarg, 1);
                break;
            case 't':
                o.overlap = o.idle = o.lat = false;
                for (const std::string &t : split(optarg)) {
                    if (t == "overlap")
                        o.overlap = true;
                    else if (t == "idle")
                        o.idle = true;
                    else if (t == "lat")
                        o.lat = true;
                    else
                        bad("-t", optarg);
                }
                break;
            case 'P':
                o.paths.clear();
                for (const std::string &p : split(optarg)) {
                    if (p != "local" && p != "link") bad("-P", optarg);
                    if (std::find(o.paths.begin(), o.paths.end(), p) == o.paths.end())
                        o.paths.push_back(p);
                }
                break;
            case 'S':
                o.sizes.clear();
                for (const std::string &s : split(optarg)) {
                    uint64_t v = 0;
                    if (!tandem_bench::parse_size(s, &v) || v == 0 || v % 8) bad("-S", optarg);
                    o.sizes.push_back(v);
                }
                break;
            case 'c':
                o.compute_ms = parse_count("-c", optarg, 1);
                break;
            case 's':
                o.idle_s = parse_count("-s", optarg, 1);
                break;
            case 'i':
                o.iters = parse_count("-i", optarg, 1);
                break;
            case 'd':
                o.domain = optarg;
                break;
            case 'T':
                o.wait_s = parse_count("-T", optarg, 1);
                break;
            case 'r':
                o.results = optarg;
                break;
            case 'v':
                o.verbose = true;
                break;
            case 'h':
                usage(stdout);
                std::exit(0);
            default:
                usage(stderr);
                std::exit(2);
        }
    }
    if (optind != argc) {
        usage(stderr);
        std::exit(2);
    }
    return o;
}

// ---------------------------------------------------------------------------------------------
// The control channel between the two processes of a pair (a socketpair): endpoint names and
// barriers, every read bounded.

class Ctrl {
  public:
    Ctrl(int fd, double wait_s) : fd_(fd), wait_s_(wait_s) {}
    ~Ctrl() { close(fd_); }
    Ctrl(const Ctrl &) = delete;
    Ctrl &operator=(const Ctrl &) = delete;

    void send_all(const void *p, size_t n) {
        const char *c = static_cast<const char *>(p);
        while (n) {
            ssize_t r = ::send(fd_, c, n, MSG_NOSIGNAL);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) die("control socket send: %s", std::strerror(errno));
            c += r;
            n -= static_cast<size_t>(r);
        }
    }
    // Waits at most the bound for each piece of the message.
    void recv_all(void *p, size_t n, const char *what) {
        char *c = static_cast<char *>(p);
        while (n) {
            if (!wait_readable(wait_s_)) die("%s: nothing from the peer for %.0f s", what, wait_s_);
            ssize_t r = ::recv(fd_, c, n, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r == 0) die("%s: the peer closed the control socket (it failed?)", what);
            if (r < 0) die("%s: control socket recv: %s", what, std::strerror(errno));
            c += r;
            n -= static_cast<size_t>(r);
        }
    }
    void send_blob(const std::vector<uint8_t> &v) {
        uint32_t n = static_cast<uint32_t>(v.size());
        send_all(&n, sizeof n);
        send_all(v.data(), n);
    }
    std::vector<uint8_t> recv_blob(const char *what) {
        uint32_t n = 0;
        recv_all(&n, sizeof n, what);
        if (n > 4096) die("%s: implausible message of %u bytes", what, n);
        std::vector<uint8_t> v(n);
        recv_all(v.data(), n, what);
        return v;
    }
    bool wait_readable(double seconds) {
        pollfd p{fd_, POLLIN, 0};
        for (;;) {
            int r = ::poll(&p, 1, static_cast<int>(seconds * 1000));
            if (r < 0 && errno == EINTR) continue;
            return r > 0;
        }
    }
    bool readable() { return wait_readable(0); }
    // A barrier that makes no libfabric call: one byte each way.
    void barrier(const char *what) {
        const char b = 'b';
        send_all(&b, 1);
        char got = 0;
        recv_all(&got, 1, what);
        if (got != b) die("%s: the peer is out of step (got 0x%02x)", what, got);
    }
    double wait_s() const { return wait_s_; }

  private:
    int fd_;
    double wait_s_;
};

// ---------------------------------------------------------------------------------------------
// The fabric side: one domain of tandem in the progress mode asked for, its endpoints, buffers

struct Buffer {
    uint8_t *ptr = nullptr;
    size_t len = 0;
    fid_mr *mr = nullptr;
    void *desc = nullptr;
};

// An RDM endpoint with a CQ of its own. At most one send and one receive are outstanding at a
// time, so a context each says which completed.
struct Endpoint {
    fid_ep *ep = nullptr;
    fid_cq *cq = nullptr;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    fi_context2 tx_ctx{}, rx_ctx{};
    uint64_t tx_posted = 0, rx_posted = 0, tx_done = 0, rx_done = 0;
};

class Fabric {
  public:
    Fabric(fi_progress mode, const std::string &domain_name) {
        fi_info *hints = fi_allocinfo();
        if (!hints) die("fi_allocinfo");
        hints->caps = FI_TAGGED;
        hints->mode = FI_CONTEXT | FI_CONTEXT2;
        hints->ep_attr->type = FI_EP_RDM;
        hints->domain_attr->mr_mode =
            FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
        // What MPI and NCCL ask for (tandem_bench too): under manual progress tandem then takes
        // no lock; with its progress thread it takes the domain's lock anyway, part of what
        // automatic progress costs.
        hints->domain_attr->threading = FI_THREAD_DOMAIN;
        hints->domain_attr->data_progress = mode;
        hints->domain_attr->control_progress = mode;
        hints->fabric_attr->prov_name = strdup("tandem");
        if (!domain_name.empty()) hints->domain_attr->name = strdup(domain_name.c_str());
        fi_info *all = nullptr;
        int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &all);
        fi_freeinfo(hints);
        if (rc)
            die("fi_getinfo (tandem, RDM, FI_TAGGED, progress %s): %s; FI_PROVIDER_PATH=%s",
                mode == FI_PROGRESS_AUTO ? "auto" : "manual", fi_strerror(-rc),
                std::getenv("FI_PROVIDER_PATH") ? std::getenv("FI_PROVIDER_PATH") : "(unset)");
        // "tandem" alone, not a utility provider layered over it.
        for (fi_info *i = all; i && !info_; i = i->next)
            if (std::strcmp(i->fabric_attr->prov_name, "tandem") == 0 &&
                (domain_name.empty() || domain_name == i->domain_attr->name))
                info_ = fi_dupinfo(i);
        fi_freeinfo(all);
        if (!info_)
            die("fi_getinfo: no domain of tandem itself%s%s", domain_name.empty() ? "" : " named ",
                domain_name.c_str());
        if (info_->domain_attr->data_progress != mode ||
            info_->domain_attr->control_progress != mode)
            die("asked for %s progress, tandem answered data %d, control %d",
                mode == FI_PROGRESS_AUTO ? "automatic" : "manual",
                int(info_->domain_attr->data_progress), int(info_->domain_attr->control_progress));
        mr_local_ = (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
        check_fi(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
        check_fi(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
        fi_av_attr av_attr{};
        av_attr.type = info_->domain_attr->av_type;
        av_attr.count = 4;
        check_fi(fi_av_open(domain_, &av_attr, &av_, nullptr), "fi_av_open");
    }

    ~Fabric() {
        while (!buffers_.empty()) release(*buffers_.back());
        for (Endpoint *e : endpoints_) {
            if (e->ep) fi_close(&e->ep->fid);
            if (e->cq) fi_close(&e->cq->fid);
        }
        if (av_) fi_close(&av_->fid);
        if (domain_) fi_close(&domain_->fid);  // stops and joins the progress thread
        if (fabric_) fi_close(&fabric_->fid);
        fi_freeinfo(info_);
    }
    Fabric(const Fabric &) = delete;
    Fabric &operator=(const Fabric &) = delete;

    const char *domain_name() const { return info_->domain_attr->name; }

    void open(Endpoint *e) {
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_CONTEXT;
        cq_attr.wait_obj = FI_WAIT_NONE;
        cq_attr.size = 64;
        check_fi(fi_cq_open(domain_, &cq_attr, &e->cq, nullptr), "fi_cq_open");
        check_fi(fi_endpoint(domain_, info_, &e->ep, nullptr), "fi_endpoint");
        endpoints_.push_back(e);
        check_fi(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
        check_fi(fi_ep_bind(e->ep, &av_->fid, 0), "fi_ep_bind(av)");
        check_fi(fi_enable(e->ep), "fi_enable");
    }

    static std::vector<uint8_t> name(const Endpoint &e) {
        std::vector<uint8_t> name(256);
        size_t len = name.size();
        int rc = fi_getname(&e.ep->fid, name.data(), &len);
        if (rc == -FI_ETOOSMALL) {
            name.resize(len);
            rc = fi_getname(&e.ep->fid, name.data(), &len);
        }
        check_fi(rc, "fi_getname");
        name.resize(len);
        return name;
    }

    void set_peer(Endpoint *e, const std::vector<uint8_t> &name) {
        int n = fi_av_insert(av_, name.data(), 1, &e->peer, 0, nullptr);
        if (n != 1) die("fi_av_insert of the peer's name returned %d", n);
    }

    // Page-aligned, touched (so that no page fault lands in a measurement), registered when the
    // domain wants local registration; the fabric's until release() or its close.
    Buffer &alloc(size_t len) {
        auto b = std::make_unique<Buffer>();
        b->len = (std::max<size_t>(len, 8) + kPage - 1) / kPage * kPage;
        b->ptr = static_cast<uint8_t *>(std::aligned_alloc(kPage, b->len));
        if (!b->ptr) die("out of memory (%zu bytes)", b->len);
        std::memset(b->ptr, 0, b->len);
        if (mr_local_) {
            check_fi(fi_mr_reg(domain_, b->ptr, b->len, FI_SEND | FI_RECV, 0, next_key_++, 0,
                               &b->mr, nullptr),
                     "fi_mr_reg");
            b->desc = fi_mr_desc(b->mr);
        }
        buffers_.push_back(std::move(b));
        return *buffers_.back();
    }
    void release(Buffer &b) {
        if (b.mr) fi_close(&b.mr->fid);
        std::free(b.ptr);
        std::erase_if(buffers_, [&](const std::unique_ptr<Buffer> &p) { return p.get() == &b; });
    }

    // -FI_EAGAIN (a full queue, never expected here with one operation outstanding) is retried
    // with polling, within the bound.
    void post_send(Endpoint *e, const Buffer &b, size_t len, uint64_t tag, double wait_s) {
        retry(e, wait_s, "fi_tsend",
              [&] { return fi_tsend(e->ep, b.ptr, len, b.desc, e->peer, tag, &e->tx_ctx); });
        ++e->tx_posted;
    }
    void post_recv(Endpoint *e, const Buffer &b, size_t len, uint64_t tag, double wait_s) {
        retry(e, wait_s, "fi_trecv", [&] {
            return fi_trecv(e->ep, b.ptr, len, b.desc, FI_ADDR_UNSPEC, tag, 0, &e->rx_ctx);
        });
        ++e->rx_posted;
    }

    // One fi_cq_read; counts what completed.
    static void poll(Endpoint *e) {
        fi_cq_entry entries[8];
        ssize_t n = fi_cq_read(e->cq, entries, 8);
        if (n == -FI_EAGAIN) return;
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            fi_cq_readerr(e->cq, &err, 0);
            char buf[256] = "";
            die("completion error: %s (%d), prov_errno %d: %s", fi_strerror(err.err), err.err,
                err.prov_errno,
                fi_cq_strerror(e->cq, err.prov_errno, err.err_data, buf, sizeof buf));
        }
        check_fi(n, "fi_cq_read");
        for (ssize_t i = 0; i < n; ++i) {
            if (entries[i].op_context == &e->tx_ctx)
                ++e->tx_done;
            else if (entries[i].op_context == &e->rx_ctx)
                ++e->rx_done;
            else
                die("a completion with a context of no operation of ours (%p)",
                    entries[i].op_context);
        }
    }

    // Busy-polls until every operation posted on the endpoints has completed (every receive only,
    // with receives_only); dies after wait_s (the clock is read every 256 polls, so that the
    // check costs the loop little).
    static void wait_all(std::initializer_list<Endpoint *> eps, double wait_s, const char *what,
                         bool receives_only = false) {
        const double deadline = now_s() + wait_s;
        auto idle = [&](const Endpoint *e) {
            return (receives_only || e->tx_done == e->tx_posted) && e->rx_done == e->rx_posted;
        };
        for (uint64_t spins = 0;; ++spins) {
            bool done = true;
            for (Endpoint *e : eps) {
                if (!idle(e)) {
                    poll(e);
                    done = done && idle(e);
                }
            }
            if (done) return;
            if ((spins & 0xff) == 0xff && now_s() > deadline) {
                std::string state;
                for (Endpoint *e : eps) {
                    char buf[96];
                    std::snprintf(buf, sizeof buf,
                                  " [sends %" PRIu64 "/%" PRIu64 ", receives %" PRIu64 "/%" PRIu64
                                  "]",
                                  e->tx_done, e->tx_posted, e->rx_done, e->rx_posted);
                    state += buf;
                }
                die("%s: not complete after %.0f s;%s", what, wait_s, state.c_str());
            }
        }
    }

    // A barrier over the control socket during which the endpoint keeps progressing (under
    // manual progress the peer's completion may need a pass of ours).
    static void barrier_polling(Endpoint *e, Ctrl &ctrl, const char *what) {
        const char b = 'p';
        ctrl.send_all(&b, 1);
        const double deadline = now_s() + ctrl.wait_s();
        for (uint64_t spins = 0; !ctrl.readable(); ++spins) {
            poll(e);
            if ((spins & 0xff) == 0xff && now_s() > deadline)
                die("%s: no word from the peer for %.0f s", what, ctrl.wait_s());
        }
        char got = 0;
        ctrl.recv_all(&got, 1, what);
        if (got != b) die("%s: the peer is out of step (got 0x%02x)", what, got);
    }

    // Which path tandem takes to the endpoint's peer (its diagnostics ops), as the table names it.
    static std::string peer_path(const Endpoint &e) {
        void *ops = nullptr;
        if (fi_open_ops(&e.ep->fid, tandem::peer::kEpDiagOpsName, 0, &ops, nullptr) != 0 || !ops)
            return "unknown";
        auto *diag = static_cast<tandem::peer::EpDiagOps *>(ops);
        if (diag->size < sizeof(tandem::peer::EpDiagOps)) return "unknown";
        switch (diag->peer_path(e.ep, e.peer)) {
            case int(tandem::peer::PeerPath::Link):
                return "link";
            case int(tandem::peer::PeerPath::LocalStaged):
                return "node-local-staged";
            case int(tandem::peer::PeerPath::LocalSingleCopy):
                return "node-local-cma";
            default:
                return "unknown";
        }
    }

  private:
    template <class F>
    static void retry(Endpoint *e, double wait_s, const char *what, F post) {
        const double deadline = now_s() + wait_s;
        for (uint64_t spins = 0;; ++spins) {
            ssize_t rc = post();
            if (rc == 0) return;
            if (rc != -FI_EAGAIN) check_fi(rc, what);
            poll(e);
            if ((spins & 0xff) == 0xff && now_s() > deadline)
                die("%s: -FI_EAGAIN for %.0f s", what, wait_s);
        }
    }

    fi_info *info_ = nullptr;
    bool mr_local_ = false;
    uint64_t next_key_ = 0x7000;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_av *av_ = nullptr;
    std::vector<Endpoint *> endpoints_;
    std::vector<std::unique_ptr<Buffer>> buffers_;
};

// ---------------------------------------------------------------------------------------------
// The children: what each measurement runs, writing "KEY VALUE" lines to the parent

constexpr uint64_t kTagWarm = 0x100;
constexpr uint64_t kTagOverlap = 0x200;
constexpr uint64_t kTagPing = 0x300;

// Writes one result line to the parent (short: one write(2), whole).
void report(int fd, const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = std::vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= int(sizeof line) - 1) die("result line too long");
    line[n++] = '\n';
    if (write(fd, line, static_cast<size_t>(n)) != n)
        die("writing a result: %s", std::strerror(errno));
}

void trace(const Options &o, const char *fmt, ...) {
    if (!o.verbose) return;
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "progress_bench[%s]: ", g_who);
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
}

// Dies unless the process has as many progress threads as its one domain should: one with
// automatic progress, none with manual (otherwise the figures would not be what they say).
void check_progress_threads(fi_progress mode) {
    const size_t n = progress_threads().size(), want = mode == FI_PROGRESS_AUTO ? 1 : 0;
    if (n != want)
        die("%zu tandem-progress thread(s) in a process with one domain of %s progress "
            "(expected %zu)",
            n, mode == FI_PROGRESS_AUTO ? "automatic" : "manual", want);
}

// One overlap transfer of `size` bytes: the receiver (role 0) reports "overlap_SIZE PERCENT".
void overlap_one(const Options &o, Fabric &f, Endpoint *e, Ctrl &ctrl, bool receiver, uint64_t size,
                 uint64_t seed, int out) {
    const double wait_s = ctrl.wait_s();
    Buffer &b = f.alloc(size);
    if (receiver) {
        fill_pattern(b.ptr, size, seed, true);
        f.post_recv(e, b, size, kTagOverlap, wait_s);
    } else {
        fill_pattern(b.ptr, size, seed, false);
    }
    trace(o, "overlap %s: posted, at the barrier", size_name(size).c_str());
    ctrl.barrier("the barrier before the overlap send");
    const auto start = Clock::now();
    const auto end = start + std::chrono::milliseconds(o.compute_ms);
    if (!receiver) f.post_send(e, b, size, kTagOverlap, wait_s);
    compute_until(end);
    if (receiver) {
        const size_t landed = landed_bytes(b.ptr, size, seed);
        const double count_ms =
            std::chrono::duration<double, std::milli>(Clock::now() - end).count();
        trace(o, "overlap %s: %zu bytes landed (counted in %.1f ms)", size_name(size).c_str(),
              landed, count_ms);
        report(out, "overlap_%s %.1f", size_name(size, true).c_str(),
               100.0 * double(landed) / double(size));
    }
    Fabric::wait_all({e}, wait_s, receiver ? "the overlap receive" : "the overlap send");
    if (receiver && !holds_pattern(b.ptr, 0, size, seed))
        die("overlap %s: the received data is wrong", size_name(size).c_str());
    Fabric::barrier_polling(e, ctrl, "the barrier after the overlap transfer");
    f.release(b);
}

// The ping-pong: the sender (role 1) initiates and reports "latency_us MEDIAN".
void ping_pong(const Options &o, Fabric &f, Endpoint *e, Ctrl &ctrl, bool initiator, int out) {
    const double wait_s = ctrl.wait_s();
    const unsigned warmup = std::max(1u, o.iters / 10), total = warmup + o.iters;
    Buffer &s = f.alloc(8), &r = f.alloc(8);
    Fabric::barrier_polling(e, ctrl, "the barrier before the ping-pong");
    std::vector<double> half_rtt_us;
    half_rtt_us.reserve(o.iters);
    auto seq_of = [](const Buffer &b) {
        uint64_t v;
        std::memcpy(&v, b.ptr, 8);
        return v;
    };
    // What tandem's progress thread (if any) does meanwhile: how often it wakes and how much of
    // a CPU it takes, the likely cost of automatic progress to a busy-polling application.
    const std::vector<pid_t> threads = progress_threads();
    uint64_t switches0 = 0;
    double cpu0 = 0, measured_from = 0;
    if (!initiator) f.post_recv(e, r, 8, kTagPing, wait_s);
    for (unsigned it = 0; it < total; ++it) {
        if (it == warmup && !threads.empty()) {
            switches0 = voluntary_switches(threads[0]);
            cpu0 = thread_cpu_s(threads[0]);
            measured_from = now_s();
        }
        const uint64_t seq = 0x5eed0000ull + it;
        if (initiator) {
            f.post_recv(e, r, 8, kTagPing, wait_s);
            std::memcpy(s.ptr, &seq, 8);
            const auto t0 = Clock::now();
            f.post_send(e, s, 8, kTagPing, wait_s);
            Fabric::wait_all({e}, wait_s, "a ping-pong's reply", true);
            const auto t1 = Clock::now();
            Fabric::wait_all({e}, wait_s, "a ping's send");
            if (it >= warmup)
                half_rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() /
                                      2);
            if (seq_of(r) != seq)
                die("ping-pong %u: the reply carries %#" PRIx64 ", expected %#" PRIx64, it,
                    seq_of(r), seq);
        } else {
            // Waits for the ping (the send of the previous reply completes meanwhile), looks at
            // it before the next receive goes into the same buffer, answers.
            Fabric::wait_all({e}, wait_s, "a ping");
            if (seq_of(r) != seq)
                die("ping-pong %u: the ping carries %#" PRIx64 ", expected %#" PRIx64, it,
                    seq_of(r), seq);
            if (it + 1 < total) f.post_recv(e, r, 8, kTagPing, wait_s);
            std::memcpy(s.ptr, &seq, 8);
            f.post_send(e, s, 8, kTagPing, wait_s);
            if (it + 1 == total) Fabric::wait_all({e}, wait_s, "the last reply's send");
        }
    }
    if (initiator && !threads.empty()) {
        const double seconds = now_s() - measured_from;
        report(out, "thread_wakeups_per_rt %.2f",
               double(voluntary_switches(threads[0]) - switches0) / o.iters);
        report(out, "thread_cpu_pct %.1f", 100.0 * (thread_cpu_s(threads[0]) - cpu0) / seconds);
    }
    Fabric::barrier_polling(e, ctrl, "the barrier after the ping-pong");
    if (initiator) report(out, "latency_us %.3f", median(half_rtt_us));
}

// A pair's child: role 0 receives the overlap transfers and answers the ping-pong, role 1
// sends and initiates.
void pair_child(const Options &o, fi_progress mode, int role, int ctrl_fd, int out, uint32_t run) {
    Ctrl ctrl(ctrl_fd, o.wait_s);
    Fabric f(mode, o.domain);
    Endpoint e;
    f.open(&e);
    ctrl.send_blob(Fabric::name(e));
    f.set_peer(&e, ctrl.recv_blob("the peer's endpoint name"));
    // One message each way first, so that the measured transfers find the connection (or the
    // node-local segments) made.
    {
        Buffer &ws = f.alloc(8), &wr = f.alloc(8);
        f.post_recv(&e, wr, 8, kTagWarm, o.wait_s);
        if (role == 0) Fabric::wait_all({&e}, o.wait_s, "the warm-up message");
        f.post_send(&e, ws, 8, kTagWarm, o.wait_s);
        Fabric::wait_all({&e}, o.wait_s, "the warm-up exchange");
        Fabric::barrier_polling(&e, ctrl, "the barrier after the warm-up");
        f.release(ws);
        f.release(wr);
    }
    check_progress_threads(mode);
    if (role == 0) report(out, "path %s", Fabric::peer_path(e).c_str());
    if (role == 0) report(out, "domain %s", f.domain_name());
    if (o.overlap) {
        for (size_t i = 0; i < o.sizes.size(); ++i)
            overlap_one(o, f, &e, ctrl, role == 0, o.sizes[i], (uint64_t(run) << 32) | (i + 1),
                        out);
    }
    if (o.lat) ping_pong(o, f, &e, ctrl, role == 1, out);
    check_progress_threads(mode);  // still there (or still none) after all that
}

// The idle child: one process, automatic progress, two endpoints that exchange a message each
// way, then o.idle_s seconds asleep. Reports "cpu_pct" and "wakeups_per_s".
void idle_child(const Options &o, int out) {
    Fabric f(FI_PROGRESS_AUTO, o.domain);
    Endpoint a, b;
    f.open(&a);
    f.open(&b);
    f.set_peer(&a, Fabric::name(b));
    f.set_peer(&b, Fabric::name(a));
    Buffer &sa = f.alloc(8), &ra = f.alloc(8), &sb = f.alloc(8), &rb = f.alloc(8);
    f.post_recv(&b, rb, 8, kTagWarm, o.wait_s);
    f.post_send(&a, sa, 8, kTagWarm, o.wait_s);
    Fabric::wait_all({&a, &b}, o.wait_s, "the message a -> b");
    f.post_recv(&a, ra, 8, kTagWarm, o.wait_s);
    f.post_send(&b, sb, 8, kTagWarm, o.wait_s);
    Fabric::wait_all({&a, &b}, o.wait_s, "the message b -> a");
    report(out, "path %s", Fabric::peer_path(a).c_str());
    report(out, "domain %s", f.domain_name());
    const std::vector<pid_t> threads = progress_threads();
    if (threads.size() != 1)
        die("%zu tandem-progress threads in a process with one domain of automatic progress",
            threads.size());
    trace(o, "idle: sleeping %u s", o.idle_s);
    // The sleep: no libfabric call, nothing else running in this process but tandem's thread.
    const uint64_t switches0 = voluntary_switches(threads[0]);
    const double cpu0 = process_cpu_s(), t0 = now_s();
    timespec until{};
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += o.idle_s;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr) == EINTR) {
    }
    const double cpu1 = process_cpu_s(), t1 = now_s();
    const uint64_t switches1 = voluntary_switches(threads[0]);
    report(out, "cpu_pct %.3f", 100.0 * (cpu1 - cpu0) / (t1 - t0));
    report(out, "wakeups_per_s %.2f", double(switches1 - switches0) / (t1 - t0));
}

// ---------------------------------------------------------------------------------------------
// The parent: forks the children of each run, collects their figures, prints the table

// What one run of children produced: their "KEY VALUE" lines, and whether all of them finished.
struct Outcome {
    bool ok = false;
    std::map<std::string, std::string> values;
};

// Forks `count` children (joined pairwise by a socketpair when two), each running body(role,
// ctrl_fd, result_fd) with FI_TANDEM_LOCAL set for the path; waits at most deadline_s for all of
// them, or grace_s after one failed, then kills what is left.
Outcome spawn(const std::string &who, const std::string &path, int count, double deadline_s,
              double grace_s, const std::function<void(int, int, int)> &body) {
    int sv[2] = {-1, -1}, res[2];
    if (count == 2 && socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
        die("socketpair: %s", std::strerror(errno));
    if (pipe(res) < 0) die("pipe: %s", std::strerror(errno));
    std::fflush(nullptr);
    std::vector<pid_t> pids;
    for (int role = 0; role < count; ++role) {
        pid_t pid = fork();
        if (pid < 0) die("fork: %s", std::strerror(errno));
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the parent
            std::snprintf(g_who, sizeof g_who, "%s%s", who.c_str(),
                          count == 2 ? (role == 0 ? " receiver" : " sender") : "");
            close(res[0]);
            int ctrl = -1;
            if (count == 2) {
                close(sv[1 - role]);
                ctrl = sv[role];
            }
            // Before the first libfabric call of this process: the provider reads it when it
            // loads.
            setenv("FI_TANDEM_LOCAL", path == "link" ? "0" : "1", 1);
            signal(SIGALRM, on_alarm);
            alarm(static_cast<unsigned>(deadline_s) + 1);
            body(role, ctrl, res[1]);
            std::fflush(nullptr);
            std::_Exit(0);
        }
        pids.push_back(pid);
    }
    if (count == 2) {
        close(sv[0]);
        close(sv[1]);
    }
    close(res[1]);
    std::string text;
    std::vector<int> status(pids.size(), -1);
    size_t running = pids.size();
    double deadline = now_s() + deadline_s + 5;
    bool timed_out = false, one_failed = false;
    while (running) {
        pollfd p{res[0], POLLIN, 0};
        if (::poll(&p, 1, 50) > 0) {
            char buf[1024];
            ssize_t n = read(res[0], buf, sizeof buf);
            if (n > 0)
                text.append(buf, static_cast<size_t>(n));
            else
                usleep(10 * 1000);  // the end of the pipe: the children are exiting
        }
        for (size_t i = 0; i < pids.size(); ++i) {
            if (status[i] != -1) continue;
            int st = 0;
            if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                status[i] = st;
                --running;
                // A child that failed: its partner notices within one bounded wait (its
                // control socket closes), or never if it is stuck; it gets that long.
                if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && !one_failed) {
                    one_failed = true;
                    deadline = std::min(deadline, now_s() + grace_s);
                }
            }
        }
        if (running && now_s() > deadline) {
            timed_out = true;
            for (size_t i = 0; i < pids.size(); ++i) {
                if (status[i] != -1) continue;
                kill(pids[i], SIGKILL);  // ours, by pid
                int st = 0;
                waitpid(pids[i], &st, 0);
                status[i] = st;
            }
            running = 0;
        }
    }
    {  // what is left in the pipe (its write ends are all closed now)
        char buf[1024];
        ssize_t n;
        while ((n = read(res[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
    }
    close(res[0]);
    Outcome out;
    out.ok = !timed_out;
    for (size_t i = 0; i < pids.size(); ++i)
        if (!WIFEXITED(status[i]) || WEXITSTATUS(status[i]) != 0) out.ok = false;
    if (timed_out && one_failed)
        std::fprintf(stderr,
                     "progress_bench[%s]: error: one process failed and the other was still "
                     "running %.0f s later: killed\n",
                     who.c_str(), grace_s);
    else if (timed_out)
        std::fprintf(stderr, "progress_bench[%s]: error: not done after %.0f s: killed\n",
                     who.c_str(), deadline_s + 5);
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        size_t sp = line.find(' ');
        if (sp != std::string::npos) out.values[line.substr(0, sp)] = line.substr(sp + 1);
    }
    return out;
}

const char *path_title(const std::string &path) {
    return path == "link" ? "TCP link" : "node-local";
}

// The figures of every run, keyed "LABEL KEY" (LABEL PATH/auto, PATH/manual, PATH/idle), and
// what the children said of the paths and the domain.
struct Tally {
    std::map<std::string, std::vector<double>> figures;
    std::map<std::string, unsigned> attempts;                    // runs per LABEL
    std::map<std::string, std::vector<std::string>> seen_paths;  // per path: tandem's answers
    std::string domain;
    unsigned failures = 0;
    FILE *results = nullptr;

    // Records a run's outcome; prints its figures on the current line.
    void add(const std::string &label, const std::string &path, const Outcome &out,
             const std::vector<std::string> &keys) {
        ++attempts[label];
        if (!out.ok) {
            ++failures;
            std::printf(" FAILED (see above)");
            if (results) std::fprintf(results, "%s failed 1\n", label.c_str());
            return;
        }
        if (auto it = out.values.find("path"); it != out.values.end()) {
            auto &v = seen_paths[path];
            if (std::find(v.begin(), v.end(), it->second) == v.end()) v.push_back(it->second);
        }
        if (auto it = out.values.find("domain"); it != out.values.end()) domain = it->second;
        for (const std::string &k : keys) {
            auto it = out.values.find(k);
            if (it == out.values.end()) continue;
            figures[label + " " + k].push_back(std::atof(it->second.c_str()));
            if (results)
                std::fprintf(results, "%s %s %s\n", label.c_str(), k.c_str(), it->second.c_str());
        }
    }
    // The median of a figure, or a negative number when no run gave one; n: how many did.
    double med(const std::string &label, const std::string &key, size_t *n = nullptr) const {
        auto it = figures.find(label + " " + key);
        if (n) *n = it == figures.end() ? 0 : it->second.size();
        return it == figures.end() || it->second.empty() ? -1 : median(it->second);
    }
};

int run_all(const Options &o) {
    Tally tally;
    if (!o.results.empty()) {
        tally.results = std::fopen(o.results.c_str(), "a");
        if (!tally.results) die("-r %s: %s", o.results.c_str(), std::strerror(errno));
        setvbuf(tally.results, nullptr, _IOLBF, 0);
    }
    std::vector<std::string> overlap_keys;
    for (uint64_t s : o.sizes) overlap_keys.push_back("overlap_" + size_name(s, true));
    std::vector<std::string> pair_keys = overlap_keys;
    pair_keys.push_back("latency_us");
    pair_keys.push_back("thread_wakeups_per_rt");
    pair_keys.push_back("thread_cpu_pct");
    const bool pairs = o.overlap || o.lat;

    std::string sizes;
    for (uint64_t s : o.sizes) sizes += (sizes.empty() ? "" : ", ") + size_name(s);
    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    std::printf("# progress_bench: tandem (FI_PROVIDER_PATH=%s), RDM endpoints, tagged messages\n",
                std::getenv("FI_PROVIDER_PATH") ? std::getenv("FI_PROVIDER_PATH") : "unset");
    std::printf(
        "# %u runs; auto = FI_PROGRESS_AUTO for data and control, manual = "
        "FI_PROGRESS_MANUAL; they alternate, the order reversed every other run\n",
        o.runs);
    if (o.overlap)
        std::printf(
            "# overlap: %s, both processes computing %u ms without libfabric calls;\n"
            "#          the receive buffer's share in fully landed 4 KiB pages at the "
            "end\n",
            sizes.c_str(), o.compute_ms);
    if (o.idle)
        std::printf(
            "# idle: one process, automatic progress, two endpoints after one message "
            "each way, asleep %u s: CPU of all its threads, %% of one core\n",
            o.idle_s);
    if (o.lat)
        std::printf(
            "# lat: 8 B ping-pong, half round trip, median of %u after %u warm-up, both "
            "busy-polling fi_cq_read\n",
            o.iters, std::max(1u, o.iters / 10));
    std::printf("# paths:");
    for (const std::string &p : o.paths)
        std::printf(" %s%s", path_title(p), p == "link" ? " (FI_TANDEM_LOCAL=0)" : "");
    std::printf("; %ld CPUs, load average %.2f %.2f %.2f\n", sysconf(_SC_NPROCESSORS_ONLN), load[0],
                load[1], load[2]);

    // A pair's children each wait at most o.wait_s at a time; the deadline is the last resort.
    const double pair_deadline = 8.0 * o.wait_s + 0.001 * o.iters;
    const double idle_deadline = o.idle_s + 4.0 * o.wait_s;
    const double grace = o.wait_s + 5.0;
    const double started = now_s();
    for (unsigned r = 1; r <= o.runs; ++r) {
        if (r == 1) {
            std::printf("run %u/%u\n", r, o.runs);
        } else {
            const double spent = now_s() - started;
            std::printf("run %u/%u (elapsed %.0fs, about %.0fs left)\n", r, o.runs, spent,
                        spent / (r - 1) * (o.runs - r + 1));
        }
        std::fflush(stdout);
        for (const std::string &path : o.paths) {
            if (pairs) {
                const fi_progress order[2] = {r % 2 ? FI_PROGRESS_AUTO : FI_PROGRESS_MANUAL,
                                              r % 2 ? FI_PROGRESS_MANUAL : FI_PROGRESS_AUTO};
                for (fi_progress mode : order) {
                    const std::string label =
                        path + (mode == FI_PROGRESS_AUTO ? "/auto" : "/manual");
                    Outcome out = spawn(label, path, 2, pair_deadline, grace,
                                        [&](int role, int ctrl, int res) {
                                            pair_child(o, mode, role, ctrl, res, r);
                                        });
                    std::printf("  %-13s", label.c_str());
                    if (out.ok) {
                        if (o.overlap) {
                            std::printf(" overlap");
                            for (size_t i = 0; i < o.sizes.size(); ++i) {
                                auto it = out.values.find(overlap_keys[i]);
                                std::printf(" %s %s%%", size_name(o.sizes[i]).c_str(),
                                            it == out.values.end() ? "?" : it->second.c_str());
                            }
                        }
                        if (o.lat) {
                            auto it = out.values.find("latency_us");
                            std::printf("   latency %s us",
                                        it == out.values.end() ? "?" : it->second.c_str());
                            auto w = out.values.find("thread_wakeups_per_rt");
                            auto c = out.values.find("thread_cpu_pct");
                            if (w != out.values.end() && c != out.values.end())
                                std::printf(" (tandem-progress: %s wake-ups/round trip, %s%% CPU)",
                                            w->second.c_str(), c->second.c_str());
                        }
                    }
                    tally.add(label, path, out, pair_keys);
                    std::printf("\n");
                    std::fflush(stdout);
                }
            }
            if (o.idle) {
                const std::string label = path + "/idle";
                Outcome out = spawn(label, path, 1, idle_deadline, grace,
                                    [&](int, int, int res) { idle_child(o, res); });
                std::printf("  %-13s", label.c_str());
                if (out.ok) {
                    auto cpu = out.values.find("cpu_pct"), w = out.values.find("wakeups_per_s");
                    std::printf(" CPU %s%% of one core, %s wake-ups/s of tandem-progress",
                                cpu == out.values.end() ? "?" : cpu->second.c_str(),
                                w == out.values.end() ? "?" : w->second.c_str());
                }
                tally.add(label, path, out, {"cpu_pct", "wakeups_per_s"});
                std::printf("\n");
                std::fflush(stdout);
            }
        }
    }
    if (tally.results) std::fclose(tally.results);

    // The table
    auto runs_note = [&](size_t n) {
        char buf[48] = "";
        if (n != o.runs) std::snprintf(buf, sizeof buf, "  [%zu of %u runs]", n, o.runs);
        return std::string(buf);
    };
    auto fig = [](double v, const char *fmt) {
        char buf[32];
        if (v < 0) return std::string("n/a");
        std::snprintf(buf, sizeof buf, fmt, v);
        return std::string(buf);
    };
    std::printf("\nmedians over %u runs (domain %s)\n", o.runs,
                tally.domain.empty() ? "?" : tally.domain.c_str());
    for (const std::string &path : o.paths) {
        auto it = tally.seen_paths.find(path);
        std::string seen;
        if (it != tally.seen_paths.end())
            for (const std::string &s : it->second) seen += (seen.empty() ? "" : ", ") + s;
        const bool wrong =
            it != tally.seen_paths.end() &&
            std::any_of(it->second.begin(), it->second.end(),
                        [&](const std::string &s) { return (path == "link") != (s == "link"); });
        std::printf("  %s: tandem's path to the peer: %s%s\n", path_title(path),
                    seen.empty() ? "?" : seen.c_str(), wrong ? "   NOT THE PATH ASKED FOR" : "");
    }
    const char *met = "met", *missed = "MISSED", *none = "not measured";
    if (o.overlap) {
        for (const std::string &path : o.paths) {
            for (size_t i = 0; i < o.sizes.size(); ++i) {
                size_t na = 0, nm = 0;
                const double a = tally.med(path + "/auto", overlap_keys[i], &na);
                const double m = tally.med(path + "/manual", overlap_keys[i], &nm);
                char head[64];
                std::snprintf(head, sizeof head, "overlap %s %s:", path_title(path),
                              size_name(o.sizes[i]).c_str());
                std::printf("%-30s auto %7s  manual %7s   (target auto >= 90%%)  %s%s\n", head,
                            fig(a, "%.1f%%").c_str(), fig(m, "%.1f%%").c_str(),
                            a < 0     ? none
                            : a >= 90 ? met
                                      : missed,
                            runs_note(std::min(na, nm)).c_str());
            }
        }
    }
    if (o.idle) {
        for (const std::string &path : o.paths) {
            size_t n = 0;
            const double c = tally.med(path + "/idle", "cpu_pct", &n);
            const double w = tally.med(path + "/idle", "wakeups_per_s");
            char head[64];
            std::snprintf(head, sizeof head, "idle CPU %s:", path_title(path));
            std::printf("%-30s %s of one core over %u s, %s wake-ups/s   (target < 1%%)  %s%s\n",
                        head, fig(c, "%.3f%%").c_str(), o.idle_s, fig(w, "%.1f").c_str(),
                        c < 0   ? none
                        : c < 1 ? met
                                : missed,
                        runs_note(n).c_str());
        }
    }
    if (o.lat) {
        for (const std::string &path : o.paths) {
            size_t na = 0, nm = 0;
            const double a = tally.med(path + "/auto", "latency_us", &na);
            const double m = tally.med(path + "/manual", "latency_us", &nm);
            const double q = a < 0 || m <= 0 ? -1 : a / m;
            char head[64];
            std::snprintf(head, sizeof head, "latency %s 8 B:", path_title(path));
            std::printf("%-30s auto %s us  manual %s us  auto/manual %s   (target <= 1.5)  %s%s\n",
                        head, fig(a, "%.2f").c_str(), fig(m, "%.2f").c_str(),
                        fig(q, "%.2f").c_str(),
                        q < 0      ? none
                        : q <= 1.5 ? met
                                   : missed,
                        runs_note(std::min(na, nm)).c_str());
            const double w = tally.med(path + "/auto", "thread_wakeups_per_rt");
            const double c = tally.med(path + "/auto", "thread_cpu_pct");
            if (w >= 0 && c >= 0)
                std::printf(
                    "%-30s (auto: the initiator's tandem-progress thread woke %.2f times "
                    "per round trip\n%-30s  and was on a CPU %.1f%% of the time)\n",
                    "", w, "", c);
        }
    }
    if (tally.failures) {
        std::printf("\nprogress_bench: %u run(s) FAILED (see above); the medians leave them out\n",
                    tally.failures);
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    tandem_bench::g_program = "progress_bench";
    tandem_bench::set_role("main");
    Options o = parse_options(argc, argv);
    setvbuf(stdout, nullptr, _IOLBF, 0);
    return run_all(o);
}

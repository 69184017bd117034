// tandem_bench: two-process libfabric benchmark.
//
// Measures, for any provider string libfabric accepts (-p tandem, -p "tcp;ofi_rxm", -p shm):
//   - tagged-send ping-pong latency (half round trip),
//   - unidirectional tagged-send bandwidth with a window of sends in flight,
//   - unidirectional RMA write bandwidth (fi_write into the target's registered buffer),
//   - 8-byte atomics (FI_UINT64 on one word of the target's registered buffer): latency of
//     fi_fetch_atomic FI_SUM, fi_atomic FI_SUM (plain, and with FI_DELIVERY_COMPLETE) and
//     fi_compare_atomic FI_CSWAP (post one, wait for its completion, repeat; the median), and
//     the rate of fi_atomic FI_SUM with a window of operations in flight. An operation the
//     provider does not offer (fi_*atomicvalid, or refused when posted) is reported as n/a
//     with the reason,
//   - triggered sends (fi_trigger(3)): 8-byte ping-pong latency with the initiator's send
//     posted at t0, and posted beforehand with FI_TRIGGER on a counter whose fi_cntr_add at t0
//     starts it; n/a where the provider does not offer FI_TRIGGER.
//
// One binary, three ways to start it:
//   tandem_bench -s [HOST:]PORT [options]   server: waits for a client on a TCP control port
//   tandem_bench -c HOST:PORT   [options]   client: connects, runs the tests, prints the table
//   tandem_bench                [options]   forks a server and a client joined by a socketpair
// The control socket only exchanges configuration, fabric addresses, MR keys and results;
// all measured traffic goes through libfabric. Both sides busy-poll their completion queue
// (manual progress is honoured: nothing waits without polling).
//
// The client decides sizes, tests, window and iteration counts and sends them to the server;
// provider, domain and endpoint type come from the server's own options when it has them,
// otherwise from the client's.

#include "bench/bench_common.h"
#include "common/fabric_compat.h"
#include "peer/ep_diag.h"
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
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
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------
// Errors and small helpers

using tandem_bench::check_fi;
using tandem_bench::die;
using tandem_bench::g_role;

double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

extern "C" void on_alarm(int) {
    static const char msg[] = "tandem_bench: error: watchdog timeout, giving up\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(3);
}

// Deterministic, non-periodic fill so that misplaced or stale bytes are caught.
uint8_t pattern_byte(size_t i, uint32_t seed) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u;
    return static_cast<uint8_t>((x >> 24) ^ (x >> 11) ^ static_cast<uint32_t>(i >> 16));
}

void fill_pattern(uint8_t *buf, size_t len, uint32_t seed) {
    for (size_t i = 0; i < len; ++i) buf[i] = pattern_byte(i, seed);
}

// Returns the index of the first wrong byte in [from, len), or len when all are right.
size_t check_pattern(const uint8_t *buf, size_t from, size_t len, uint32_t seed) {
    for (size_t i = from; i < len; ++i)
        if (buf[i] != pattern_byte(i, seed)) return i;
    return len;
}

// ---------------------------------------------------------------------------------------------
// Options and the configuration the client sends to the server

enum TestBits : uint32_t {
    kTestLat = 1,
    kTestBw = 2,
    kTestRma = 4,
    kTestAtomicLat = 8,
    kTestAtomicRate = 16,
    kTestTrigger = 32,
};
constexpr uint32_t kSizeTests = kTestLat | kTestBw | kTestRma;
constexpr uint32_t kAtomicTests = kTestAtomicLat | kTestAtomicRate;
constexpr uint32_t kMaxSizes = 64;
constexpr uint32_t kMagic = 0x74616e64;  // "tand"
constexpr uint32_t kWireVersion = 2;

struct Options {
    std::string prov;  // empty: let libfabric choose
    std::string domain;
    std::string ep = "rdm";
    bool server = false;
    bool client = false;
    std::string host = "0.0.0.0";
    std::string port = "47990";
    std::vector<uint64_t> sizes;
    uint32_t tests = kSizeTests;
    uint32_t window = 64;
    uint32_t iters = 0;  // 0: automatic per size
    unsigned timeout_s = 300;
    bool verbose = false;
    bool prov_given = false, domain_given = false, ep_given = false;
};

struct WireConfig {
    uint32_t magic;
    uint32_t version;
    char prov[128];
    char domain[64];
    char ep[8];
    uint32_t tests;
    uint32_t window;
    uint32_t iters;
    uint32_t nsizes;
    uint64_t sizes[kMaxSizes];
};

// What each side ended up with after fi_getinfo; both must agree.
struct WireInfo {
    char prov[128];
    uint32_t addr_format;
    uint32_t tagged;
    uint32_t rma;
    uint32_t atomic;
    uint64_t max_msg_size;
};

struct WireRmaTarget {
    uint64_t addr;
    uint64_t key;
    uint64_t len;
};

void usage(FILE *f) {
    std::fprintf(
        f,
        "usage: tandem_bench [-s [HOST:]PORT | -c HOST:PORT] [options]\n"
        "  -s [HOST:]PORT  run as server, wait for a client on this TCP control port\n"
        "  -c HOST:PORT    run as client against a server's control port\n"
        "                  (neither -s nor -c: fork a server and a client locally)\n"
        "  -p PROV         libfabric provider string, e.g. tandem, \"tcp;ofi_rxm\", shm\n"
        "  -d DOMAIN       domain name (default: the provider's first)\n"
        "  -e rdm|msg      endpoint type (default rdm)\n"
        "  -S SIZES        comma list (8,4k,1m) and/or ranges of powers of two (8:4m);\n"
        "                  default 8:4m\n"
        "  -t TESTS        comma list of lat,bw,rma (per size), alat,arate (8-byte\n"
        "                  atomics, independent of -S) and trig (8-byte sends, direct and\n"
        "                  triggered); atomic = alat,arate; all = every one (default\n"
        "                  lat,bw,rma)\n"
        "  -w WINDOW       operations in flight for the bandwidth and atomic-rate tests\n"
        "                  (default 64)\n"
        "  -i N            fixed iteration count (ping-pongs, windows for bandwidth,\n"
        "                  operations for atomic latency, windows' worth of operations for\n"
        "                  the atomic rate); default: chosen per size\n"
        "  -T SECONDS      watchdog: abort after this long (default 300, 0 disables)\n"
        "  -v              print the selected fi_info, and each test as it starts (stderr)\n"
        "  -h              this help\n"
        "Output (client): size, tagged ping-pong latency in us (half round trip),\n"
        "tagged-send bandwidth and RMA-write bandwidth in MB/s (1 MB = 10^6 bytes);\n"
        "then lines \"atomic KEY VALUE UNIT ...\": fetch_sum_lat, sum_lat, sum_dc_lat,\n"
        "cswap_lat in us (post to completion, median), sum_rate in operations per second;\n"
        "then lines \"trigger KEY VALUE us mean M\": send_direct_lat, send_trig_lat (half\n"
        "round trip, median); VALUE n/a (reason) when the provider does not offer the\n"
        "operation.\n");
}

bool parse_sizes(const char *arg, std::vector<uint64_t> *out) {
    std::string s(arg);
    size_t pos = 0;
    while (pos <= s.size()) {
        size_t comma = s.find(',', pos);
        std::string item =
            s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        size_t colon = item.find(':');
        if (colon == std::string::npos) {
            uint64_t v;
            if (!tandem_bench::parse_size(item, &v)) return false;
            out->push_back(v);
        } else {
            uint64_t lo, hi;
            if (!tandem_bench::parse_size(item.substr(0, colon), &lo) ||
                !tandem_bench::parse_size(item.substr(colon + 1), &hi))
                return false;
            if (lo == 0) {
                out->push_back(0);
                lo = 1;
            }
            for (uint64_t v = lo; v <= hi; v *= 2) out->push_back(v);
        }
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return !out->empty() && out->size() <= kMaxSizes;
}

bool parse_tests(const char *arg, uint32_t *out) {
    std::string s(arg);
    *out = 0;
    size_t pos = 0;
    while (true) {
        size_t comma = s.find(',', pos);
        std::string t = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        if (t == "lat")
            *out |= kTestLat;
        else if (t == "bw")
            *out |= kTestBw;
        else if (t == "rma")
            *out |= kTestRma;
        else if (t == "alat")
            *out |= kTestAtomicLat;
        else if (t == "arate")
            *out |= kTestAtomicRate;
        else if (t == "atomic")
            *out |= kAtomicTests;
        else if (t == "trig")
            *out |= kTestTrigger;
        else if (t == "all")
            *out |= kSizeTests | kAtomicTests | kTestTrigger;
        else
            return false;
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return *out != 0;
}

bool split_host_port(const std::string &arg, std::string *host, std::string *port,
                     bool host_required) {
    size_t colon = arg.rfind(':');
    if (colon == std::string::npos) {
        if (host_required) return false;
        *port = arg;
        return !port->empty();
    }
    *host = arg.substr(0, colon);
    *port = arg.substr(colon + 1);
    return !host->empty() && !port->empty();
}

Options parse_options(int argc, char **argv) {
    Options o;
    int c;
    while ((c = getopt(argc, argv, "s:c:p:d:e:S:t:w:i:T:vh")) != -1) {
        switch (c) {
            case 's':
                o.server = true;
                if (!split_host_port(optarg, &o.host, &o.port, false)) die("bad -s %s", optarg);
                break;
            case 'c':
                o.client = true;
                if (!split_host_port(optarg, &o.host, &o.port, true))
                    die("bad -c %s (HOST:PORT)", optarg);
                break;
            case 'p':
                o.prov = optarg;
                o.prov_given = true;
                break;
            case 'd':
                o.domain = optarg;
                o.domain_given = true;
                break;
            case 'e':
                o.ep = optarg;
                o.ep_given = true;
                if (o.ep != "rdm" && o.ep != "msg") die("bad -e %s (rdm|msg)", optarg);
                break;
            case 'S':
                o.sizes.clear();
                if (!parse_sizes(optarg, &o.sizes)) die("bad -S %s", optarg);
                break;
            case 't':
                if (!parse_tests(optarg, &o.tests))
                    die("bad -t %s (lat,bw,rma,alat,arate,trig)", optarg);
                break;
            case 'w':
                o.window = static_cast<uint32_t>(std::atoi(optarg));
                if (o.window < 1 || o.window > 4096) die("bad -w %s", optarg);
                break;
            case 'i':
                o.iters = static_cast<uint32_t>(std::atoi(optarg));
                break;
            case 'T':
                o.timeout_s = static_cast<unsigned>(std::atoi(optarg));
                break;
            case 'v':
                o.verbose = true;
                break;
            case 'h':
                usage(stdout);
                std::exit(0);
            default:
                usage(stderr);
                std::exit(1);
        }
    }
    if (optind != argc) {
        usage(stderr);
        std::exit(1);
    }
    if (o.server && o.client) die("-s and -c exclude each other");
    if (o.sizes.empty()) parse_sizes("8:4m", &o.sizes);
    return o;
}

// ---------------------------------------------------------------------------------------------
// Control channel: a plain stream socket (TCP, or a socketpair in fork mode)

class Ctrl {
  public:
    explicit Ctrl(int fd) : fd_(fd) {}
    ~Ctrl() {
        if (fd_ >= 0) close(fd_);
    }
    Ctrl(const Ctrl &) = delete;
    Ctrl &operator=(const Ctrl &) = delete;

    int fd() const { return fd_; }

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
    void recv_all(void *p, size_t n) {
        char *c = static_cast<char *>(p);
        while (n) {
            ssize_t r = ::recv(fd_, c, n, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r == 0) die("control socket: peer closed the connection");
            if (r < 0) die("control socket recv: %s", std::strerror(errno));
            c += r;
            n -= static_cast<size_t>(r);
        }
    }
    void send_blob(const void *p, uint32_t n) {
        send_all(&n, sizeof n);
        if (n) send_all(p, n);
    }
    std::vector<uint8_t> recv_blob() {
        uint32_t n;
        recv_all(&n, sizeof n);
        if (n > (1u << 20)) die("control socket: implausible blob of %u bytes", n);
        std::vector<uint8_t> v(n);
        if (n) recv_all(v.data(), n);
        return v;
    }
    // True if the peer hung up (used while busy-polling to notice a dead peer).
    bool peer_gone() {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) return false;
        if (p.revents & (POLLHUP | POLLERR)) return true;
        char c;
        return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    bool readable() {
        pollfd p{fd_, POLLIN, 0};
        return ::poll(&p, 1, 0) > 0;
    }

  private:
    int fd_;
};

int listen_and_accept(const std::string &host, const std::string &port) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (rc) die("getaddrinfo %s:%s: %s", host.c_str(), port.c_str(), gai_strerror(rc));
    int lfd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (lfd < 0) die("socket: %s", std::strerror(errno));
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, res->ai_addr, res->ai_addrlen) < 0)
        die("bind %s:%s: %s", host.c_str(), port.c_str(), std::strerror(errno));
    freeaddrinfo(res);
    if (listen(lfd, 1) < 0) die("listen: %s", std::strerror(errno));
    std::fprintf(stderr, "tandem_bench[server]: waiting for a client on %s:%s\n", host.c_str(),
                 port.c_str());
    int fd;
    do {
        fd = accept(lfd, nullptr, nullptr);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) die("accept: %s", std::strerror(errno));
    close(lfd);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int connect_retry(const std::string &host, const std::string &port) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (rc) die("getaddrinfo %s:%s: %s", host.c_str(), port.c_str(), gai_strerror(rc));
    // The server may still be starting: retry for up to 20 s.
    for (int attempt = 0;; ++attempt) {
        for (addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                freeaddrinfo(res);
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                return fd;
            }
            close(fd);
        }
        if (attempt >= 200)
            die("connect %s:%s: %s", host.c_str(), port.c_str(), std::strerror(errno));
        usleep(100 * 1000);
    }
}

// ---------------------------------------------------------------------------------------------
// The fabric side

enum class OpKind : int { kTx, kRx };

// The atomic operations measured, all on FI_UINT64. kSumDelivery is fi_atomicmsg FI_SUM with
// FI_DELIVERY_COMPLETE: a round trip on every provider (some complete a plain fi_atomic as soon
// as it is queued).
enum class AtomicKind : int { kSum, kSumDelivery, kFetchSum, kCswap };

// One per posted operation: the fi_context2 must stay untouched until the completion. An
// FI_TRIGGER operation takes the fi_triggered_context2 in the same place as its context.
struct Op {
    union {
        fi_context2 ctx;  // first member: the completion's op_context points here
        fi_triggered_context2 tctx;
    };
    OpKind kind;
};
static_assert(sizeof(fi_triggered_context2) == sizeof(fi_context2));

struct Buffer {
    uint8_t *ptr = nullptr;
    size_t len = 0;
    fid_mr *mr = nullptr;
    void *desc = nullptr;  // passed to data transfers only when the provider wants FI_MR_LOCAL
};

class Fabric {
  public:
    Fabric(const Options &o, bool is_server, Ctrl &ctrl) : o_(o), server_(is_server), ctrl_(ctrl) {}
    ~Fabric() { teardown(); }

    // fi_getinfo with the wanted capabilities, falling back step by step: tagged sends matter
    // most, then RMA, then atomics, then triggered operations; untagged sends are the last
    // resort (some MSG endpoints lack FI_TAGGED).
    void select(bool want_rma, bool want_atomic, bool want_trigger) {
        const uint64_t msg_caps[] = {FI_TAGGED, FI_MSG};
        for (uint64_t base : msg_caps) {
            for (int r = want_rma ? 1 : 0; r >= 0 && !info_; --r) {
                for (int a = want_atomic ? 1 : 0; a >= 0 && !info_; --a) {
                    for (int t = want_trigger ? 1 : 0; t >= 0 && !info_; --t) {
                        fi_info *got = try_getinfo(base | (r ? FI_RMA : 0) | (a ? FI_ATOMIC : 0) |
                                                   (t ? FI_TRIGGER : 0));
                        if (got) {
                            info_ = got;
                            tagged_ = base == FI_TAGGED;
                            rma_ = r != 0;
                            atomic_ = a != 0;
                            trigger_ = t != 0;
                        }
                    }
                }
            }
            if (info_) break;
        }
        if (!info_)
            die("fi_getinfo found nothing for provider '%s', ep %s%s%s (FI_PROVIDER_PATH set? "
                "FI_LOG_LEVEL=info shows why)",
                o_.prov.c_str(), o_.ep.c_str(), o_.domain.empty() ? "" : ", domain ",
                o_.domain.c_str());
        if (o_.verbose) {
            char *s = fi_tostr(info_, FI_TYPE_INFO);
            std::fprintf(stderr, "tandem_bench[%s]: selected\n%s", g_role, s ? s : "?");
        }
    }

    void agree_with_peer() {
        WireInfo mine{};
        std::snprintf(mine.prov, sizeof mine.prov, "%s", info_->fabric_attr->prov_name);
        mine.addr_format = info_->addr_format;
        mine.tagged = tagged_;
        mine.rma = rma_;
        mine.atomic = atomic_;
        mine.max_msg_size = info_->ep_attr->max_msg_size;
        ctrl_.send_blob(&mine, sizeof mine);
        std::vector<uint8_t> b = ctrl_.recv_blob();
        if (b.size() != sizeof(WireInfo)) die("control: bad info message");
        WireInfo peer;
        std::memcpy(&peer, b.data(), sizeof peer);
        peer.prov[sizeof peer.prov - 1] = 0;
        if (std::strcmp(peer.prov, mine.prov) != 0)
            die("the two sides selected different providers: '%s' here, '%s' on the peer",
                mine.prov, peer.prov);
        if (peer.addr_format != mine.addr_format)
            die("the two sides use different address formats");
        if (peer.tagged != mine.tagged) die("one side has FI_TAGGED, the other not");
        rma_ = rma_ && peer.rma;
        atomic_ = atomic_ && peer.atomic;
        max_msg_ = std::min(mine.max_msg_size, peer.max_msg_size);
    }

    void open() {
        check_fi(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
        check_fi(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_CONTEXT;
        cq_attr.wait_obj = FI_WAIT_NONE;
        cq_attr.size = std::max<size_t>(4 * o_.window + 64, 1024);
        check_fi(fi_cq_open(domain_, &cq_attr, &cq_, nullptr), "fi_cq_open");
        if (info_->ep_attr->type == FI_EP_RDM)
            open_rdm();
        else
            open_msg();
    }

    // Registers the buffers and exchanges the RMA and atomic target (addr, key) with the peer.
    void register_buffers(size_t max_size) {
        mr_local_ = (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
        size_t len = std::max<size_t>(max_size, 64);
        len = (len + 4095) & ~size_t(4095);
        alloc(&tx_, len);
        alloc(&rx_, len);
        alloc(&ctl_tx_, 4096);
        alloc(&ctl_rx_, 4096);
        uint64_t key = 0x7a00;
        reg(&tx_, key++);
        reg(&rx_, key++);
        reg(&ctl_tx_, key++);
        reg(&ctl_rx_, key++);

        if (rma_ || atomic_) {
            WireRmaTarget mine{};
            const uint64_t mr_mode = info_->domain_attr->mr_mode;
            mine.addr = (mr_mode & (FI_MR_VIRT_ADDR | tandem::compat::kMrBasic))
                            ? reinterpret_cast<uint64_t>(rx_.ptr)
                            : 0;
            mine.key = fi_mr_key(rx_.mr);
            if (mine.key == FI_KEY_NOTAVAIL)
                die("fi_mr_key: key not available (FI_MR_RAW is not supported)");
            mine.len = rx_.len;
            ctrl_.send_blob(&mine, sizeof mine);
            std::vector<uint8_t> b = ctrl_.recv_blob();
            if (b.size() != sizeof peer_rma_) die("control: bad RMA target message");
            std::memcpy(&peer_rma_, b.data(), sizeof peer_rma_);
        }
    }

    // ---- posting and polling -----------------------------------------------------------------

    void post_send(Buffer &b, size_t len, uint64_t tag) {
        Op *op = next_op(OpKind::kTx);
        void *desc = mr_local_ ? b.desc : nullptr;
        retry(
            [&] {
                return tagged_ ? fi_tsend(ep_, b.ptr, len, desc, peer_, tag, &op->ctx)
                               : fi_send(ep_, b.ptr, len, desc, peer_, &op->ctx);
            },
            tagged_ ? "fi_tsend" : "fi_send");
        ++tx_posted_;
    }

    void post_recv(Buffer &b, size_t len, uint64_t tag) {
        Op *op = next_op(OpKind::kRx);
        void *desc = mr_local_ ? b.desc : nullptr;
        retry(
            [&] {
                return tagged_ ? fi_trecv(ep_, b.ptr, len, desc, FI_ADDR_UNSPEC, tag, 0, &op->ctx)
                               : fi_recv(ep_, b.ptr, len, desc, FI_ADDR_UNSPEC, &op->ctx);
            },
            tagged_ ? "fi_trecv" : "fi_recv");
        ++rx_posted_;
    }

    void post_write(size_t len) {
        Op *op = next_op(OpKind::kTx);
        void *desc = mr_local_ ? tx_.desc : nullptr;
        retry(
            [&] {
                return fi_write(ep_, tx_.ptr, len, desc, peer_, peer_rma_.addr, peer_rma_.key,
                                &op->ctx);
            },
            "fi_write");
        ++tx_posted_;
    }

    // fi_tsendmsg (fi_sendmsg without FI_TAGGED) of `len` bytes of b. With a counter, the send
    // is an FI_TRIGGER one that starts when the counter's success value reaches `threshold`;
    // without one, it starts now, through the same call.
    void post_send_msg(Buffer &b, size_t len, uint64_t tag, fid_cntr *cntr = nullptr,
                       uint64_t threshold = 0) {
        Op *op = next_op(OpKind::kTx);
        void *desc = mr_local_ ? b.desc : nullptr;
        uint64_t flags = FI_COMPLETION;
        if (cntr) {
            op->tctx = fi_triggered_context2{};
            op->tctx.event_type = FI_TRIGGER_THRESHOLD;
            op->tctx.trigger.threshold.cntr = cntr;
            op->tctx.trigger.threshold.threshold = threshold;
            flags |= FI_TRIGGER;
        }
        iovec iov{b.ptr, len};
        fi_msg_tagged tmsg{&iov, &desc, 1, peer_, tag, 0, &op->ctx, 0};
        fi_msg msg{&iov, &desc, 1, peer_, &op->ctx, 0};
        const char *what = tagged_ ? (cntr ? "fi_tsendmsg(FI_TRIGGER)" : "fi_tsendmsg")
                                   : (cntr ? "fi_sendmsg(FI_TRIGGER)" : "fi_sendmsg");
        retry(
            [&] { return tagged_ ? fi_tsendmsg(ep_, &tmsg, flags) : fi_sendmsg(ep_, &msg, flags); },
            what);
        ++tx_posted_;
    }

    // The counter FI_TRIGGER sends wait on: opened once, bound to nothing (only fi_cntr_add
    // moves it).
    fid_cntr *trigger_cntr() {
        if (!trigger_cntr_) {
            fi_cntr_attr attr{};
            attr.events = FI_CNTR_EVENTS_COMP;
            attr.wait_obj = FI_WAIT_NONE;
            check_fi(fi_cntr_open(domain_, &attr, &trigger_cntr_, nullptr), "fi_cntr_open");
        }
        return trigger_cntr_;
    }

    // fi_writemsg with FI_DELIVERY_COMPLETE; returns false (nothing posted) if the provider
    // refuses the flag, so the caller can fall back to fi_write.
    bool post_write_delivery_complete(size_t len) {
        Op *op = next_op(OpKind::kTx);
        void *desc = mr_local_ ? tx_.desc : nullptr;
        iovec iov{tx_.ptr, len};
        fi_rma_iov riov{peer_rma_.addr, len, peer_rma_.key};
        fi_msg_rma msg{};
        msg.msg_iov = &iov;
        msg.desc = &desc;
        msg.iov_count = 1;
        msg.addr = peer_;
        msg.rma_iov = &riov;
        msg.rma_iov_count = 1;
        msg.context = &op->ctx;
        for (;;) {
            ssize_t rc = fi_writemsg(ep_, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION);
            if (rc == 0) break;
            if (rc != -FI_EAGAIN) return false;
            poll_cq();
        }
        ++tx_posted_;
        return true;
    }

    // One FI_UINT64 atomic on the first word of the peer's target buffer. The operand, compare
    // and result pointers must lie in tx() (its descriptor goes with them) and stay untouched
    // until the completion.
    void post_atomic(AtomicKind kind, const uint64_t *operand, const uint64_t *compare,
                     uint64_t *result) {
        check_fi(try_post_atomic(kind, operand, compare, result), atomic_call(kind));
    }

    // The same, but returns the provider's refusal (anything but -FI_EAGAIN, which it retries)
    // instead of dying on it.
    ssize_t try_post_atomic(AtomicKind kind, const uint64_t *operand, const uint64_t *compare,
                            uint64_t *result) {
        Op *op = next_op(OpKind::kTx);
        void *desc = mr_local_ ? tx_.desc : nullptr;
        const uint64_t addr = peer_rma_.addr, key = peer_rma_.key;
        fi_ioc ioc{const_cast<uint64_t *>(operand), 1};
        fi_rma_ioc rma_ioc{addr, 1, key};
        fi_msg_atomic msg{};
        msg.msg_iov = &ioc;
        msg.desc = &desc;
        msg.iov_count = 1;
        msg.addr = peer_;
        msg.rma_iov = &rma_ioc;
        msg.rma_iov_count = 1;
        msg.datatype = FI_UINT64;
        msg.op = FI_SUM;
        msg.context = &op->ctx;
        auto post = [&]() -> ssize_t {
            switch (kind) {
                case AtomicKind::kSum:
                    return fi_atomic(ep_, operand, 1, desc, peer_, addr, key, FI_UINT64, FI_SUM,
                                     &op->ctx);
                case AtomicKind::kSumDelivery:
                    return fi_atomicmsg(ep_, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION);
                case AtomicKind::kFetchSum:
                    return fi_fetch_atomic(ep_, operand, 1, desc, result, desc, peer_, addr, key,
                                           FI_UINT64, FI_SUM, &op->ctx);
                case AtomicKind::kCswap:
                    return fi_compare_atomic(ep_, operand, 1, desc, compare, desc, result, desc,
                                             peer_, addr, key, FI_UINT64, FI_CSWAP, &op->ctx);
            }
            return -FI_EINVAL;
        };
        for (uint64_t spins = 0;; ++spins) {
            ssize_t rc = post();
            if (rc == 0) break;
            if (rc != -FI_EAGAIN) return rc;
            poll_cq();
            if ((spins & 0xffff) == 0xffff && ctrl_.peer_gone()) die("peer went away");
        }
        ++tx_posted_;
        return 0;
    }

    static const char *atomic_call(AtomicKind kind) {
        switch (kind) {
            case AtomicKind::kSum:
                return "fi_atomic";
            case AtomicKind::kSumDelivery:
                return "fi_atomicmsg(FI_DELIVERY_COMPLETE)";
            case AtomicKind::kFetchSum:
                return "fi_fetch_atomic";
            case AtomicKind::kCswap:
                return "fi_compare_atomic";
        }
        return "?";
    }

    // Empty if the endpoint offers this atomic on one FI_UINT64, else why not.
    std::string atomic_unsupported(AtomicKind kind) {
        if (!atomic_) return "provider does not offer FI_ATOMIC";
        size_t count = 0;
        int rc = 0;
        const char *what = "";
        switch (kind) {
            case AtomicKind::kSum:
            case AtomicKind::kSumDelivery:
                rc = fi_atomicvalid(ep_, FI_UINT64, FI_SUM, &count);
                what = "fi_atomicvalid(FI_UINT64, FI_SUM)";
                break;
            case AtomicKind::kFetchSum:
                rc = fi_fetch_atomicvalid(ep_, FI_UINT64, FI_SUM, &count);
                what = "fi_fetch_atomicvalid(FI_UINT64, FI_SUM)";
                break;
            case AtomicKind::kCswap:
                rc = fi_compare_atomicvalid(ep_, FI_UINT64, FI_CSWAP, &count);
                what = "fi_compare_atomicvalid(FI_UINT64, FI_CSWAP)";
                break;
        }
        char buf[160];
        if (rc < 0)
            std::snprintf(buf, sizeof buf, "%s: %s", what, fi_strerror(-rc));
        else if (count < 1)
            std::snprintf(buf, sizeof buf, "%s: count 0", what);
        else
            return "";
        return buf;
    }

    // Polls until every posted operation has completed.
    void wait_all() {
        uint64_t spins = 0;
        while (tx_done_ < tx_posted_ || rx_done_ < rx_posted_) {
            poll_cq();
            if ((++spins & 0xffff) == 0 && ctrl_.peer_gone()) die("peer went away");
        }
    }
    void wait_rx(uint64_t count) {
        uint64_t spins = 0;
        while (rx_done_ < count) {
            poll_cq();
            if ((++spins & 0xffff) == 0 && ctrl_.peer_gone()) die("peer went away");
        }
    }
    void wait_tx(uint64_t count) {
        uint64_t spins = 0;
        while (tx_done_ < count) {
            poll_cq();
            if ((++spins & 0xffff) == 0 && ctrl_.peer_gone()) die("peer went away");
        }
    }
    // wait_rx with a limit: false if `count` receives have not completed after timeout_us
    // (looks at the clock only every 1024 polls).
    bool wait_rx_for(uint64_t count, double timeout_us) {
        const double start = now_us();
        uint64_t spins = 0;
        while (rx_done_ < count) {
            poll_cq();
            if ((++spins & 0x3ff) == 0) {
                if (now_us() - start > timeout_us) return false;
                if ((spins & 0xffff) == 0 && ctrl_.peer_gone()) die("peer went away");
            }
        }
        return true;
    }

    // A barrier over the control socket that keeps the fabric progressing meanwhile.
    void sync_int(int32_t mine, int32_t *peer) {
        ctrl_.send_all(&mine, sizeof mine);
        while (!ctrl_.readable()) poll_cq();
        ctrl_.recv_all(peer, sizeof *peer);
    }
    void sync_u64(uint64_t mine, uint64_t *peer) {
        ctrl_.send_all(&mine, sizeof mine);
        while (!ctrl_.readable()) poll_cq();
        ctrl_.recv_all(peer, sizeof *peer);
    }

    void poll() { poll_cq(); }

    uint64_t tx_posted() const { return tx_posted_; }
    uint64_t rx_posted() const { return rx_posted_; }
    uint64_t rx_done() const { return rx_done_; }
    uint64_t tx_done() const { return tx_done_; }
    bool tagged() const { return tagged_; }
    bool rma() const { return rma_; }
    // Which path tandem's endpoint takes to the peer (its diagnostics ops); empty for other
    // providers, which have no such ops.
    std::string peer_path() const {
        if (!ep_ || peer_ == FI_ADDR_UNSPEC) return "";
        void *ops = nullptr;
        if (fi_open_ops(&ep_->fid, tandem::peer::kEpDiagOpsName, 0, &ops, nullptr) != 0 || !ops)
            return "";
        auto *diag = static_cast<tandem::peer::EpDiagOps *>(ops);
        if (diag->size < sizeof(tandem::peer::EpDiagOps)) return "";
        switch (diag->peer_path(ep_, peer_)) {
            case int(tandem::peer::PeerPath::Link):
                return "link";
            case int(tandem::peer::PeerPath::LocalStaged):
                return "node-local, staged";
            case int(tandem::peer::PeerPath::LocalSingleCopy):
                return "node-local, single copy (CMA)";
            default:
                return "unknown";
        }
    }
    bool atomic() const { return atomic_; }
    bool trigger() const { return trigger_; }
    uint64_t max_msg() const { return max_msg_; }
    const fi_info *info() const { return info_; }
    Buffer &tx() { return tx_; }
    Buffer &rx() { return rx_; }
    Buffer &ctl_tx() { return ctl_tx_; }
    Buffer &ctl_rx() { return ctl_rx_; }

  private:
    fi_info *try_getinfo(uint64_t caps) {
        fi_info *hints = fi_allocinfo();
        if (!hints) die("fi_allocinfo");
        hints->caps = caps;
        hints->mode = FI_CONTEXT | FI_CONTEXT2;
        hints->ep_attr->type = o_.ep == "msg" ? FI_EP_MSG : FI_EP_RDM;
        hints->domain_attr->mr_mode =
            FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
        hints->domain_attr->threading = FI_THREAD_DOMAIN;
        hints->addr_format = FI_FORMAT_UNSPEC;
        if (!o_.prov.empty()) hints->fabric_attr->prov_name = strdup(o_.prov.c_str());
        if (!o_.domain.empty()) hints->domain_attr->name = strdup(o_.domain.c_str());
        fi_info *out = nullptr;
        int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &out);
        fi_freeinfo(hints);
        if (rc) return nullptr;
        // "-p tcp" also matches the layered "tcp;ofi_rxm": prefer the exact name. Some
        // providers ignore the domain name in the hints: filter on it here. Both sides run
        // the same selection, so they agree.
        auto domain_ok = [&](const fi_info *i) {
            return o_.domain.empty() || o_.domain == i->domain_attr->name;
        };
        fi_info *pick = nullptr;
        for (fi_info *i = out; i && !pick; i = i->next)
            if (domain_ok(i) && (o_.prov.empty() || o_.prov == i->fabric_attr->prov_name)) pick = i;
        for (fi_info *i = out; i && !pick; i = i->next)
            if (domain_ok(i)) pick = i;
        if (!pick) {
            fi_freeinfo(out);
            return nullptr;
        }
        fi_info *one = fi_dupinfo(pick);
        fi_freeinfo(out);
        if (!one) die("fi_dupinfo");
        return one;
    }

    void open_rdm() {
        fi_av_attr av_attr{};
        av_attr.type = info_->domain_attr->av_type;
        av_attr.count = 4;
        check_fi(fi_av_open(domain_, &av_attr, &av_, nullptr), "fi_av_open");
        check_fi(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
        check_fi(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
        check_fi(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind(av)");
        check_fi(fi_enable(ep_), "fi_enable");
        std::vector<uint8_t> name(256);
        size_t len = name.size();
        int rc = fi_getname(&ep_->fid, name.data(), &len);
        if (rc == -FI_ETOOSMALL) {
            name.resize(len);
            rc = fi_getname(&ep_->fid, name.data(), &len);
        }
        check_fi(rc, "fi_getname");
        ctrl_.send_blob(name.data(), static_cast<uint32_t>(len));
        std::vector<uint8_t> peer = ctrl_.recv_blob();
        int n = fi_av_insert(av_, peer.data(), 1, &peer_, 0, nullptr);
        if (n != 1) die("fi_av_insert of the peer's address returned %d", n);
    }

    void open_msg() {
        fi_eq_attr eq_attr{};
        eq_attr.wait_obj = FI_WAIT_NONE;
        check_fi(fi_eq_open(fabric_, &eq_attr, &eq_, nullptr), "fi_eq_open");
        if (server_) {
            check_fi(fi_passive_ep(fabric_, info_, &pep_, nullptr), "fi_passive_ep");
            check_fi(fi_pep_bind(pep_, &eq_->fid, 0), "fi_pep_bind");
            check_fi(fi_listen(pep_), "fi_listen");
            std::vector<uint8_t> name(256);
            size_t len = name.size();
            check_fi(fi_getname(&pep_->fid, name.data(), &len), "fi_getname(pep)");
            ctrl_.send_blob(name.data(), static_cast<uint32_t>(len));
            fi_eq_cm_entry entry{};
            uint32_t event = wait_eq(&entry, "connection request");
            if (event != FI_CONNREQ) die("expected FI_CONNREQ, got event %u", event);
            int rc = fi_endpoint(domain_, entry.info, &ep_, nullptr);
            fi_freeinfo(entry.info);
            check_fi(rc, "fi_endpoint(accepted)");
            bind_msg_ep();
            check_fi(fi_accept(ep_, nullptr, 0), "fi_accept");
        } else {
            std::vector<uint8_t> name = ctrl_.recv_blob();
            check_fi(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
            bind_msg_ep();
            check_fi(fi_connect(ep_, name.data(), nullptr, 0), "fi_connect");
        }
        fi_eq_cm_entry entry{};
        uint32_t event = wait_eq(&entry, "connection");
        if (event != FI_CONNECTED) die("expected FI_CONNECTED, got event %u", event);
        peer_ = FI_ADDR_UNSPEC;
    }

    void bind_msg_ep() {
        check_fi(fi_ep_bind(ep_, &eq_->fid, 0), "fi_ep_bind(eq)");
        check_fi(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
        check_fi(fi_enable(ep_), "fi_enable");
    }

    uint32_t wait_eq(fi_eq_cm_entry *entry, const char *what) {
        uint32_t event = 0;
        for (uint64_t spins = 0;; ++spins) {
            ssize_t rd = fi_eq_read(eq_, &event, entry, sizeof *entry, 0);
            if (rd > 0) return event;
            if (rd == -FI_EAVAIL) {
                fi_eq_err_entry err{};
                fi_eq_readerr(eq_, &err, 0);
                die("%s failed: %s (prov: %s)", what, fi_strerror(err.err),
                    fi_eq_strerror(eq_, err.prov_errno, err.err_data, nullptr, 0));
            }
            if (rd != -FI_EAGAIN) check_fi(rd, "fi_eq_read");
            // Manual progress: the CQ may be what drives the connection.
            fi_cq_read(cq_, nullptr, 0);
            if ((spins & 0xfff) == 0 && ctrl_.peer_gone()) die("peer went away during %s", what);
        }
    }

    void alloc(Buffer *b, size_t len) {
        b->ptr = static_cast<uint8_t *>(std::aligned_alloc(4096, len));
        if (!b->ptr) die("out of memory (%zu bytes)", len);
        std::memset(b->ptr, 0, len);
        b->len = len;
    }

    void reg(Buffer *b, uint64_t requested_key) {
        if (!mr_local_ && !rma_ && !atomic_) return;  // nothing asks for registration
        uint64_t access = FI_SEND | FI_RECV;
        if (rma_ || atomic_) access |= FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
        check_fi(fi_mr_reg(domain_, b->ptr, b->len, access, 0, requested_key, 0, &b->mr, nullptr),
                 "fi_mr_reg");
        if (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) {
            check_fi(fi_mr_bind(b->mr, &ep_->fid, 0), "fi_mr_bind");
            check_fi(fi_mr_enable(b->mr), "fi_mr_enable");
        }
        b->desc = fi_mr_desc(b->mr);
    }

    Op *next_op(OpKind kind) {
        // Outstanding operations never exceed the window plus a few control messages.
        if (ops_.empty()) ops_.resize(4 * static_cast<size_t>(o_.window) + 16);
        Op *op = &ops_[op_next_++ % ops_.size()];
        op->kind = kind;
        return op;
    }

    template <class F>
    void retry(F post, const char *what) {
        for (uint64_t spins = 0;; ++spins) {
            ssize_t rc = post();
            if (rc == 0) return;
            if (rc != -FI_EAGAIN) check_fi(rc, what);
            poll_cq();
            if ((spins & 0xffff) == 0xffff && ctrl_.peer_gone()) die("peer went away");
        }
    }

    void poll_cq() {
        fi_cq_entry entries[32];
        ssize_t n = fi_cq_read(cq_, entries, 32);
        if (n > 0) {
            for (ssize_t i = 0; i < n; ++i) {
                Op *op = static_cast<Op *>(entries[i].op_context);
                if (op->kind == OpKind::kTx)
                    ++tx_done_;
                else
                    ++rx_done_;
            }
            return;
        }
        if (n == -FI_EAGAIN) return;
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            fi_cq_readerr(cq_, &err, 0);
            char buf[256];
            die("completion error: %s (%d), prov_errno %d: %s", fi_strerror(err.err), err.err,
                err.prov_errno, fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof buf));
        }
        check_fi(n, "fi_cq_read");
    }

    void teardown() {
        for (Buffer *b : {&tx_, &rx_, &ctl_tx_, &ctl_rx_}) {
            if (b->mr) fi_close(&b->mr->fid);
            std::free(b->ptr);
            b->mr = nullptr;
            b->ptr = nullptr;
        }
        if (ep_) fi_close(&ep_->fid);
        if (trigger_cntr_) fi_close(&trigger_cntr_->fid);
        if (pep_) fi_close(&pep_->fid);
        if (av_) fi_close(&av_->fid);
        if (cq_) fi_close(&cq_->fid);
        if (eq_) fi_close(&eq_->fid);
        if (domain_) fi_close(&domain_->fid);
        if (fabric_) fi_close(&fabric_->fid);
        if (info_) fi_freeinfo(info_);
        ep_ = nullptr;
        trigger_cntr_ = nullptr;
        pep_ = nullptr;
        av_ = nullptr;
        cq_ = nullptr;
        eq_ = nullptr;
        domain_ = nullptr;
        fabric_ = nullptr;
        info_ = nullptr;
    }

    const Options &o_;
    bool server_;
    Ctrl &ctrl_;
    fi_info *info_ = nullptr;
    bool tagged_ = false, rma_ = false, atomic_ = false, trigger_ = false, mr_local_ = false;
    uint64_t max_msg_ = 0;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_cq *cq_ = nullptr;
    fid_eq *eq_ = nullptr;
    fid_av *av_ = nullptr;
    fid_ep *ep_ = nullptr;
    fid_pep *pep_ = nullptr;
    fid_cntr *trigger_cntr_ = nullptr;
    fi_addr_t peer_ = FI_ADDR_UNSPEC;
    WireRmaTarget peer_rma_{};
    Buffer tx_, rx_, ctl_tx_, ctl_rx_;
    std::vector<Op> ops_;
    uint64_t op_next_ = 0;
    uint64_t tx_posted_ = 0, rx_posted_ = 0, tx_done_ = 0, rx_done_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The tests. "Initiator" is the client; "responder" is the server.

constexpr uint64_t kTagData = 0x1;
constexpr uint64_t kTagCtl = 0x2;

struct Counts {
    uint32_t warmup;
    uint32_t iters;
};

Counts latency_counts(uint64_t size, uint32_t fixed) {
    if (fixed) return {std::max<uint32_t>(1, fixed / 10), fixed};
    uint64_t n = (256ull << 20) / std::max<uint64_t>(size, 1);
    n = std::clamp<uint64_t>(n, 50, 10000);
    return {static_cast<uint32_t>(std::max<uint64_t>(n / 10, 2)), static_cast<uint32_t>(n)};
}

Counts bw_counts(uint64_t size, uint32_t window, uint32_t fixed) {
    if (fixed) return {std::max<uint32_t>(1, fixed / 10), fixed};
    uint64_t per_window = std::max<uint64_t>(size, 1) * window;
    uint64_t n = (1ull << 30) / per_window;
    n = std::clamp<uint64_t>(n, 8, 1000);
    return {static_cast<uint32_t>(std::max<uint64_t>(n / 10, 2)), static_cast<uint32_t>(n)};
}

void put_seq(uint8_t *buf, size_t size, uint64_t seq) {
    if (size >= sizeof seq) std::memcpy(buf, &seq, sizeof seq);
}
bool seq_ok(const uint8_t *buf, size_t size, uint64_t seq) {
    if (size < sizeof seq) return true;
    uint64_t got;
    std::memcpy(&got, buf, sizeof got);
    return got == seq;
}

// Ping-pong. Returns the mean half round trip in microseconds (initiator) and counts errors.
double run_latency(Fabric &f, bool initiator, size_t size, uint32_t fixed, int *errors) {
    Counts c = latency_counts(size, fixed);
    const uint32_t total = c.warmup + c.iters;
    const uint32_t my_seed =
        initiator ? 0xA5u + static_cast<uint32_t>(size) : 0x5Au + static_cast<uint32_t>(size);
    const uint32_t peer_seed =
        initiator ? 0x5Au + static_cast<uint32_t>(size) : 0xA5u + static_cast<uint32_t>(size);
    fill_pattern(f.tx().ptr, size, my_seed);
    std::memset(f.rx().ptr, 0, size);
    double t0 = 0;
    auto check = [&](uint32_t it) {
        if (!seq_ok(f.rx().ptr, size, it)) {
            if (*errors < 5)
                std::fprintf(stderr,
                             "latency %zu B: iteration %u carried a wrong sequence number\n", size,
                             it);
            ++*errors;
        }
        if (it == 0) {
            size_t bad = check_pattern(f.rx().ptr, size >= 8 ? 8 : 0, size, peer_seed);
            if (bad != size) {
                std::fprintf(stderr, "latency %zu B: received data differs at byte %zu\n", size,
                             bad);
                ++*errors;
            }
        }
    };
    if (initiator) {
        for (uint32_t it = 0; it < total; ++it) {
            if (it == c.warmup) t0 = now_us();
            f.post_recv(f.rx(), size, kTagData);
            put_seq(f.tx().ptr, size, it);
            f.post_send(f.tx(), size, kTagData);
            f.wait_all();
            check(it);
        }
        double t1 = now_us();
        return (t1 - t0) / c.iters / 2.0;
    }
    f.post_recv(f.rx(), size, kTagData);
    for (uint32_t it = 0; it < total; ++it) {
        f.wait_rx(f.rx_posted());
        check(it);
        if (it + 1 < total) f.post_recv(f.rx(), size, kTagData);
        put_seq(f.tx().ptr, size, it);
        f.post_send(f.tx(), size, kTagData);
        f.wait_tx(f.tx_posted());
    }
    return 0;
}

// Windowed streaming of tagged sends; the receiver acknowledges each window.
double run_tag_bw(Fabric &f, bool initiator, size_t size, uint32_t window, uint32_t fixed,
                  int *errors) {
    Counts c = bw_counts(size, window, fixed);
    const uint32_t total = c.warmup + c.iters;
    double t0 = 0;
    if (initiator) {
        fill_pattern(f.tx().ptr, size, 0xB0u + static_cast<uint32_t>(size));
        for (uint32_t w = 0; w < total; ++w) {
            if (w == c.warmup) t0 = now_us();
            f.post_recv(f.ctl_rx(), 8, kTagCtl);
            for (uint32_t i = 0; i < window; ++i) f.post_send(f.tx(), size, kTagData);
            f.wait_all();
        }
        double t1 = now_us();
        return static_cast<double>(size) * window * c.iters / (t1 - t0);  // bytes/us == MB/s
    }
    std::memset(f.rx().ptr, 0, size);
    for (uint32_t i = 0; i < window; ++i) f.post_recv(f.rx(), size, kTagData);
    for (uint32_t w = 0; w < total; ++w) {
        f.wait_rx(f.rx_posted());
        if (w == 0) {
            size_t bad = check_pattern(f.rx().ptr, 0, size, 0xB0u + static_cast<uint32_t>(size));
            if (bad != size) {
                std::fprintf(stderr, "bandwidth %zu B: received data differs at byte %zu\n", size,
                             bad);
                ++*errors;
            }
        }
        if (w + 1 < total)
            for (uint32_t i = 0; i < window; ++i) f.post_recv(f.rx(), size, kTagData);
        f.post_send(f.ctl_tx(), 8, kTagCtl);
        f.wait_tx(f.tx_posted());
    }
    return 0;
}

// RMA write: verify one transfer, then stream windows of fi_write; a tagged FIN/ACK closes it.
double run_rma_bw(Fabric &f, bool initiator, size_t size, uint32_t window, uint32_t fixed,
                  int *errors, bool *delivery_complete) {
    Counts c = bw_counts(size, window, fixed);
    const uint32_t total = c.warmup + c.iters;
    const uint32_t seed = 0xC0u + static_cast<uint32_t>(size);
    if (initiator) {
        // 1. Correctness: one write, made visible (FI_DELIVERY_COMPLETE when the provider has
        //    it), then a message that makes the target look at its buffer.
        fill_pattern(f.tx().ptr, size, seed);
        f.post_recv(f.ctl_rx(), 8, kTagCtl);
        // Some providers refuse FI_DELIVERY_COMPLETE on writes: then rely on the write
        // completing before the message that follows it (true of stream-based links).
        if (!*delivery_complete || !f.post_write_delivery_complete(size)) {
            *delivery_complete = false;
            f.post_write(size);
        }
        f.wait_tx(f.tx_posted());
        f.post_send(f.ctl_tx(), 8, kTagCtl);
        f.wait_all();  // the target's verdict arrives here; it counts its errors itself
        // 2. Timed windows.
        double t0 = 0;
        for (uint32_t w = 0; w < total; ++w) {
            if (w == c.warmup) t0 = now_us();
            for (uint32_t i = 0; i < window; ++i) f.post_write(size);
            f.wait_tx(f.tx_posted());
        }
        f.post_recv(f.ctl_rx(), 8, kTagCtl);
        f.post_send(f.ctl_tx(), 8, kTagCtl);
        f.wait_all();
        double t1 = now_us();
        return static_cast<double>(size) * window * c.iters / (t1 - t0);
    }
    // (The target buffer was cleared before the barrier: the initiator may write right after it.)
    f.post_recv(f.ctl_rx(), 8, kTagCtl);
    f.wait_rx(f.rx_posted());
    size_t bad = check_pattern(f.rx().ptr, 0, size, seed);
    int32_t status = 0;
    if (bad != size) {
        std::fprintf(stderr, "rma write %zu B: target buffer differs at byte %zu\n", size, bad);
        status = 1;
        ++*errors;
    }
    std::memcpy(f.ctl_tx().ptr, &status, sizeof status);
    f.post_send(f.ctl_tx(), 8, kTagCtl);
    f.wait_tx(f.tx_posted());
    // The writes need our progress (manual progress): poll until the FIN arrives.
    f.post_recv(f.ctl_rx(), 8, kTagCtl);
    f.wait_rx(f.rx_posted());
    f.post_send(f.ctl_tx(), 8, kTagCtl);
    f.wait_tx(f.tx_posted());
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Atomics: FI_UINT64 on the first word of the responder's rx buffer, which the responder zeroes
// before each test. The initiator's operands, compare values and results live in its tx buffer.
// Completions are the provider's default ones except for sum_dc_lat: a provider may complete a
// non-fetching atomic before the target executed it (shm does), so the rate test ends only when
// a fetch shows every operation applied, and the responder checks the final value every time.

enum AtomicSlot { kSlotOne, kSlotZero, kSlotSwap, kSlotCompare, kSlotResult };

uint64_t *atomic_slot(Fabric &f, AtomicSlot s) {
    return reinterpret_cast<uint64_t *>(f.tx().ptr) + s;
}

uint64_t target_word(Fabric &f) {
    return __atomic_load_n(reinterpret_cast<uint64_t *>(f.rx().ptr), __ATOMIC_ACQUIRE);
}

// Polls (fetch-add of 0) until the target holds `expected`; false after 5 s.
bool atomic_drain(Fabric &f, uint64_t expected, uint64_t *seen) {
    uint64_t *zero = atomic_slot(f, kSlotZero), *result = atomic_slot(f, kSlotResult);
    *zero = 0;
    const double start = now_us();
    for (;;) {
        *result = ~0ull;
        f.post_atomic(AtomicKind::kFetchSum, zero, nullptr, result);
        f.wait_tx(f.tx_posted());
        *seen = *result;
        if (*result == expected) return true;
        if (now_us() - start > 5e6) return false;
    }
}

// Initiator: one operation at a time, each timed from post to completion. Returns the median in
// microseconds (a busy-polling pair on a busy host loses whole time slices now and then; the
// median ignores them) and the mean in *mean, and sets the value the target must end with;
// returns -1 with the reason in *why if the provider refuses the first operation.
double atomic_latency(Fabric &f, AtomicKind kind, uint32_t fixed, int *errors, uint64_t *expected,
                      double *mean, std::string *why) {
    const Counts c = fixed ? Counts{std::max<uint32_t>(1, fixed / 10), fixed} : Counts{500, 5000};
    const uint32_t total = c.warmup + c.iters;
    uint64_t *one = atomic_slot(f, kSlotOne), *swap = atomic_slot(f, kSlotSwap);
    uint64_t *compare = atomic_slot(f, kSlotCompare), *result = atomic_slot(f, kSlotResult);
    *one = 1;
    std::vector<double> times;
    times.reserve(c.iters);
    for (uint32_t it = 0; it < total; ++it) {
        const double t0 = now_us();
        *compare = it;
        *swap = it + 1;
        *result = ~0ull;
        ssize_t rc =
            f.try_post_atomic(kind, kind == AtomicKind::kCswap ? swap : one, compare, result);
        if (rc < 0 && it == 0) {
            *why = std::string(Fabric::atomic_call(kind)) + ": " + fi_strerror(int(-rc));
            *expected = 0;
            return -1;
        }
        check_fi(rc, Fabric::atomic_call(kind));
        f.wait_tx(f.tx_posted());
        if (it >= c.warmup) times.push_back(now_us() - t0);
        if ((kind == AtomicKind::kFetchSum || kind == AtomicKind::kCswap) && *result != it) {
            if (*errors < 5)
                std::fprintf(stderr, "%s: operation %u fetched %" PRIu64 ", expected %u\n",
                             Fabric::atomic_call(kind), it, *result, it);
            ++*errors;
        }
    }
    *expected = total;
    double sum = 0;
    for (double t : times) sum += t;
    *mean = sum / static_cast<double>(times.size());
    const size_t mid = times.size() / 2;
    std::nth_element(times.begin(), times.begin() + mid, times.end());
    double median = times[mid];
    if (times.size() % 2 == 0)
        median = (median + *std::max_element(times.begin(), times.begin() + mid)) / 2;
    return median;
}

// Initiator: fi_atomic FI_SUM with `window` in flight (a new one as soon as one completes).
// Returns operations per second, timed until a fetch shows them all applied at the target
// (when the provider can fetch; otherwise until the last completion).
double atomic_rate(Fabric &f, uint32_t window, uint32_t fixed, bool can_fetch, int *errors,
                   uint64_t *expected, double *overall) {
    const uint64_t ops = fixed ? uint64_t{fixed} * window : 30000;
    const uint64_t warmup = std::max<uint64_t>(window, ops / 10);
    uint64_t *one = atomic_slot(f, kSlotOne);
    *one = 1;
    auto stream = [&](uint64_t n) {
        for (uint64_t i = 0; i < n; ++i) {
            if (f.tx_posted() - f.tx_done() >= window) f.wait_tx(f.tx_posted() - window + 1);
            f.post_atomic(AtomicKind::kSum, one, nullptr, nullptr);
        }
        f.wait_tx(f.tx_posted());
    };
    auto drain = [&](uint64_t want) {
        uint64_t seen = 0;
        if (can_fetch && !atomic_drain(f, want, &seen)) {
            std::fprintf(stderr,
                         "atomic rate: the target holds %" PRIu64 ", expected %" PRIu64 "\n", seen,
                         want);
            ++*errors;
        }
    };
    stream(warmup);
    drain(warmup);
    // Timed in chunks (the last one ends with the drain); the median chunk rate is what a time
    // slice lost to another process does not move.
    const uint64_t chunks = std::min<uint64_t>(10, ops);
    std::vector<double> rates;
    const double t0 = now_us();
    double t = t0;
    for (uint64_t k = 0; k < chunks; ++k) {
        const uint64_t n = k + 1 < chunks ? ops / chunks : ops - (chunks - 1) * (ops / chunks);
        stream(n);
        if (k + 1 == chunks) drain(warmup + ops);
        const double now = now_us();
        rates.push_back(static_cast<double>(n) / ((now - t) / 1e6));
        t = now;
    }
    *expected = warmup + ops;
    *overall = static_cast<double>(ops) / ((t - t0) / 1e6);
    std::sort(rates.begin(), rates.end());
    const size_t mid = rates.size() / 2;
    return rates.size() % 2 ? rates[mid] : (rates[mid - 1] + rates[mid]) / 2;
}

// Both sides: the atomic tests the configuration asks for, each framed by barriers; the client
// prints one "atomic KEY VALUE UNIT" line per test.
void run_atomics(Fabric &f, bool is_server, const Options &o, int *errors) {
    struct Test {
        const char *key;
        AtomicKind kind;
        bool rate;
    };
    const Test tests[] = {{"fetch_sum_lat", AtomicKind::kFetchSum, false},
                          {"sum_lat", AtomicKind::kSum, false},
                          {"sum_dc_lat", AtomicKind::kSumDelivery, false},
                          {"cswap_lat", AtomicKind::kCswap, false},
                          {"sum_rate", AtomicKind::kSum, true}};
    if (!is_server) {
        std::printf(
            "# atomics on one FI_UINT64 word of the peer's registered memory:\n"
            "#   *_lat: us from post to completion, one at a time; median of the operations\n"
            "#          (their mean after it); lower is better. sum_lat is plain fi_atomic,\n"
            "#          which a provider may complete once queued; sum_dc_lat asks for\n"
            "#          FI_DELIVERY_COMPLETE, a round trip on every provider.\n"
            "#   sum_rate: fi_atomic FI_SUM per second, %u in flight; median of 10 chunks\n"
            "#          (overall after it, until a fetch shows all applied); higher is better\n",
            o.window);
        std::fflush(stdout);
    }
    const bool can_fetch = !is_server && f.atomic_unsupported(AtomicKind::kFetchSum).empty();
    for (const Test &t : tests) {
        if (!(o.tests & (t.rate ? kTestAtomicRate : kTestAtomicLat))) continue;
        if (o.verbose) std::fprintf(stderr, "tandem_bench[%s]: atomic %s\n", g_role, t.key);
        const int before = *errors;
        // 1. The responder clears the target word; the initiator says whether it can go.
        std::string why;
        uint64_t go = 0;
        if (is_server) {
            __atomic_store_n(reinterpret_cast<uint64_t *>(f.rx().ptr), 0, __ATOMIC_RELEASE);
            f.sync_u64(0, &go);
        } else {
            why = f.atomic_unsupported(t.kind);
            uint64_t ignored;
            f.sync_u64(why.empty() ? 1 : 0, &ignored);
            go = why.empty();
        }
        if (!go) {
            if (!is_server)
                std::printf("  atomic %-14s %12s %-6s (%s)\n", t.key, "n/a",
                            t.rate ? "ops/s" : "us", why.c_str());
            continue;
        }
        // 2. The initiator measures; the responder only progresses (inside the barrier).
        double value = 0, mean = 0;
        uint64_t expected = 0;
        if (is_server) {
            f.sync_u64(0, &expected);
            uint64_t seen = target_word(f);
            const double start = now_us();
            while (seen != expected && now_us() - start < 5e6) {
                f.poll();
                seen = target_word(f);
            }
            if (seen != expected) {
                std::fprintf(stderr,
                             "atomic %s: the target holds %" PRIu64 ", expected %" PRIu64 "\n",
                             t.key, seen, expected);
                ++*errors;
            }
        } else {
            value = t.rate ? atomic_rate(f, o.window, o.iters, can_fetch, errors, &expected, &mean)
                           : atomic_latency(f, t.kind, o.iters, errors, &expected, &mean, &why);
            uint64_t ignored;
            f.sync_u64(expected, &ignored);
        }
        // 3. The responder's verdict.
        int32_t peer_err = 0;
        f.sync_int(*errors - before, &peer_err);
        if (!is_server) {
            *errors += peer_err;
            if (value < 0) {
                std::printf("  atomic %-14s %12s %-6s (%s)\n", t.key, "n/a",
                            t.rate ? "ops/s" : "us", why.c_str());
                continue;
            }
            char extra[48] = "";
            if (t.rate)
                std::snprintf(extra, sizeof extra, " overall %.0f", mean);
            else
                std::snprintf(extra, sizeof extra, " mean %.2f", mean);
            std::printf("  atomic %-14s %12.*f %-6s%s%s\n", t.key, t.rate ? 0 : 2, value,
                        t.rate ? "ops/s" : "us", extra, *errors != before ? "   DATA ERROR" : "");
            std::fflush(stdout);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Triggered sends: an 8-byte ping-pong whose initiator sends either directly at t0 or through
// an FI_TRIGGER send posted beforehand and started at t0 by fi_cntr_add on its counter. The
// iterations alternate between the two, so that what the machine does meanwhile hits both.

double median_and_mean(std::vector<double> v, double *mean) {
    double sum = 0;
    for (double t : v) sum += t;
    *mean = sum / static_cast<double>(v.size());
    const size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + mid, v.end());
    double median = v[mid];
    if (v.size() % 2 == 0) median = (median + *std::max_element(v.begin(), v.begin() + mid)) / 2;
    return median;
}

// Both sides; the client prints "trigger KEY VALUE us mean M" for send_direct_lat and
// send_trig_lat, or n/a for both where the endpoint has no FI_TRIGGER.
void run_trigger(Fabric &f, bool is_server, const Options &o, int *errors) {
    constexpr size_t kSize = 8;
    constexpr double kReplyTimeoutUs = 10e6;
    const Counts c =
        o.iters ? Counts{std::max<uint32_t>(1, o.iters / 10), o.iters} : Counts{500, 5000};
    const uint32_t total = 2 * (c.warmup + c.iters);  // direct and triggered, alternating
    if (!is_server) {
        std::printf(
            "# trigger: 8 B %s ping-pong, half round trip in us; median of %u iterations each\n"
            "#          (their mean after it), direct and triggered alternating.\n"
            "#          send_direct_lat: the send is posted at t0; send_trig_lat: it was posted\n"
            "#          beforehand with FI_TRIGGER on a counter (threshold k in the k-th\n"
            "#          triggered iteration) and fi_cntr_add(cntr, 1) at t0 starts it. The\n"
            "#          difference is the time from the counter reaching its threshold to the\n"
            "#          send leaving: trigger overhead on the path to the peer.\n",
            f.tagged() ? "tagged" : "untagged", c.iters);
        std::fflush(stdout);
    }
    if (o.verbose) std::fprintf(stderr, "tandem_bench[%s]: trigger\n", g_role);
    const char *keys[] = {"send_direct_lat", "send_trig_lat"};
    // The initiator says whether it can go.
    uint64_t go = 0;
    if (is_server) {
        f.sync_u64(0, &go);
    } else {
        uint64_t ignored;
        go = f.trigger() ? 1 : 0;
        f.sync_u64(go, &ignored);
    }
    if (!go) {
        if (!is_server)
            for (const char *key : keys)
                std::printf("  trigger %-15s %12s %-6s (%s)\n", key, "n/a", "us", "no FI_TRIGGER");
        return;
    }
    const int before = *errors;
    auto check = [&](uint32_t it) {
        if (!seq_ok(f.rx().ptr, kSize, it)) {
            if (*errors - before < 5)
                std::fprintf(stderr, "trigger: iteration %u carried a wrong sequence number\n", it);
            ++*errors;
        }
    };
    if (is_server) {
        f.post_recv(f.rx(), kSize, kTagData);
        for (uint32_t it = 0; it < total; ++it) {
            f.wait_rx(f.rx_posted());
            check(it);
            if (it + 1 < total) f.post_recv(f.rx(), kSize, kTagData);
            put_seq(f.tx().ptr, kSize, it);
            f.post_send(f.tx(), kSize, kTagData);
            f.wait_tx(f.tx_posted());
        }
        int32_t ignored;
        f.sync_int(*errors - before, &ignored);
        return;
    }
    fid_cntr *cntr = f.trigger_cntr();
    uint64_t threshold = fi_cntr_read(cntr);
    std::vector<double> times[2];
    times[0].reserve(c.iters);
    times[1].reserve(c.iters);
    for (uint32_t it = 0; it < total; ++it) {
        const bool triggered = it % 2 == 1;
        f.post_recv(f.rx(), kSize, kTagData);
        put_seq(f.tx().ptr, kSize, it);
        double t0;
        if (triggered) {
            f.post_send_msg(f.tx(), kSize, kTagData, cntr, ++threshold);
            // The first few times, make sure the send really waits for its threshold (a
            // provider that started it at once would show no reply yet less overhead).
            if (it < 8) {
                const uint64_t rx_before = f.rx_done(), tx_before = f.tx_done();
                const double start = now_us();
                while (now_us() - start < 1000) f.poll();
                if (f.rx_done() != rx_before || f.tx_done() != tx_before) {
                    std::fprintf(stderr,
                                 "trigger: iteration %u: the send completed before its counter "
                                 "reached the threshold %" PRIu64 "\n",
                                 it, threshold);
                    ++*errors;
                }
            }
            t0 = now_us();
            check_fi(fi_cntr_add(cntr, 1), "fi_cntr_add");
        } else {
            t0 = now_us();
            f.post_send_msg(f.tx(), kSize, kTagData);
        }
        if (!f.wait_rx_for(f.rx_posted(), kReplyTimeoutUs))
            die("trigger: iteration %u (%s send): no reply after %.0f s; counter %" PRIu64
                " (threshold %" PRIu64 "), sends completed %" PRIu64 " of %" PRIu64
                ", receives %" PRIu64 " of %" PRIu64,
                it, triggered ? "triggered" : "direct", kReplyTimeoutUs / 1e6, fi_cntr_read(cntr),
                threshold, f.tx_done(), f.tx_posted(), f.rx_done(), f.rx_posted());
        const double t1 = now_us();
        f.wait_tx(f.tx_posted());
        check(it);
        if (it >= 2 * c.warmup) times[triggered].push_back((t1 - t0) / 2);
    }
    int32_t peer_err = 0;
    f.sync_int(*errors - before, &peer_err);
    *errors += peer_err;
    for (int k = 0; k < 2; ++k) {
        double mean = 0;
        const double median = median_and_mean(times[k], &mean);
        std::printf("  trigger %-15s %12.2f %-6s mean %.2f%s\n", keys[k], median, "us", mean,
                    *errors != before ? "   DATA ERROR" : "");
    }
    std::fflush(stdout);
}

int run(const Options &o, bool is_server, int ctrl_fd) {
    if (o.timeout_s) {  // per process: a forked child does not inherit the parent's alarm
        signal(SIGALRM, on_alarm);
        alarm(o.timeout_s);
    }
    Ctrl ctrl(ctrl_fd);
    Options eff = o;

    // The client's configuration goes to the server.
    WireConfig cfg{};
    if (!is_server) {
        cfg.magic = kMagic;
        cfg.version = kWireVersion;
        std::snprintf(cfg.prov, sizeof cfg.prov, "%s", o.prov.c_str());
        std::snprintf(cfg.domain, sizeof cfg.domain, "%s", o.domain.c_str());
        std::snprintf(cfg.ep, sizeof cfg.ep, "%s", o.ep.c_str());
        cfg.tests = o.tests;
        cfg.window = o.window;
        cfg.iters = o.iters;
        cfg.nsizes = static_cast<uint32_t>(o.sizes.size());
        for (size_t i = 0; i < o.sizes.size(); ++i) cfg.sizes[i] = o.sizes[i];
        ctrl.send_blob(&cfg, sizeof cfg);
    } else {
        std::vector<uint8_t> b = ctrl.recv_blob();
        if (b.size() != sizeof cfg) die("control: the client speaks another version");
        std::memcpy(&cfg, b.data(), sizeof cfg);
        if (cfg.magic != kMagic || cfg.version != kWireVersion || cfg.nsizes > kMaxSizes)
            die("control: the client speaks another version");
        cfg.prov[sizeof cfg.prov - 1] = cfg.domain[sizeof cfg.domain - 1] =
            cfg.ep[sizeof cfg.ep - 1] = 0;
        if (!o.prov_given) eff.prov = cfg.prov;
        if (!o.domain_given) eff.domain = cfg.domain;
        if (!o.ep_given) eff.ep = cfg.ep;
        eff.tests = cfg.tests;
        eff.window = cfg.window;
        eff.iters = cfg.iters;
        eff.sizes.assign(cfg.sizes, cfg.sizes + cfg.nsizes);
    }

    Fabric f(eff, is_server, ctrl);
    f.select((eff.tests & kTestRma) != 0, (eff.tests & kAtomicTests) != 0,
             (eff.tests & kTestTrigger) != 0);
    f.agree_with_peer();
    f.open();
    const bool size_tests = (eff.tests & kSizeTests) != 0;
    uint64_t max_size = size_tests ? *std::max_element(eff.sizes.begin(), eff.sizes.end()) : 64;
    max_size = std::min<uint64_t>(max_size, f.max_msg());
    f.register_buffers(max_size);

    const fi_info *info = f.info();
    if (!is_server) {
        std::printf("# tandem_bench: provider %s, fabric %s, domain %s, ep %s, %s, window %u\n",
                    info->fabric_attr->prov_name, info->fabric_attr->name, info->domain_attr->name,
                    info->ep_attr->type == FI_EP_MSG ? "msg" : "rdm",
                    f.tagged() ? "tagged sends" : "untagged sends (no FI_TAGGED)", eff.window);
        std::printf("# mr_mode%s%s%s%s%s, progress %s; RMA %s; atomics %s\n",
                    (info->domain_attr->mr_mode & FI_MR_LOCAL) ? " LOCAL" : "",
                    (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? " VIRT_ADDR" : "",
                    (info->domain_attr->mr_mode & FI_MR_PROV_KEY) ? " PROV_KEY" : "",
                    (info->domain_attr->mr_mode & FI_MR_ENDPOINT) ? " ENDPOINT" : "",
                    (info->domain_attr->mr_mode & FI_MR_ALLOCATED) ? " ALLOCATED" : "",
                    info->domain_attr->data_progress == FI_PROGRESS_MANUAL ? "manual" : "auto",
                    !(eff.tests & kTestRma) ? "not tested"
                    : f.rma()               ? "yes"
                                            : "not offered",
                    !(eff.tests & kAtomicTests) ? "not tested"
                    : f.atomic()                ? "yes"
                                                : "not offered");
        if (size_tests)
            std::printf("# %10s %12s %14s %14s\n", "size", "lat_us",
                        f.tagged() ? "tag_bw_MB/s" : "msg_bw_MB/s", "rma_bw_MB/s");
        std::fflush(stdout);
    }

    int errors = 0;
    bool delivery_complete = true;
    for (uint64_t size : eff.sizes) {
        if (!size_tests) break;
        if (size > f.max_msg()) {
            if (!is_server)
                std::printf("  %10" PRIu64 " %12s %14s %14s   (above max_msg_size)\n", size, "-",
                            "-", "-");
            continue;
        }
        double lat = -1, bw = -1, rma = -1;
        int32_t peer_err = 0;
        int before = errors;
        auto trace = [&](const char *test) {
            if (eff.verbose)
                std::fprintf(stderr, "tandem_bench[%s]: %s %" PRIu64 " B\n", g_role, test, size);
        };
        if (eff.tests & kTestLat) {
            trace("latency");
            f.sync_int(0, &peer_err);
            lat = run_latency(f, !is_server, size, eff.iters, &errors);
        }
        if (eff.tests & kTestBw) {
            trace("tagged bandwidth");
            f.sync_int(0, &peer_err);
            bw = run_tag_bw(f, !is_server, size, eff.window, eff.iters, &errors);
        }
        // (A zero-byte RMA write is skipped: some providers, shm among them, never complete it.)
        if ((eff.tests & kTestRma) && f.rma() && size > 0) {
            trace("rma write bandwidth");
            if (is_server) std::memset(f.rx().ptr, 0, size);  // before the barrier
            f.sync_int(0, &peer_err);
            rma =
                run_rma_bw(f, !is_server, size, eff.window, eff.iters, &errors, &delivery_complete);
        }
        f.sync_int(errors - before, &peer_err);
        errors += is_server ? 0 : peer_err;
        if (!is_server) {
            auto col = [](double v, const char *fmt, char *buf, size_t n) {
                if (v < 0)
                    std::snprintf(buf, n, "-");
                else
                    std::snprintf(buf, n, fmt, v);
                return buf;
            };
            char a[32], b[32], d[32];
            std::printf("  %10" PRIu64 " %12s %14s %14s%s\n", size, col(lat, "%.3f", a, sizeof a),
                        col(bw, "%.1f", b, sizeof b), col(rma, "%.1f", d, sizeof d),
                        errors != before ? "   DATA ERROR" : "");
            std::fflush(stdout);
        }
    }
    if (eff.tests & kAtomicTests) run_atomics(f, is_server, eff, &errors);
    if (eff.tests & kTestTrigger) run_trigger(f, is_server, eff, &errors);
    int32_t peer_total = 0;
    f.sync_int(errors, &peer_total);
    // After the transfers, so that the path reported is the one they took.
    if (std::string path = f.peer_path(); !path.empty()) std::printf("# path: %s\n", path.c_str());
    if (!is_server) {
        if (errors)
            std::printf("# FAIL: %d data verification error(s)\n", errors);
        else
            std::printf("# all transfers verified\n");
    }
    return errors ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
    tandem_bench::g_program = "tandem_bench";
    Options o = parse_options(argc, argv);
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (o.server) {
        tandem_bench::set_role("server");
        int fd = listen_and_accept(o.host, o.port);
        return run(o, true, fd);
    }
    if (o.client) {
        tandem_bench::set_role("client");
        int fd = connect_retry(o.host, o.port);
        return run(o, false, fd);
    }
    // Fork mode: the child serves, the parent measures and prints. libfabric is initialised
    // only after the fork, in each process.
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) die("socketpair: %s", std::strerror(errno));
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", std::strerror(errno));
    if (pid == 0) {
        close(sv[0]);
        tandem_bench::set_role("server");
        std::_Exit(run(o, true, sv[1]));
    }
    close(sv[1]);
    tandem_bench::set_role("client");
    int rc = run(o, false, sv[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "tandem_bench: the server process failed (status 0x%x)\n", status);
        if (rc == 0) rc = 2;
    }
    return rc;
}

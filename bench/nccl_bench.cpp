// nccl_bench: bandwidth through the NCCL network plugin, measured as tandem_bench measures
// tandem's raw tagged bandwidth, so that scripts/bench.sh --nccl can set the two side by side.
//
//   nccl_bench [-S SIZES] [-w WINDOW] [-i WINDOWS] [-v DEVS] [-n RECV_NS,SEND_NS]
//
// -v 0,1 fuses those plugin devices with makeVDevice and carries the data over the virtual
// NIC (the acknowledgements stay on device 0); -n runs the receiver in the first named network
// namespace (/var/run/netns/NAME, as `ip netns add` makes them) and the sender in the second.
//
// Forks a receiver and a sender. Each loads the plugin as NCCL does
// (dlopen "libnccl-net-${NCCL_NET_PLUGIN:-tandem}.so", symbol ncclNetPlugin_v12) and plays the
// part of NCCL's proxy thread: listen / connect / accept, a data connection to the receiver
// and an acknowledgement connection back, both with host buffers registered once.
// Per size: windows of WINDOW isends of one buffer against WINDOW irecvs of one buffer (the
// same single buffers tandem_bench uses), the receiver reposting its next window and then
// acknowledging the window with an 8-byte send; the sender's clock runs from the first timed
// window to the last acknowledgement. Window and iteration counts follow tandem_bench's rules
// (bw_counts). The first window's data is checked, and every received size.
//
// Output: "# size plugin_bw_MB/s" and one line per size (1 MB = 10^6 bytes).

#include "bench/bench_common.h"
#include "nccl_plugin/nccl_net_abi.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

using namespace tandem::nccl;

namespace {

[[noreturn]] void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nccl_bench[%d]: ", getpid());
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    _exit(1);
}

void logger(LogLevel level, unsigned long, const char *, int, const char *fmt, ...) {
    if (level != kLogWarn) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nccl_bench[%d]: plugin: ", getpid());
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

#define CHECK(call)                                                           \
    do {                                                                      \
        Result r_ = (call);                                                   \
        if (r_ != kSuccess) die("%s failed: NCCL result %d", #call, int(r_)); \
    } while (0)

double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

struct Options {
    std::vector<uint64_t> sizes{64 << 10, 1 << 20, 16 << 20};
    int window = 32;
    unsigned fixed = 0;
};

// tandem_bench's bw_counts: about 1 GiB per size, at least 8 and at most 1000 windows.
void counts(uint64_t size, int window, unsigned fixed, unsigned *warmup, unsigned *iters) {
    uint64_t n = fixed ? fixed : std::clamp<uint64_t>((1ull << 30) / (size * window), 8, 1000);
    *iters = unsigned(n);
    *warmup = std::max<unsigned>(unsigned(n / 10), fixed ? 1 : 2);
}

void full_write(int fd, const void *buf, size_t len) {
    if (write(fd, buf, len) != ssize_t(len)) die("control socket write failed");
}
void full_read(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, static_cast<char *>(buf) + got, len - got);
        if (n <= 0) die("control socket read failed");
        got += size_t(n);
    }
}

VirtualDevicePropsV12 g_vdevs{};  // -v: the devices to fuse
std::string g_netns[2];           // -n: the receiver's and the sender's network namespace

// Enters network namespace `name` (before the plugin is loaded: its endpoints live there).
void enter_netns(const std::string &name) {
    if (name.empty()) return;
    std::string path = "/var/run/netns/" + name;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
        die("entering %s: %s", path.c_str(), strerror(errno));
    close(fd);
}

// "a,b" into its two parts.
void split_pair(const char *arg, std::string *a, std::string *b) {
    std::string s = arg;
    size_t comma = s.find(',');
    if (comma == std::string::npos) die("expected two comma-separated names: %s", arg);
    *a = s.substr(0, comma);
    *b = s.substr(comma + 1);
}

struct Plugin {
    NetV12 *net = nullptr;
    void *ctx = nullptr;
    int data_dev = 0;

    Plugin() {
        const char *name = getenv("NCCL_NET_PLUGIN");
        std::string lib = std::string("libnccl-net-") + (name && *name ? name : "tandem") + ".so";
        void *h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) die("dlopen(%s): %s", lib.c_str(), dlerror());
        net = static_cast<NetV12 *>(dlsym(h, NetV12::kSymbol));
        if (!net) die("%s has no ncclNetPlugin_v12", lib.c_str());
        CommConfig config{-1};
        CHECK(net->init(&ctx, 1, &config, logger, nullptr));
        if (g_vdevs.ndevs) CHECK(net->make_vdevice(&data_dev, &g_vdevs));
    }

    // Receiving end of a connection whose sender is the other process.
    void *accept_from(int sock, int dev) {
        char handle[kHandleMaxSize];
        void *listen = nullptr, *comm = nullptr;
        DeviceHandle *dh = nullptr;
        CHECK(net->listen(ctx, dev, handle, &listen));
        full_write(sock, handle, sizeof handle);
        while (!comm) CHECK(net->accept(listen, &comm, &dh));
        CHECK(net->close_listen(listen));
        return comm;
    }
    void *connect_to(int sock, int dev) {
        char handle[kHandleMaxSize];
        full_read(sock, handle, sizeof handle);
        void *comm = nullptr;
        DeviceHandle *dh = nullptr;
        while (!comm) CHECK(net->connect(ctx, dev, handle, &comm, &dh));
        return comm;
    }
    void *isend(void *comm, void *data, size_t size, void *mh) {
        void *req = nullptr;
        while (!req) CHECK(net->isend(comm, data, size, 0, mh, nullptr, &req));
        return req;
    }
    void *irecv(void *comm, void *data, size_t size, void *mh) {
        void *req = nullptr;
        int tag = 0;
        while (!req) CHECK(net->irecv(comm, 1, &data, &size, &tag, &mh, nullptr, &req));
        return req;
    }
    int wait(void *req) {
        int done = 0, size = -1;
        while (!done) CHECK(net->test(req, &done, &size));
        return size;
    }
};

uint8_t pattern(uint64_t i, uint64_t size) {
    return uint8_t(i * 131 + size * 7 + 1);
}

// A process's two connections (data: sender to receiver; ack: back) with their registered
// buffers, set up in the order the other process expects, and closed at the end.
struct Connections {
    Plugin p;
    bool receiving;
    void *data = nullptr, *ack = nullptr, *mh = nullptr, *ack_mh = nullptr;
    std::vector<uint8_t> buf, word = std::vector<uint8_t>(8);

    Connections(int sock, const Options &o, bool receiving_) : receiving(receiving_) {
        if (receiving) {
            data = p.accept_from(sock, p.data_dev);
            ack = p.connect_to(sock, 0);
        } else {
            data = p.connect_to(sock, p.data_dev);
            ack = p.accept_from(sock, 0);
        }
        buf.resize(*std::max_element(o.sizes.begin(), o.sizes.end()));
        CHECK(p.net->reg_mr(data, buf.data(), buf.size(), kPtrHost, &mh));
        CHECK(p.net->reg_mr(ack, word.data(), word.size(), kPtrHost, &ack_mh));
    }
    ~Connections() {
        CHECK(p.net->dereg_mr(data, mh));
        CHECK(p.net->dereg_mr(ack, ack_mh));
        CHECK(receiving ? p.net->close_recv(data) : p.net->close_send(data));
        CHECK(receiving ? p.net->close_send(ack) : p.net->close_recv(ack));
        CHECK(p.net->finalize(p.ctx));
    }
};

void receiver(int sock, const Options &o) {
    Connections c(sock, o, true);
    Plugin &p = c.p;
    void *data = c.data, *ack = c.ack, *mh = c.mh, *ack_mh = c.ack_mh;
    std::vector<uint8_t> &buf = c.buf, &word = c.word;
    std::vector<void *> reqs(size_t(o.window));
    for (uint64_t size : o.sizes) {
        unsigned warmup, iters;
        counts(size, o.window, o.fixed, &warmup, &iters);
        std::fill(buf.begin(), buf.begin() + long(size), 0);
        for (auto &r : reqs) r = p.irecv(data, buf.data(), size, mh);
        for (unsigned w = 0; w < warmup + iters; ++w) {
            for (void *r : reqs)
                if (uint64_t got = uint64_t(p.wait(r)); got != size)
                    die("%llu B: a receive reported %llu B", (unsigned long long)size,
                        (unsigned long long)got);
            if (w == 0)
                for (uint64_t i = 0; i < size; ++i)
                    if (buf[i] != pattern(i, size))
                        die("%llu B: received data differs at byte %llu", (unsigned long long)size,
                            (unsigned long long)i);
            if (w + 1 < warmup + iters)
                for (auto &r : reqs) r = p.irecv(data, buf.data(), size, mh);
            p.wait(p.isend(ack, word.data(), word.size(), ack_mh));
        }
    }
}

void sender(int sock, const Options &o) {
    Connections c(sock, o, false);
    Plugin &p = c.p;
    void *data = c.data, *ack = c.ack, *mh = c.mh, *ack_mh = c.ack_mh;
    std::vector<uint8_t> &buf = c.buf, &word = c.word;
    std::vector<void *> reqs(size_t(o.window));
    printf("# %12s %14s\n", "size", "plugin_bw_MB/s");
    for (uint64_t size : o.sizes) {
        unsigned warmup, iters;
        counts(size, o.window, o.fixed, &warmup, &iters);
        for (uint64_t i = 0; i < size; ++i) buf[i] = pattern(i, size);
        double t0 = 0;
        for (unsigned w = 0; w < warmup + iters; ++w) {
            if (w == warmup) t0 = now_us();
            void *ack_req = p.irecv(ack, word.data(), word.size(), ack_mh);
            for (auto &r : reqs) r = p.isend(data, buf.data(), size, mh);
            for (void *r : reqs) p.wait(r);
            p.wait(ack_req);
        }
        double us = now_us() - t0;
        printf("  %12llu %14.1f\n", (unsigned long long)size, double(size) * o.window * iters / us);
        fflush(stdout);
    }
}

void usage() {
    fprintf(stderr,
            "usage: nccl_bench [-S SIZES] [-w WINDOW] [-i WINDOWS]\n"
            "  -S SIZES   comma list (64k,1m,16m; the default)\n"
            "  -w WINDOW  sends in flight (default 32, NCCL_NET_MAX_REQUESTS)\n"
            "  -i N       timed windows per size (default: about 1 GiB's worth, 8 to 1000)\n"
            "  -v DEVS    fuse these devices (makeVDevice) and send the data over the vNIC\n"
            "  -n RX,TX   the receiver's and the sender's network namespaces\n");
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    for (int c; (c = getopt(argc, argv, "S:w:i:v:n:h")) != -1;) {
        switch (c) {
            case 'S': {
                o.sizes.clear();
                std::string list = optarg;
                for (size_t pos = 0; pos <= list.size();) {
                    size_t comma = std::min(list.find(',', pos), list.size());
                    uint64_t v;
                    if (!tandem_bench::parse_size(list.substr(pos, comma - pos), &v) || v == 0)
                        die("bad size list %s", optarg);
                    o.sizes.push_back(v);
                    pos = comma + 1;
                }
                break;
            }
            case 'w':
                o.window = atoi(optarg);
                if (o.window < 1 || o.window > kMaxRequests) die("bad -w %s (1..32)", optarg);
                break;
            case 'i':
                o.fixed = unsigned(atoi(optarg));
                break;
            case 'v':
                for (const char *p = optarg; *p && g_vdevs.ndevs < kMaxDevsPerNicV12;) {
                    g_vdevs.devs[g_vdevs.ndevs++] = atoi(p);
                    p = strchr(p, ',');
                    if (!p) break;
                    ++p;
                }
                break;
            case 'n':
                split_pair(optarg, &g_netns[0], &g_netns[1]);
                break;
            default:
                usage();
                return c == 'h' ? 0 : 1;
        }
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair failed");
    pid_t pid = fork();
    if (pid < 0) die("fork failed");
    alarm(300);  // a watchdog in each process (alarms are not inherited)
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a sender that died
        close(sv[0]);
        enter_netns(g_netns[0]);
        receiver(sv[1], o);
        _exit(0);
    }
    close(sv[1]);
    enter_netns(g_netns[1]);
    sender(sv[0], o);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) die("the receiver failed (status %d)", status);
    return 0;
}

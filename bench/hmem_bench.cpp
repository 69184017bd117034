// hmem_bench: GPU-memory transfers through tandem, under each FI_OPT_FI_HMEM_P2P policy.
//
//   hmem_bench [-n ITERS] [-s SIZE,SIZE,...]
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
#include "hmem/cuda_abi.h"
#include "tests/emucuda/emucuda_control.h"  // (only looked up: absent from a real driver)

#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
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

}  // namespace

int main(int argc, char **argv) {
    int iters = 200;
    std::vector<size_t> sizes = {8, 4096, 65536, 1 << 20, 4 << 20};
    for (int c; (c = getopt(argc, argv, "n:s:h")) != -1;) {
        if (c == 'n')
            iters = atoi(optarg);
        else if (c == 's') {
            sizes.clear();
            for (char *tok = strtok(optarg, ","); tok; tok = strtok(nullptr, ","))
                sizes.push_back(strtoull(tok, nullptr, 0));
        } else {
            fprintf(stderr, "usage: %s [-n ITERS] [-s SIZE,...]\n", argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
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

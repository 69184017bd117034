// mem_bench: the resident memory an endpoint costs, alone and with 1, 16, 64... peers.
//
//   mem_bench -p PROV [-d DOMAIN] [-n 1,16,64] [-T SECONDS]
//
// For each peer count N, two fresh processes (forked, joined by a socketpair that carries
// only endpoint names and "done" bytes):
//   - the measured one reads its resident memory (VmRSS) after fi_getinfo, so that loading
//     libfabric and its providers is the baseline, not the figure; opens a fabric, domain,
//     CQ, AV and one RDM endpoint; reads VmRSS again ("endpoint"); inserts the N peers,
//     takes one 8-byte tagged message from each and answers each with one (every connection,
//     segment mapping and per-peer state then exists on both paths); reads VmRSS again;
//   - the other holds the N peers: N endpoints of one domain, CQ and AV.
// Prints "mem N endpoint_kib with_peers_kib" per count (KiB over the baseline), shared
// memory the process touched included (VmRSS counts it): a node-local provider's rings
// count where they are used.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char *g_role = "mem_bench";

[[noreturn]] void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "mem_bench[%s]: error: ", g_role);
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    std::_Exit(2);
}

void check(long rc, const char *what) {
    if (rc < 0) die("%s: %s (%ld)", what, fi_strerror(int(-rc)), rc);
}

long rss_kib() {
    FILE *f = std::fopen("/proc/self/status", "r");
    if (!f) die("/proc/self/status: %s", std::strerror(errno));
    char line[256];
    long kib = -1;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    std::fclose(f);
    return kib;
}

void send_all(int fd, const void *p, size_t n) {
    auto *c = static_cast<const char *>(p);
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) die("control write: %s", std::strerror(errno));
        c += w;
        n -= size_t(w);
    }
}

void recv_all(int fd, void *p, size_t n) {
    auto *c = static_cast<char *>(p);
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) die("control read: %s", r == 0 ? "peer gone" : std::strerror(errno));
        c += r;
        n -= size_t(r);
    }
}

struct Options {
    std::string prov;
    std::string domain;
    std::vector<int> counts{1, 16, 64};
    int timeout = 120;
};

fi_info *get_info(const Options &o) {
    fi_info *hints = fi_allocinfo();
    hints->caps = FI_TAGGED;
    hints->ep_attr->type = FI_EP_RDM;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->fabric_attr->prov_name = strdup(o.prov.c_str());
    if (!o.domain.empty()) hints->domain_attr->name = strdup(o.domain.c_str());
    fi_info *out = nullptr;
    check(fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &out), "fi_getinfo");
    fi_freeinfo(hints);
    // "-p tcp" also matches the layered "tcp;ofi_rxm": the exact name first, as tandem_bench.
    for (fi_info *i = out; i; i = i->next)
        if (o.prov == i->fabric_attr->prov_name) {
            fi_info *pick = fi_dupinfo(i);
            fi_freeinfo(out);
            return pick;
        }
    fi_info *pick = fi_dupinfo(out);
    fi_freeinfo(out);
    return pick;
}

struct Endpoints {
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_cq *cq = nullptr;
    fid_av *av = nullptr;
    std::vector<fid_ep *> eps;
    std::vector<std::string> names;
    std::vector<void *> descs;  // FI_MR_LOCAL: the buffer's
    std::vector<fid_mr *> mrs;
    std::vector<char> buf;

    void open(fi_info *info, int count, int messages) {
        check(fi_fabric(info->fabric_attr, &fabric, nullptr), "fi_fabric");
        check(fi_domain(fabric, info, &domain, nullptr), "fi_domain");
        fi_cq_attr ca{};
        ca.format = FI_CQ_FORMAT_CONTEXT;
        ca.size = size_t(4 * count + 64);
        check(fi_cq_open(domain, &ca, &cq, nullptr), "fi_cq_open");
        fi_av_attr aa{};
        aa.type = FI_AV_TABLE;
        check(fi_av_open(domain, &aa, &av, nullptr), "fi_av_open");
        buf.assign(size_t(messages) * 2 * 64, 0);  // a slot per message each way
        for (int i = 0; i < count; ++i) {
            fid_ep *ep;
            check(fi_endpoint(domain, info, &ep, nullptr), "fi_endpoint");
            check(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
            check(fi_ep_bind(ep, &av->fid, 0), "fi_ep_bind av");
            check(fi_enable(ep), "fi_enable");
            char name[256];
            size_t len = sizeof name;
            check(fi_getname(&ep->fid, name, &len), "fi_getname");
            eps.push_back(ep);
            names.emplace_back(name, len);
        }
        if (info->domain_attr->mr_mode & FI_MR_LOCAL) {
            fid_mr *mr;
            check(
                fi_mr_reg(domain, buf.data(), buf.size(), FI_SEND | FI_RECV, 0, 0, 0, &mr, nullptr),
                "fi_mr_reg");
            mrs.push_back(mr);
        }
    }
    void *desc() { return mrs.empty() ? nullptr : fi_mr_desc(mrs[0]); }
    char *slot(int i) { return buf.data() + size_t(i) * 64; }

    // Reads completions until `want` arrived; errors end the run.
    void reap(size_t want) {
        size_t got = 0;
        fi_cq_entry e[64];
        while (got < want) {
            ssize_t n = fi_cq_read(cq, e, 64);
            if (n > 0) {
                got += size_t(n);
            } else if (n == -FI_EAVAIL) {
                fi_cq_err_entry err{};
                fi_cq_readerr(cq, &err, 0);
                die("completion error: %s", fi_strerror(err.err));
            } else if (n != -FI_EAGAIN) {
                check(n, "fi_cq_read");
            }
        }
    }
    template <class Fn>
    void post(Fn fn, const char *what) {
        for (;;) {
            ssize_t r = fn();
            if (r == 0) return;
            if (r != -FI_EAGAIN) check(r, what);
            fi_cq_read(cq, nullptr, 0);
        }
    }
};

void send_names(int fd, const std::vector<std::string> &names) {
    uint32_t n = uint32_t(names.size());
    send_all(fd, &n, sizeof n);
    for (auto &s : names) {
        uint32_t len = uint32_t(s.size());
        send_all(fd, &len, sizeof len);
        send_all(fd, s.data(), len);
    }
}

std::vector<std::string> recv_names(int fd) {
    uint32_t n;
    recv_all(fd, &n, sizeof n);
    std::vector<std::string> out(n);
    for (auto &s : out) {
        uint32_t len;
        recv_all(fd, &len, sizeof len);
        s.resize(len);
        recv_all(fd, s.data(), len);
    }
    return out;
}

std::vector<fi_addr_t> insert(fid_av *av, const std::vector<std::string> &names) {
    std::vector<fi_addr_t> addrs(names.size());
    for (size_t i = 0; i < names.size(); ++i)
        if (fi_av_insert(av, names[i].data(), 1, &addrs[i], 0, nullptr) != 1)
            die("fi_av_insert of peer %zu", i);
    return addrs;
}

constexpr uint64_t kTag = 0x4d454d;

// The measured process: one endpoint, `count` peers.
[[noreturn]] void measured(const Options &o, int fd, int count) {
    g_role = "endpoint";
    fi_info *info = get_info(o);
    long base = rss_kib();
    Endpoints me;
    me.open(info, 1, count);
    long with_endpoint = rss_kib();
    send_names(fd, me.names);
    std::vector<fi_addr_t> peers = insert(me.av, recv_names(fd));
    fid_ep *ep = me.eps[0];
    std::vector<fi_context2> ctx(2 * size_t(count));  // (FI_CONTEXT2: one per operation)
    // One message from each peer, then one to each.
    for (int i = 0; i < count; ++i)
        me.post(
            [&] {
                return fi_trecv(ep, me.slot(i), 8, me.desc(), FI_ADDR_UNSPEC, kTag, 0, &ctx[i]);
            },
            "fi_trecv");
    char go = 1;
    send_all(fd, &go, 1);
    me.reap(size_t(count));
    for (int i = 0; i < count; ++i)
        me.post(
            [&] {
                return fi_tsend(ep, me.slot(count + i), 8, me.desc(), peers[i], kTag,
                                &ctx[count + i]);
            },
            "fi_tsend");
    me.reap(size_t(count));
    recv_all(fd, &go, 1);  // the peers have theirs
    long with_peers = rss_kib();
    std::printf("mem %d %ld %ld\n", count, with_endpoint - base, with_peers - base);
    std::fflush(stdout);
    _exit(0);
}

// The peers' process: `count` endpoints that each send one message and take one.
[[noreturn]] void peers(const Options &o, int fd, int count) {
    g_role = "peers";
    fi_info *info = get_info(o);
    Endpoints p;
    p.open(info, count, count);
    std::vector<std::string> target_name = recv_names(fd);
    send_names(fd, p.names);
    fi_addr_t target = insert(p.av, target_name)[0];
    std::vector<fi_context2> ctx(2 * size_t(count));
    for (int i = 0; i < count; ++i)
        p.post(
            [&] {
                return fi_trecv(p.eps[i], p.slot(i), 8, p.desc(), FI_ADDR_UNSPEC, kTag, 0, &ctx[i]);
            },
            "fi_trecv");
    char go;
    recv_all(fd, &go, 1);
    for (int i = 0; i < count; ++i)
        p.post(
            [&] {
                return fi_tsend(p.eps[i], p.slot(count + i), 8, p.desc(), target, kTag,
                                &ctx[count + i]);
            },
            "fi_tsend");
    p.reap(2 * size_t(count));
    send_all(fd, &go, 1);
    // Stay until the measured side has read its figure (it closes the socket by exiting).
    char c;
    while (read(fd, &c, 1) > 0) {
    }
    _exit(0);
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    int opt;
    while ((opt = getopt(argc, argv, "p:d:n:T:h")) != -1) {
        switch (opt) {
            case 'p':
                o.prov = optarg;
                break;
            case 'd':
                o.domain = optarg;
                break;
            case 'n': {
                o.counts.clear();
                std::string list = optarg;
                size_t at = 0;
                while (at <= list.size()) {
                    size_t comma = list.find(',', at);
                    std::string item = list.substr(
                        at, comma == std::string::npos ? std::string::npos : comma - at);
                    int n = std::atoi(item.c_str());
                    if (n <= 0) die("bad -n %s (peer counts, e.g. 1,16,64)", optarg);
                    o.counts.push_back(n);
                    if (comma == std::string::npos) break;
                    at = comma + 1;
                }
                break;
            }
            case 'T':
                o.timeout = std::atoi(optarg);
                break;
            default:
                std::fprintf(stderr,
                             "usage: mem_bench -p PROV [-d DOMAIN] [-n 1,16,64] [-T SECONDS]\n"
                             "prints \"mem N endpoint_kib with_peers_kib\" per peer count: the\n"
                             "resident memory (KiB) of a process with one RDM endpoint, over\n"
                             "its size once libfabric is loaded, before and after one 8-byte\n"
                             "message each way with N peers (in another process)\n");
                return opt == 'h' ? 0 : 1;
        }
    }
    if (o.prov.empty()) die("-p PROV is required");
    std::printf("# mem_bench -p %s: N endpoint_kib with_peers_kib (VmRSS over the baseline)\n",
                o.prov.c_str());
    std::fflush(stdout);
    int status_all = 0;
    for (int count : o.counts) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) die("socketpair");
        pid_t m = fork();
        if (m == 0) {
            close(sv[1]);
            alarm(unsigned(o.timeout));
            measured(o, sv[0], count);
        }
        pid_t p = fork();
        if (p == 0) {
            close(sv[0]);
            alarm(unsigned(o.timeout));
            peers(o, sv[1], count);
        }
        close(sv[0]);
        close(sv[1]);
        int st = 0;
        waitpid(m, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            std::fprintf(stderr, "mem_bench: the measured process failed with %d peers\n", count);
            status_all = 1;
            kill(p, SIGKILL);
        }
        waitpid(p, &st, 0);
    }
    return status_all;
}

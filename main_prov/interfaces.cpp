#include "main_prov/interfaces.h"

#include "main_prov/config.h"
#include "main_prov/link/tcp_link.h"
#include "main_prov/link/verbs_link.h"

#include "common/log.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

namespace tandem {

namespace {

int prefix_length(const sockaddr *mask) {
    int bits = 0;
    const uint8_t *p;
    size_t n;
    if (mask->sa_family == AF_INET) {
        p = reinterpret_cast<const uint8_t *>(
            &reinterpret_cast<const sockaddr_in *>(mask)->sin_addr);
        n = 4;
    } else {
        p = reinterpret_cast<const uint8_t *>(
            &reinterpret_cast<const sockaddr_in6 *>(mask)->sin6_addr);
        n = 16;
    }
    for (size_t i = 0; i < n; ++i) bits += __builtin_popcount(p[i]);
    return bits;
}

std::string subnet_name(const sockaddr *addr, const sockaddr *mask) {
    char text[INET6_ADDRSTRLEN] = "";
    if (addr->sa_family == AF_INET) {
        in_addr a = reinterpret_cast<const sockaddr_in *>(addr)->sin_addr;
        if (mask) a.s_addr &= reinterpret_cast<const sockaddr_in *>(mask)->sin_addr.s_addr;
        inet_ntop(AF_INET, &a, text, sizeof text);
    } else {
        in6_addr a = reinterpret_cast<const sockaddr_in6 *>(addr)->sin6_addr;
        if (mask)
            for (int i = 0; i < 16; ++i)
                a.s6_addr[i] &= reinterpret_cast<const sockaddr_in6 *>(mask)->sin6_addr.s6_addr[i];
        inet_ntop(AF_INET6, &a, text, sizeof text);
    }
    return std::string(text) + "/" + std::to_string(mask ? prefix_length(mask) : 0);
}

bool allowed_by_config(const std::string &name) {
    const std::string &list = Config::get().iface;
    if (list.empty()) return true;
    std::stringstream ss(list);
    std::string item;
    while (std::getline(ss, item, ','))
        if (item == name) return true;
    return false;
}

bool is_wildcard(const EndpointName &name) {
    if (name.ss.ss_family == AF_INET)
        return reinterpret_cast<const sockaddr_in *>(&name.ss)->sin_addr.s_addr ==
               htonl(INADDR_ANY);
    if (name.ss.ss_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(
            &reinterpret_cast<const sockaddr_in6 *>(&name.ss)->sin6_addr);
    return false;
}

// The RDMA device rdma_cm binds this local address to ("" when none serves it): what the
// device's port carries, RoCE or IPoIB.
std::string rdma_device_serving(const VerbsApi &api, const EndpointName &address) {
    rdma_event_channel *channel = api.create_event_channel();
    if (!channel) return {};
    std::string name;
    rdma_cm_id *id = nullptr;
    if (api.create_id(channel, &id, nullptr, RDMA_PS_TCP) == 0) {
        EndpointName probe = address;
        if (api.bind_addr(id, const_cast<sockaddr *>(probe.sa())) == 0 && id->verbs)
            name = api.get_device_name(id->verbs->device);
        api.destroy_id(id);
    }
    api.destroy_event_channel(channel);
    return name;
}

}  // namespace

const VerbsApi *verbs_api() {
    static std::once_flag once;
    static const VerbsApi *api = nullptr;
    std::call_once(once, [] {
        const Config &cfg = Config::get();
        if (cfg.link == "tcp") return;
        std::string why;
        api = VerbsApi::load(cfg.verbs_lib, cfg.rdmacm_lib, &why);
        if (!api && cfg.link == "verbs")
            TANDEM_WARN(FI_LOG_CORE, "FI_TANDEM_LINK=verbs, but no verbs: %s\n", why.c_str());
        else if (!api)
            TANDEM_INFO(FI_LOG_CORE, "no verbs link (TCP only): %s\n", why.c_str());
    });
    return api;
}

std::shared_ptr<LinkDomain> open_link_domain(const std::string &domain_name, std::string *why) {
    const VerbsApi *api = verbs_api();
    bool is_device = false;
    if (api) {
        int n = 0;
        ibv_device **list = api->get_device_list(&n);
        for (int i = 0; list && i < n && !is_device; ++i)
            is_device = domain_name == api->get_device_name(list[i]);
        if (list) api->free_device_list(list);
    }
    if (!is_device) return std::make_shared<TcpLinkDomain>(Config::get().link_settings());
    // One device object per process: a passive endpoint's connection requests are accepted
    // by endpoints of a domain, and both must use one protection domain.
    static std::mutex mu;
    static std::map<std::string, std::weak_ptr<VerbsDevice>> devices;
    std::lock_guard lk(mu);
    if (auto dev = devices[domain_name].lock()) return dev;
    std::shared_ptr<VerbsDevice> dev;
    if (VerbsDevice::open(api, domain_name, VerbsLinkConfig{}, dev, why) != 0) return nullptr;
    devices[domain_name] = dev;
    return dev;
}

std::vector<Interface> usable_interfaces(int family) {
    std::vector<Interface> out;
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) return out;
    for (ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != family) continue;
        if (!(ifa->ifa_flags & IFF_UP) || !(ifa->ifa_flags & IFF_RUNNING)) continue;
        bool loopback = ifa->ifa_flags & IFF_LOOPBACK;
        if (loopback && !Config::get().include_loopback) continue;
        if (!allowed_by_config(ifa->ifa_name)) continue;
        if (family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6 *>(ifa->ifa_addr)->sin6_addr))
            continue;  // link-local addresses need a scope id peers cannot guess
        bool seen = std::any_of(out.begin(), out.end(),
                                [&](const Interface &i) { return i.name == ifa->ifa_name; });
        if (seen) continue;  // first address of an interface names its domain
        Interface itf;
        itf.name = itf.ifname = ifa->ifa_name;
        EndpointName::from_bytes(ifa->ifa_addr,
                                 family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6),
                                 itf.address);
        itf.fabric_name = subnet_name(ifa->ifa_addr, ifa->ifa_netmask);
        itf.loopback = loopback;
        out.push_back(std::move(itf));
    }
    freeifaddrs(list);
    std::stable_partition(out.begin(), out.end(), [](const Interface &i) { return !i.loopback; });
    const VerbsApi *api = verbs_api();
    if (!api) return out;
    // The device's domain on every interface it serves (a port's netdev each, or IPoIB
    // children): one domain name, the device's, with that interface's address and fabric, as
    // libfabric's verbs provider lists a device once per subnet it reaches.
    std::vector<Interface> rdma;
    for (const Interface &itf : out) {
        std::string dev = rdma_device_serving(*api, itf.address);
        if (dev.empty()) continue;
        Interface v = itf;
        v.name = v.rdma_device = dev;
        rdma.push_back(std::move(v));
    }
    if (Config::get().link == "verbs") return rdma;
    rdma.insert(rdma.end(), out.begin(), out.end());
    return rdma;
}

namespace {

// dst is an address of this host (of any of its interfaces, loopback included): one a socket
// can be bound to.
bool is_own_address(const EndpointName &dst) {
    int fd = socket(dst.ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    EndpointName probe = dst;
    if (probe.ss.ss_family == AF_INET)
        reinterpret_cast<sockaddr_in *>(&probe.ss)->sin_port = 0;
    else
        reinterpret_cast<sockaddr_in6 *>(&probe.ss)->sin6_port = 0;
    bool own = bind(fd, probe.sa(), probe.length()) == 0;
    close(fd);
    return own;
}

}  // namespace

bool reaches(const Interface &itf, const EndpointName &dst) {
    if (itf.rdma_device.empty()) return !itf.loopback || is_wildcard(dst) || is_own_address(dst);
    const VerbsApi *api = verbs_api();
    if (!api || is_wildcard(dst)) return api != nullptr;
    // The source address of the route: a datagram socket "connected" to dst sends nothing.
    int fd = socket(dst.ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    EndpointName probe = dst;
    if (dst.ss.ss_family == AF_INET) {
        auto *in = reinterpret_cast<sockaddr_in *>(&probe.ss);
        if (!in->sin_port) in->sin_port = htons(9);
    } else {
        auto *in6 = reinterpret_cast<sockaddr_in6 *>(&probe.ss);
        if (!in6->sin6_port) in6->sin6_port = htons(9);
    }
    EndpointName src;
    socklen_t len = sizeof src.ss;
    bool routed = connect(fd, probe.sa(), probe.length()) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr *>(&src.ss), &len) == 0;
    close(fd);
    if (!routed) return false;
    if (src.ss.ss_family == AF_INET)
        reinterpret_cast<sockaddr_in *>(&src.ss)->sin_port = 0;
    else
        reinterpret_cast<sockaddr_in6 *>(&src.ss)->sin6_port = 0;
    return rdma_device_serving(*api, src) == itf.rdma_device;
}

void substitute_interface_address(const char *ifname, EndpointName &name) {
    if (!is_wildcard(name) || !ifname) return;
    uint16_t port = name.ss.ss_family == AF_INET
                        ? reinterpret_cast<sockaddr_in *>(&name.ss)->sin_port
                        : reinterpret_cast<sockaddr_in6 *>(&name.ss)->sin6_port;
    for (const Interface &itf : usable_interfaces(name.ss.ss_family)) {
        if (itf.name != ifname) continue;
        name = itf.address;
        if (name.ss.ss_family == AF_INET)
            reinterpret_cast<sockaddr_in *>(&name.ss)->sin_port = port;
        else
            reinterpret_cast<sockaddr_in6 *>(&name.ss)->sin6_port = port;
        return;
    }
}

}  // namespace tandem

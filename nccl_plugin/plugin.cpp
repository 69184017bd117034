#include "nccl_plugin/plugin.h"

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

namespace tandem::nccl {

namespace {

std::atomic<Logger> g_logger{nullptr};

// The per-communicator context of v11: what init was given (tandem has no traffic classes,
// so the value is only kept for the logs).
struct Context {
    int traffic_class = -1;
};
std::set<Context *> g_contexts;  // under Plugin::mu_

int p2p_mode(const char *value) {
    if (!value || !*value) return -1;
    struct {
        const char *name;
        int mode;
    } const modes[] = {{"enabled", FI_HMEM_P2P_ENABLED},
                       {"required", FI_HMEM_P2P_REQUIRED},
                       {"preferred", FI_HMEM_P2P_PREFERRED},
                       {"disabled", FI_HMEM_P2P_DISABLED}};
    for (const auto &m : modes)
        if (strcasecmp(value, m.name) == 0) return m.mode;
    return -2;
}

// FI_TANDEM_IFACE names the loopback interface itself: the user asked for it as a device.
bool loopback_asked() {
    const char *list = getenv("FI_TANDEM_IFACE");
    if (!list) return false;
    std::string l = std::string(",") + list + ",";
    return l.find(",lo,") != std::string::npos;
}

std::string read_line(const std::string &path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

}  // namespace

void log(LogLevel level, const char *file, int line, const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (Logger logger = g_logger.load(std::memory_order_acquire))
        logger(level, kLogSubsysNet, file, line, "%s", text);
    else if (level == kLogWarn)
        fprintf(stderr, "NCCL WARN %s\n", text);  // before init: NCCL has given no logger yet
}

Plugin &Plugin::instance() {
    // Never destroyed: at exit the libfabric core may be gone before our destructors would run.
    static Plugin *plugin = new Plugin;
    return *plugin;
}

Result Plugin::discover() {
    if (const char *e = getenv("NCCL_TANDEM_EAGER_MAX"); e && *e) {
        char *end;
        unsigned long long v = strtoull(e, &end, 0);
        if (*end || v > (1ull << 20)) {
            NCCL_TANDEM_WARN("NET/tandem: NCCL_TANDEM_EAGER_MAX=%s is no size up to 1 MiB", e);
            return kInvalidUsage;
        }
        options_.eager_max = size_t(v);
    }
    options_.p2p = p2p_mode(getenv("NCCL_TANDEM_P2P"));
    if (options_.p2p == -2) {
        NCCL_TANDEM_WARN(
            "NET/tandem: NCCL_TANDEM_P2P=%s is none of enabled, preferred, "
            "required, disabled",
            getenv("NCCL_TANDEM_P2P"));
        return kInvalidUsage;
    }

    devices_.reserve(255);  // never reallocated: see plugin.h
    fi_info *hints = fi_allocinfo();
    if (!hints) return kSystemError;
    hints->caps = FI_TAGGED | FI_RMA | FI_DIRECTED_RECV | FI_HMEM;
    hints->ep_attr->type = FI_EP_RDM;
    hints->fabric_attr->prov_name = strdup("tandem");
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    fi_info *list = nullptr;
    int ret = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &list);
    bool hmem = ret == 0;
    if (ret == -FI_ENODATA) {  // no GPU (or no driver): host memory only
        hints->caps &= ~FI_HMEM;
        hints->domain_attr->mr_mode &= ~FI_MR_HMEM;
        ret = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &list);
    }
    fi_freeinfo(hints);
    if (ret) {
        NCCL_TANDEM_WARN(
            "NET/tandem: fi_getinfo found no tandem RDM endpoint with tagged "
            "messages and RMA: %s (is FI_PROVIDER_PATH set, or FI_PROVIDER naming "
            "another provider?)",
            fi_strerror(-ret));
        return kSystemError;
    }
    // One device per domain (interface); loopback only where nothing else exists, or where
    // FI_TANDEM_IFACE names it.
    std::vector<const fi_info *> picked;
    std::set<std::string> names;
    for (const fi_info *i = list; i; i = i->next)
        if (names.insert(i->domain_attr->name).second) picked.push_back(i);
    if (picked.size() > 1 && !loopback_asked())
        std::erase_if(picked,
                      [](const fi_info *i) { return strcmp(i->domain_attr->name, "lo") == 0; });
    for (const fi_info *i : picked) {
        if (devices_.size() == 255) break;
        DeviceDescription d;
        d.name = i->domain_attr->name;
        char real[PATH_MAX];
        if (realpath(("/sys/class/net/" + d.name + "/device").c_str(), real)) d.pci_path = real;
        d.speed_mbps = atoi(read_line("/sys/class/net/" + d.name + "/speed").c_str());
        if (d.speed_mbps <= 0) d.speed_mbps = 10000;  // virtual interfaces report none
        d.max_msg_size = i->ep_attr->max_msg_size;
        d.hmem = hmem;
        NCCL_TANDEM_INFO("NET/tandem: device %zu: %s (%s), %d Mb/s%s", devices_.size(),
                         d.name.c_str(), d.pci_path.empty() ? "virtual" : d.pci_path.c_str(),
                         d.speed_mbps, hmem ? ", CUDA memory" : "");
        auto net = std::make_unique<NetDevice>(uint8_t(devices_.size()), i, std::move(d), options_);
        NetDevice *raw = net.get();
        devices_.push_back({std::move(net), raw, nullptr});
    }
    fi_freeinfo(list);
    device_count_.store(devices_.size(), std::memory_order_release);
    return devices_.empty() ? kSystemError : kSuccess;
}

Result Plugin::init(void **ctx, const CommConfig *config, Logger logger) {
    if (logger) g_logger.store(logger, std::memory_order_release);
    std::lock_guard lk(mu_);
    if (!discovered_) {
        discovery_result_ = discover();
        discovered_ = true;
    }
    if (discovery_result_ != kSuccess) return discovery_result_;
    if (ctx) {
        auto *c = new Context;
        if (config) c->traffic_class = config->traffic_class;
        g_contexts.insert(c);
        *ctx = c;
    }
    ++contexts_;
    return kSuccess;
}

// The last context gone and no comm open: the endpoints close (NCCL may unload the plugin).
Result Plugin::finalize(void *ctx) {
    std::lock_guard lk(mu_);
    auto *c = static_cast<Context *>(ctx);
    if (!g_contexts.erase(c)) {
        NCCL_TANDEM_WARN("NET/tandem: finalize: %p is no context of init", ctx);
        return kInvalidUsage;
    }
    delete c;
    if (--contexts_ > 0) return kSuccess;
    // Virtual NICs first: their comms are their members'.
    for (size_t i = devices_.size(); i-- > 0;)
        if (devices_[i].device->open_comms() == 0) devices_[i].device->shut_down();
    return kSuccess;
}

Result Plugin::devices(int *count) {
    if (!count) return kInternalError;
    *count = int(device_count_.load(std::memory_order_acquire));
    return kSuccess;
}

Result Plugin::properties(int dev, PropertiesV12 *props) {
    if (!device(dev, "getProperties") || !props) return kInternalError;
    const Slot &slot = devices_[size_t(dev)];
    const DeviceDescription &desc = slot.virt ? slot.virt->description() : slot.net->description();
    *props = {};
    props->name = const_cast<char *>(desc.name.c_str());
    props->pci_path = desc.pci_path.empty() ? nullptr : const_cast<char *>(desc.pci_path.c_str());
    props->guid = uint64_t(dev);
    props->ptr_support = kPtrHost | (desc.hmem ? kPtrCuda | kPtrDmabuf : 0);
    props->reg_is_global = 0;
    props->force_flush = 0;
    props->speed = desc.speed_mbps;  // a virtual NIC's: the sum of its members'
    props->port = 1;
    props->latency = 0;  // unknown: NCCL's own model applies
    props->max_comms = int(wire::kNcclMaxComms);
    props->max_recvs = kMaxRecvs;
    props->device_type = kDeviceHost;
    props->device_version = kDeviceInvalidVersion;
    if (slot.virt) {
        const std::vector<int> &ids = slot.virt->member_ids();
        props->vprops.ndevs = int(ids.size());
        std::copy(ids.begin(), ids.end(), props->vprops.devs);
    } else {
        props->vprops.ndevs = 1;
        props->vprops.devs[0] = dev;
    }
    constexpr size_t kNcclMaxNetSize = size_t{1} << 40;  // what NCCL accepts at most
    props->max_p2p_bytes = std::min(desc.max_msg_size, kNcclMaxNetSize);
    props->max_coll_bytes = props->max_p2p_bytes;
    props->max_multi_request_size = 1;
    // Rails and planes are the fabric's wiring (which NICs of the nodes reach which switches),
    // which tandem cannot see: an interface or an RDMA port says nothing of it, and NCCL's own
    // socket transport reports the same. Undefined makes NCCL ignore them (NCCL_NET_ID_UNDEF),
    // for physical and virtual devices alike.
    props->rail_id = kNetIdUndef;
    props->plane_id = kNetIdUndef;
    return kSuccess;
}

Result Plugin::make_vdevice(int *dev, const int *devs, int ndevs, int max_devs) {
    if (!dev || !devs) WARN_RETURN(kInternalError, "NET/tandem: makeVDevice without its arguments");
    std::lock_guard lk(mu_);
    if (ndevs < 1 || ndevs > max_devs)
        WARN_RETURN(kInvalidUsage, "NET/tandem: makeVDevice of %d devices (1 to %d)", ndevs,
                    max_devs);
    std::vector<NetDevice *> members;
    std::vector<int> ids;
    for (int i = 0; i < ndevs; ++i) {
        const int d = devs[i];
        if (d < 0 || size_t(d) >= devices_.size())
            WARN_RETURN(kInvalidUsage, "NET/tandem: makeVDevice: no device %d (%zu devices)", d,
                        devices_.size());
        if (!devices_[size_t(d)].net)
            WARN_RETURN(kInvalidUsage,
                        "NET/tandem: makeVDevice: device %d is itself a virtual NIC (they "
                        "do not nest)",
                        d);
        if (std::find(ids.begin(), ids.end(), d) != ids.end())
            WARN_RETURN(kInvalidUsage, "NET/tandem: makeVDevice: device %d given twice", d);
        members.push_back(devices_[size_t(d)].net);
        ids.push_back(d);
    }
    if (devices_.size() == 255)
        WARN_RETURN(kInvalidUsage, "NET/tandem: makeVDevice: 255 devices already");
    const uint8_t index = uint8_t(devices_.size());
    auto v = std::make_unique<VirtualDevice>(index, std::move(members), std::move(ids));
    VirtualDevice *raw = v.get();
    devices_.push_back({std::move(v), nullptr, raw});
    device_count_.store(devices_.size(), std::memory_order_release);
    NCCL_TANDEM_INFO(
        "NET/tandem: made virtual device %u: %s, %d Mb/s, %d devices, rail %d plane %d", index,
        raw->description().name.c_str(), raw->description().speed_mbps, ndevs, int(kNetIdUndef),
        int(kNetIdUndef));
    *dev = index;
    return kSuccess;
}

bool Plugin::member_bytes(int dev, int member, uint64_t *sent, uint64_t *received) {
    size_t count = device_count_.load(std::memory_order_acquire);
    if (dev < 0 || size_t(dev) >= count || !devices_[size_t(dev)].virt || member < 0) return false;
    return devices_[size_t(dev)].virt->member_bytes(size_t(member), sent, received);
}

Device *Plugin::device(int dev, const char *call) {
    size_t count = device_count_.load(std::memory_order_acquire);
    if (dev < 0 || size_t(dev) >= count) {
        NCCL_TANDEM_WARN("NET/tandem: %s: no device %d (%zu devices)", call, dev, count);
        return nullptr;
    }
    return devices_[size_t(dev)].device.get();
}

Device *Plugin::device_of(const void *handle, const char *call) {
    HandleBits b = HandleBits::decode(handle);
    if (uint8_t(b.kind) < uint8_t(HandleKind::Listen) ||
        uint8_t(b.kind) > uint8_t(HandleKind::Memory) ||
        b.device >= device_count_.load(std::memory_order_acquire)) {
        NCCL_TANDEM_WARN("NET/tandem: %s: %p is none of the plugin's handles", call, handle);
        return nullptr;
    }
    return devices_[b.device].device.get();
}

}  // namespace tandem::nccl

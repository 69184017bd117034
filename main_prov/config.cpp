#include "main_prov/config.h"

#include "common/log.h"
#include "common/params.h"

#include <rdma/fi_endpoint.h>

#include <algorithm>
#include <cstdint>

namespace tandem {

namespace {
Config g_config;

// For programs that cannot call fi_setopt (fabtests, benchmarks, an MPI that does not), the
// policy every endpoint with FI_HMEM starts with; fi_setopt still changes it, and
// FI_HMEM_DISABLE_P2P still wins over both.
int read_hmem_p2p(const ParamReader &p) {
    std::string mode =
        p.text("hmem_p2p",
               "FI_OPT_FI_HMEM_P2P of endpoints with FI_HMEM until the application sets it: "
               "enabled (the default: tandem chooses), preferred, required or disabled",
               "enabled");
    if (mode == "enabled") return FI_HMEM_P2P_ENABLED;
    if (mode == "preferred") return FI_HMEM_P2P_PREFERRED;
    if (mode == "required") return FI_HMEM_P2P_REQUIRED;
    if (mode == "disabled") return FI_HMEM_P2P_DISABLED;
    TANDEM_WARN(FI_LOG_CORE,
                "FI_TANDEM_HMEM_P2P=%s is none of enabled, preferred, required, disabled: "
                "enabled\n",
                mode.c_str());
    return FI_HMEM_P2P_ENABLED;
}
}  // namespace

const Config &Config::get() {
    return g_config;
}

TcpLinkConfig Config::link_settings() const {
    TcpLinkConfig link;
    link.socket_buffer = socket_buffer;
    link.splice_min = splice_min;
    link.congestion = congestion;
    link.timeout_ms = static_cast<unsigned>(std::min<size_t>(link_timeout_ms, UINT32_MAX));
    return link;
}

void Config::load(fi_provider *prov) {
    ParamReader p(prov);
    g_config.eager_limit = p.size("eager_limit",
                                  "Largest message sent eagerly; larger messages use a rendezvous "
                                  "(the receiver reads the data with RDMA read)",
                                  65536);
    g_config.inject_size = p.size("inject_size", "Largest fi_inject / FI_INJECT payload", 4096);
    if (g_config.inject_size > g_config.eager_limit) g_config.inject_size = g_config.eager_limit;
    g_config.rx_buffers = p.size(
        "rx_buffers", "Link receive buffers posted per endpoint (each eager_limit + 40 bytes)", 64);
    g_config.tx_size = p.size("tx_size", "Transmit queue depth of an endpoint", 4096);
    g_config.rx_size = p.size("rx_size", "Receive queue depth of an endpoint", 4096);
    g_config.socket_buffer = p.size("socket_buffer",
                                    "SO_SNDBUF/SO_RCVBUF of link sockets in bytes (0: the kernel's "
                                    "default, with autotuning)",
                                    0);
    g_config.splice_min =
        p.size("splice_min",
               "Payloads of at least this many bytes leave link sockets by vmsplice and splice "
               "(no copy by the sending CPU); 0 (the default) copies every payload with sendmsg",
               0);
    g_config.congestion =
        p.text("congestion",
               "TCP congestion control of link sockets: auto (reno between sockets of this host, "
               "where pacing only costs CPU; the system's default to other hosts), system (the "
               "system's default everywhere), or an algorithm the kernel allows "
               "(net.ipv4.tcp_allowed_congestion_control)",
               "auto");
    g_config.link_timeout_ms =
        p.size("link_timeout",
               "Milliseconds after which a TCP link connection whose peer host stops answering "
               "fails, with error completions for what was pending on it (unacknowledged data, "
               "or keepalive probes from half this time on when idle); 0: the kernel's defaults "
               "(about 15 minutes of retransmissions, no keepalive)",
               30000);
    g_config.iface =
        p.text("iface", "Comma-separated interfaces to offer as domains (empty: all)", "");
    g_config.include_loopback =
        p.flag("loopback", "Offer the loopback interface as a domain", true);
    g_config.mr_virt_addr =
        p.flag("mr_virt_addr",
               "Address remote memory by virtual address (FI_MR_VIRT_ADDR) when the application "
               "offers it; off (the default): by offset into the region, which every link of "
               "tandem supports, so tandem does not ask applications for FI_MR_VIRT_ADDR",
               false);
    g_config.link = p.text("link",
                           "Link to other nodes: auto (an RDMA device's domain for each address "
                           "a device serves, listed first, and a TCP domain for every "
                           "interface), verbs (RDMA devices only), tcp (TCP only)",
                           "auto");
    if (g_config.link != "auto" && g_config.link != "tcp" && g_config.link != "verbs") {
        TANDEM_WARN(FI_LOG_CORE, "FI_TANDEM_LINK=%s is none of auto, tcp, verbs: auto\n",
                    g_config.link.c_str());
        g_config.link = "auto";
    }
    g_config.verbs_lib =
        p.text("verbs_lib",
               "libibverbs to load for the verbs link (a path, or a name the dynamic loader "
               "finds); scripts/with-emulated-rdma.sh names the emulated device's library",
               "libibverbs.so.1");
    g_config.rdmacm_lib =
        p.text("rdmacm_lib", "librdmacm to load for the verbs link", "librdmacm.so.1");
    g_config.hmem_p2p = read_hmem_p2p(p);
    g_config.progress_poll_us =
        p.size("progress_poll_us",
               "Automatic progress (FI_PROGRESS_AUTO): microseconds between the progress "
               "thread's reads of device-written trigger variables (XPU triggers) while such "
               "triggers wait; otherwise the thread sleeps until a descriptor or an "
               "application's call wakes it",
               10);
    g_config.local_path = p.flag("local",
                                 "Send to endpoints on the same node through the offload "
                                 "provider's shared memory (off: over the network path, as "
                                 "between nodes)",
                                 true);
}

}  // namespace tandem

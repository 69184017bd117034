// tandem's tunables, read once from provider parameters (FI_TANDEM_*; `fi_info -e` lists them).
#pragma once

#include "main_prov/link/tcp_link.h"

#include <rdma/fabric.h>
#include <rdma/providers/fi_prov.h>

#include <cstddef>
#include <string>

namespace tandem {

struct Config {
    size_t eager_limit;      // largest message sent eagerly; larger ones use rendezvous (RDMA read)
    size_t inject_size;      // fi_inject / FI_INJECT limit
    size_t rx_buffers;       // link receive buffers posted per endpoint
    size_t tx_size;          // transmit queue depth reported in tx_attr->size
    size_t rx_size;          // receive queue depth reported in rx_attr->size
    size_t socket_buffer;    // SO_SNDBUF / SO_RCVBUF for link sockets (0: kernel default)
    size_t splice_min;       // link payloads this large go by vmsplice + splice (0: never)
    std::string congestion;  // TCP congestion control of link sockets (auto, system, a name)
    size_t link_timeout_ms;  // a silent peer host fails its TCP connections after this long
    std::string iface;       // restrict domains to these interfaces (comma separated)
    bool include_loopback;   // offer the loopback interface as a domain
    bool local_path;         // node-local peers through off_tandem (shared memory)
    bool mr_virt_addr;       // take FI_MR_VIRT_ADDR when the application offers it
    std::string link;        // auto (verbs where an RDMA device serves the address), tcp, verbs
    std::string verbs_lib;   // libibverbs to load (the emulated device's library in tests)
    std::string rdmacm_lib;  // librdmacm to load
    int hmem_p2p;            // FI_OPT_FI_HMEM_P2P an endpoint with FI_HMEM starts with
    size_t progress_poll_us;  // automatic progress: device trigger variables read this often

    static const Config &get();
    static void load(fi_provider *prov);
    // The link settings these tunables make (socket options, splice, congestion control),
    // for every transport that opens or accepts sockets.
    TcpLinkConfig link_settings() const;
};

fi_provider &tandem_provider();
// Marks the provider so that the core offers no utility provider (ofi_rxm) stacked over it
// unless the application names the stack ("tandem;ofi_rxm"); see provider.cpp.
void refuse_implicit_layering(fi_provider &provider);

}  // namespace tandem

// The IP interfaces tandem offers as TCP domains.
#pragma once

#include "main_prov/types.h"

#include <memory>
#include <string>
#include <vector>

namespace tandem {

struct VerbsApi;
class LinkDomain;

struct Interface {
    std::string name;         // domain name: the interface's (TCP link) or the RDMA device's
    std::string ifname;       // the network interface
    EndpointName address;     // its address (port 0)
    std::string fabric_name;  // the subnet, e.g. "127.0.0.0/8"
    bool loopback;
    std::string rdma_device;  // the RDMA device serving the address (verbs link), or empty
};

// The domains of the family (AF_INET or AF_INET6): an RDMA device's on each interface whose
// address it serves (one per port's netdev), named for the device and listed first
// (FI_TANDEM_LINK auto or verbs), then one per interface that is up, running and has an
// address (auto or tcp), loopback last.
std::vector<Interface> usable_interfaces(int family);

// Whether the domain of itf reaches dst over its own link: for a TCP domain always (the kernel
// routes) but the loopback's, which reaches this host's own addresses only (an endpoint at
// 127.0.0.1 that connects to another host could never be connected to in return); for a
// device's domain when the address the kernel sends to dst from
// is one the device serves (rdma_cm would bind a connection to dst to this device). How
// fi_getinfo with a destination picks the link per peer: verbs where a device serves the
// route, TCP otherwise.
bool reaches(const Interface &itf, const EndpointName &dst);

// The verbs calls, loaded on first use; nullptr where FI_TANDEM_LINK=tcp or rdma-core (or the
// library FI_TANDEM_VERBS_LIB names) is missing.
const VerbsApi *verbs_api();

// The link of the domain named `domain_name`: the RDMA device's (one per process, shared by
// every domain and passive endpoint on it) or a TCP link with tcp's settings. nullptr with
// *why set when the device cannot be opened.
std::shared_ptr<LinkDomain> open_link_domain(const std::string &domain_name, std::string *why);

// When name holds a wildcard address, replace it with the address of interface ifname.
void substitute_interface_address(const char *ifname, EndpointName &name);

}  // namespace tandem

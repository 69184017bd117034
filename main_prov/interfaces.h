// The IP interfaces tandem offers as TCP domains.
#pragma once

#include "main_prov/types.h"

#include <string>
#include <vector>

namespace tandem {

struct Interface {
    std::string name;         // domain name
    EndpointName address;     // its address (port 0)
    std::string fabric_name;  // the subnet, e.g. "127.0.0.0/8"
    bool loopback;
};

// Interfaces that are up and have an address of the family (AF_INET or AF_INET6), ordered
// with loopback last.
std::vector<Interface> usable_interfaces(int family);

// When name holds a wildcard address, replace it with the address of interface ifname.
void substitute_interface_address(const char *ifname, EndpointName &name);

}  // namespace tandem

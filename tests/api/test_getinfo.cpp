// fi_getinfo(3): what the provider advertises and how it answers hints.
#include <chrono>
#include <netinet/in.h>
#include "fabric_fixture.h"

#include <ifaddrs.h>
#include <net/if.h>

#include <set>

namespace tandem_test {
namespace {

constexpr uint64_t kPrimaryCaps = FI_MSG | FI_RMA | FI_TAGGED | FI_ATOMIC | FI_MULTICAST |
                                  FI_NAMED_RX_CTX | FI_DIRECTED_RECV | FI_VARIABLE_MSG | FI_HMEM |
                                  FI_COLLECTIVE;  // FI_XPU is not in 1.17

InfoPtr base_hints(fi_ep_type type = FI_EP_UNSPEC) {
    InfoPtr h = alloc_hints();
    h->fabric_attr->prov_name = strdup(provider_name());
    h->ep_attr->type = type;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    return h;
}

// Runs fi_getinfo and keeps only the entries of the provider under test (not the
// "<prov>;ofi_rxm" entries the core layers on top of it); -FI_ENODATA when none is left.
int getinfo(const fi_info *hints, InfoPtr *out, const char *node = nullptr,
            const char *service = nullptr, uint64_t flags = 0) {
    fi_info *res = nullptr;
    out->reset();
    int ret = fi_getinfo(kApiVersion, node, service, flags, hints, &res);
    if (ret) return ret;
    fi_info *head = nullptr, **tail = &head;
    for (fi_info *i = res; i; i = i->next) {
        if (!is_own(i)) continue;
        *tail = fi_dupinfo(i);
        tail = &(*tail)->next;
    }
    fi_freeinfo(res);
    out->reset(head);
    return head ? 0 : -FI_ENODATA;
}

std::string ipv4(const void *sa) {
    auto *sin = static_cast<const sockaddr_in *>(sa);
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    return buf;
}

TEST(GetInfo, ProviderIsListed) {
    InfoPtr hints = base_hints();
    fi_info *raw = nullptr;
    ASSERT_FI_OK(fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &raw));
    InfoPtr all(raw);
    size_t own = 0;
    for (fi_info *i = all.get(); i; i = i->next) {
        ASSERT_NE(i->fabric_attr->prov_name, nullptr);
        EXPECT_NE(i->domain_attr->name, nullptr);
        EXPECT_NE(i->fabric_attr->name, nullptr);
        own += is_own(i);
    }
    EXPECT_GE(own, 1u) << "no entry of the provider itself";
}

// Naming the provider gives its own endpoints only: the core stacks no utility provider
// ("tandem;ofi_rxm") over it unless that stack is named.
TEST(GetInfo, NamingTheProviderGivesOnlyItsOwnEndpoints) {
    for (fi_ep_type type : {FI_EP_RDM, FI_EP_UNSPEC}) {
        InfoPtr hints = base_hints(type);
        fi_info *raw = nullptr;
        ASSERT_FI_OK(fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &raw));
        InfoPtr all(raw);
        for (fi_info *i = all.get(); i; i = i->next)
            EXPECT_STREQ(i->fabric_attr->prov_name, provider_name()) << "ep_type " << type;
    }
}

TEST(GetInfo, OffersRdmAndMsgEndpoints) {
    for (fi_ep_type type : {FI_EP_RDM, FI_EP_MSG}) {
        InfoPtr hints = base_hints(type);
        InfoPtr list;
        ASSERT_FI_OK(getinfo(hints.get(), &list)) << "ep_type " << type;
        ASSERT_GE(count_infos(list.get()), 1u);
        for (fi_info *i = list.get(); i; i = i->next) EXPECT_EQ(i->ep_attr->type, type);
    }
}

TEST(GetInfo, UnspecifiedEpTypeReturnsBothTypes) {
    InfoPtr hints = base_hints(FI_EP_UNSPEC);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    bool rdm = false, msg = false;
    for (fi_info *i = list.get(); i; i = i->next) {
        rdm |= i->ep_attr->type == FI_EP_RDM;
        msg |= i->ep_attr->type == FI_EP_MSG;
        EXPECT_TRUE(i->ep_attr->type == FI_EP_RDM || i->ep_attr->type == FI_EP_MSG)
            << "unexpected ep type " << i->ep_attr->type;
    }
    EXPECT_TRUE(rdm);
    EXPECT_TRUE(msg);
}

TEST(GetInfo, DgramIsNotOffered) {
    InfoPtr hints = base_hints(FI_EP_DGRAM);
    InfoPtr list;
    EXPECT_EQ(getinfo(hints.get(), &list), -FI_ENODATA);
}

TEST(GetInfo, AddressFormatIsSockaddrIn) {
    InfoPtr hints = base_hints();
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next) {
        EXPECT_EQ(i->addr_format, static_cast<uint32_t>(FI_SOCKADDR_IN));
        if (i->src_addr) {
            EXPECT_EQ(i->src_addrlen, sizeof(sockaddr_in));
            EXPECT_EQ(static_cast<const sockaddr *>(i->src_addr)->sa_family, AF_INET);
        }
    }
}

// The issue asks for FI_SOCKADDR_IN and FI_SOCKADDR_IN6: with IN6 hints every entry speaks
// IPv6, and two RDM endpoints on the loopback domain exchange a message over [::1].
TEST(GetInfo, Ipv6AddressFormatCarriesData) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    hints->addr_format = FI_SOCKADDR_IN6;
    hints->caps = FI_MSG;
    InfoPtr list;
    int ret = getinfo(hints.get(), &list, "::1", "0", FI_SOURCE);
    if (ret == -FI_ENODATA) GTEST_SKIP() << "no interface has an IPv6 address on this machine";
    ASSERT_FI_OK(ret);
    for (fi_info *i = list.get(); i; i = i->next) {
        EXPECT_EQ(i->addr_format, uint32_t(FI_SOCKADDR_IN6));
        ASSERT_NE(i->src_addr, nullptr);
        EXPECT_EQ(i->src_addrlen, sizeof(sockaddr_in6));
    }
    fi_info *info = list.get();
    info->domain_attr->mr_mode &= ~FI_MR_LOCAL;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    ASSERT_FI_OK(fi_fabric(info->fabric_attr, &fabric, nullptr));
    ASSERT_FI_OK(fi_domain(fabric, info, &domain, nullptr));
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    fid_av *av = nullptr;
    fid_cq *cq = nullptr;
    fid_ep *ep[2] = {};
    ASSERT_FI_OK(fi_av_open(domain, &av_attr, &av, nullptr));
    ASSERT_FI_OK(fi_cq_open(domain, &cq_attr, &cq, nullptr));
    fi_addr_t addr[2];
    for (int k = 0; k < 2; ++k) {
        ASSERT_FI_OK(fi_endpoint(domain, info, &ep[k], nullptr));
        ASSERT_FI_OK(fi_ep_bind(ep[k], &av->fid, 0));
        ASSERT_FI_OK(fi_ep_bind(ep[k], &cq->fid, FI_TRANSMIT | FI_RECV));
        ASSERT_FI_OK(fi_enable(ep[k]));
        sockaddr_in6 name{};
        size_t len = sizeof name;
        ASSERT_FI_OK(fi_getname(&ep[k]->fid, &name, &len));
        EXPECT_EQ(name.sin6_family, AF_INET6);
        ASSERT_EQ(fi_av_insert(av, &name, 1, &addr[k], 0, nullptr), 1);
    }
    char out[] = "over ipv6", in[sizeof out] = {};
    fi_context rctx, sctx;
    ASSERT_FI_OK(fi_recv(ep[1], in, sizeof in, nullptr, FI_ADDR_UNSPEC, &rctx));
    ASSERT_FI_OK(fi_send(ep[0], out, sizeof out, nullptr, addr[1], &sctx));
    int seen = 0;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (seen < 2 && std::chrono::steady_clock::now() < end) {
        fi_cq_entry e;
        if (fi_cq_read(cq, &e, 1) == 1) ++seen;
    }
    EXPECT_EQ(seen, 2);
    EXPECT_STREQ(in, out);
    for (auto *e : ep) fi_close(&e->fid);
    fi_close(&cq->fid);
    fi_close(&av->fid);
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
}

TEST(GetInfo, RdmOffersAllAdvertisedCapabilities) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    const uint64_t want = FI_MSG | FI_TAGGED | FI_RMA | FI_READ | FI_WRITE | FI_SEND | FI_RECV |
                          FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MULTI_RECV | FI_SOURCE |
                          FI_DIRECTED_RECV | FI_RMA_EVENT | FI_SHARED_AV | FI_LOCAL_COMM |
                          FI_REMOTE_COMM;
    hints->caps = want;
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next)
        EXPECT_EQ(i->caps & want, want) << "missing caps: " << fi_tostr(&i->caps, FI_TYPE_CAPS);
}

TEST(GetInfo, MsgEndpointOffersMsgAndRma) {
    InfoPtr hints = base_hints(FI_EP_MSG);
    const uint64_t want =
        FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_SEND | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE;
    hints->caps = want;
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next) EXPECT_EQ(i->caps & want, want);
}

TEST(GetInfo, AtomicsAreOfferedWithTheirOrdering) {
    for (fi_ep_type type : {FI_EP_RDM, FI_EP_MSG}) {
        InfoPtr hints = base_hints(type);
        hints->caps = FI_MSG | FI_ATOMIC;
        hints->tx_attr->msg_order = FI_ORDER_ATOMIC_RAW | FI_ORDER_ATOMIC_WAW;
        InfoPtr list;
        ASSERT_FI_OK(getinfo(hints.get(), &list)) << fi_tostr(&type, FI_TYPE_EP_TYPE);
        for (fi_info *i = list.get(); i; i = i->next) {
            EXPECT_EQ(i->caps & FI_ATOMIC, uint64_t{FI_ATOMIC});
            EXPECT_EQ(i->tx_attr->caps & FI_ATOMIC, uint64_t{FI_ATOMIC});
            constexpr uint64_t kAtomicOrder = FI_ORDER_ATOMIC_RAR | FI_ORDER_ATOMIC_RAW |
                                              FI_ORDER_ATOMIC_WAR | FI_ORDER_ATOMIC_WAW;
            EXPECT_EQ(i->tx_attr->msg_order & kAtomicOrder, kAtomicOrder);
        }
    }
}

TEST(GetInfo, OnlyRequestedPrimaryCapabilitiesAreReturned) {
    for (uint64_t req : {uint64_t{FI_MSG}, uint64_t{FI_TAGGED}, uint64_t{FI_RMA}}) {
        InfoPtr hints = base_hints(FI_EP_RDM);
        hints->caps = req;
        InfoPtr list;
        ASSERT_FI_OK(getinfo(hints.get(), &list)) << fi_tostr(&req, FI_TYPE_CAPS);
        for (fi_info *i = list.get(); i; i = i->next) {
            uint64_t extra = i->caps & kPrimaryCaps & ~req;
            const std::string req_s = fi_tostr(&req, FI_TYPE_CAPS);
            const std::string extra_s = fi_tostr(&extra, FI_TYPE_CAPS);
            EXPECT_EQ(extra, 0u) << "requested " << req_s << ", got extra primary caps " << extra_s;
            EXPECT_EQ(i->caps & req, req);
        }
    }
}

// fi_getinfo(3): a primary capability without directions means all of them, and the answer
// names them (fabtests 2.x bind counters by the directions they find in info->caps).
TEST(GetInfo, PrimaryCapabilityWithoutDirectionsIsGrantedInEveryDirection) {
    constexpr uint64_t kRmaDirections = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    InfoPtr hints = base_hints(FI_EP_RDM);
    hints->caps = FI_MSG | FI_RMA;
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    EXPECT_EQ(list->caps & (FI_SEND | FI_RECV), uint64_t(FI_SEND | FI_RECV));
    EXPECT_EQ(list->caps & kRmaDirections, kRmaDirections);
    EXPECT_EQ(list->rx_attr->caps & (FI_REMOTE_READ | FI_REMOTE_WRITE),
              uint64_t(FI_REMOTE_READ | FI_REMOTE_WRITE));
    // A direction named restricts the capability to it.
    hints->caps = FI_RMA | FI_READ;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    EXPECT_EQ(list->caps & kRmaDirections, uint64_t(FI_READ));
}

TEST(GetInfo, MaxMessageSizeIsAtLeastOneGiB) {
    for (fi_ep_type type : {FI_EP_RDM, FI_EP_MSG}) {
        InfoPtr hints = base_hints(type);
        InfoPtr list;
        ASSERT_FI_OK(getinfo(hints.get(), &list));
        for (fi_info *i = list.get(); i; i = i->next)
            EXPECT_GE(i->ep_attr->max_msg_size, size_t{1} << 30) << "ep_type " << type;
    }
}

TEST(GetInfo, InjectSizeIsPositive) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    hints->caps = FI_MSG | FI_TAGGED | FI_RMA;
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next) {
        EXPECT_GT(i->tx_attr->inject_size, 0u);
        EXPECT_GE(i->tx_attr->iov_limit, 1u);
        EXPECT_GE(i->rx_attr->iov_limit, 1u);
        EXPECT_GE(i->tx_attr->rma_iov_limit, 1u);
    }
}

// fi_endpoint(3): the size of a queue is what the application asks for, up to the provider's
// maximum (an unrequested size is that maximum; a larger request cannot be met).
TEST(GetInfo, RequestedQueueSizesAreTheOnesReturned) {
    InfoPtr hints = base_hints(FI_EP_MSG);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    const size_t max_tx = list->tx_attr->size, max_rx = list->rx_attr->size;
    ASSERT_GT(max_tx, 128u);
    ASSERT_GT(max_rx, 128u);
    hints->tx_attr->size = 128;
    hints->rx_attr->size = 100;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next) {
        EXPECT_EQ(i->tx_attr->size, 128u);
        EXPECT_EQ(i->rx_attr->size, 100u);
    }
    hints->rx_attr->size = max_rx + 1;
    EXPECT_EQ(getinfo(hints.get(), &list), -FI_ENODATA);
}

// Progress is manual when the application leaves it unspecified (or asks for manual).
TEST(GetInfo, ProgressIsManualUnlessAutoIsAsked) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next) {
        EXPECT_EQ(i->domain_attr->data_progress, FI_PROGRESS_MANUAL);
        EXPECT_EQ(i->domain_attr->control_progress, FI_PROGRESS_MANUAL);
    }
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next)
        EXPECT_EQ(i->domain_attr->data_progress, FI_PROGRESS_MANUAL);
}

// FI_PROGRESS_AUTO, for data or control or both, is answered on every endpoint type and
// capability set, every domain, whatever the memory-registration mode (tcp;ofi_rxm answers
// them all; libfabric's own test matrices ask for it in about half their configurations).
TEST(GetInfo, AutoProgressIsOfferedEverywhere) {
    struct Ask {
        fi_progress control, data;
    };
    const Ask asks[] = {{FI_PROGRESS_AUTO, FI_PROGRESS_AUTO},
                        {FI_PROGRESS_UNSPEC, FI_PROGRESS_AUTO},
                        {FI_PROGRESS_AUTO, FI_PROGRESS_MANUAL}};
    const uint64_t cap_sets[] = {FI_MSG | FI_TAGGED, FI_RMA, FI_ATOMIC};
    const int mr_modes[] = {0, FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY};
    for (fi_ep_type type : {FI_EP_RDM, FI_EP_MSG})
        for (const Ask &ask : asks)
            for (uint64_t caps : cap_sets)
                for (int mr_mode : mr_modes) {
                    InfoPtr hints = base_hints(type);
                    hints->caps = caps;
                    hints->domain_attr->mr_mode = mr_mode;
                    hints->domain_attr->control_progress = ask.control;
                    hints->domain_attr->data_progress = ask.data;
                    InfoPtr list;
                    ASSERT_FI_OK(getinfo(hints.get(), &list))
                        << "type " << type << " caps " << std::hex << caps << " mr_mode "
                        << mr_mode;
                    for (fi_info *i = list.get(); i; i = i->next) {
                        EXPECT_EQ(i->domain_attr->data_progress, ask.data == FI_PROGRESS_AUTO
                                                                     ? FI_PROGRESS_AUTO
                                                                     : FI_PROGRESS_MANUAL);
                        EXPECT_EQ(i->domain_attr->control_progress, ask.control == FI_PROGRESS_AUTO
                                                                        ? FI_PROGRESS_AUTO
                                                                        : FI_PROGRESS_MANUAL);
                    }
                }
}

TEST(GetInfo, ThreadSafeIsOffered) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    hints->domain_attr->threading = FI_THREAD_SAFE;
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next)
        EXPECT_EQ(i->domain_attr->threading, FI_THREAD_SAFE);
}

// The interfaces that deserve a domain (docs/user-guide.md): an IPv4 address, up, and a
// carrier (IFF_RUNNING). A bridge with no port up (docker0 before any container) has an
// address and no carrier: nothing could reach an endpoint there.
std::set<std::string> ipv4_interfaces() {
    std::set<std::string> names;
    ifaddrs *ifa = nullptr;
    if (getifaddrs(&ifa) != 0) return names;
    for (ifaddrs *p = ifa; p; p = p->ifa_next)
        if (p->ifa_addr && p->ifa_addr->sa_family == AF_INET && (p->ifa_flags & IFF_UP) &&
            (p->ifa_flags & IFF_RUNNING))
            names.insert(p->ifa_name);
    freeifaddrs(ifa);
    return names;
}

TEST(GetInfo, OneDomainPerIpInterfaceIncludingLoopback) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    std::set<std::string> domains;
    for (fi_info *i = list.get(); i; i = i->next) {
        ASSERT_NE(i->domain_attr->name, nullptr);
        domains.insert(i->domain_attr->name);
    }
    EXPECT_TRUE(domains.count("lo")) << "no domain named \"lo\"";
    const std::set<std::string> ifs = ipv4_interfaces();
    for (auto &d : domains) EXPECT_TRUE(ifs.count(d)) << "domain " << d << " is no IPv4 interface";
    for (auto &ifname : ifs)
        EXPECT_TRUE(domains.count(ifname)) << "interface " << ifname << " has no domain";
}

TEST(GetInfo, DomainNameHintSelectsLoopback) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    hints->domain_attr->name = strdup("lo");
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next) {
        EXPECT_STREQ(i->domain_attr->name, "lo");
        if (i->src_addr) {
            auto *sin = static_cast<const sockaddr_in *>(i->src_addr);
            EXPECT_EQ(ntohl(sin->sin_addr.s_addr) >> 24, 127u) << ipv4(sin);
        }
    }
}

TEST(GetInfo, UnknownDomainNameGivesNoData) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    hints->domain_attr->name = strdup("no-such-interface0");
    InfoPtr list;
    EXPECT_EQ(getinfo(hints.get(), &list), -FI_ENODATA);
}

TEST(GetInfo, NodeAndServiceGiveDestinationAddress) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list, "127.0.0.1", "4711", 0));
    for (fi_info *i = list.get(); i; i = i->next) {
        ASSERT_NE(i->dest_addr, nullptr);
        ASSERT_EQ(i->dest_addrlen, sizeof(sockaddr_in));
        auto *sin = static_cast<const sockaddr_in *>(i->dest_addr);
        EXPECT_EQ(sin->sin_family, AF_INET);
        EXPECT_EQ(ipv4(sin), "127.0.0.1");
        EXPECT_EQ(ntohs(sin->sin_port), 4711);
    }
}

TEST(GetInfo, SourceFlagGivesSourceAddress) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list, "127.0.0.1", "4712", FI_SOURCE));
    for (fi_info *i = list.get(); i; i = i->next) {
        ASSERT_NE(i->src_addr, nullptr);
        ASSERT_EQ(i->src_addrlen, sizeof(sockaddr_in));
        auto *sin = static_cast<const sockaddr_in *>(i->src_addr);
        EXPECT_EQ(ipv4(sin), "127.0.0.1");
        EXPECT_EQ(ntohs(sin->sin_port), 4712);
        EXPECT_STREQ(i->domain_attr->name, "lo");
    }
}

// Every entry names a source address, hints or not: that of its domain's interface when the
// caller gave none (fabtests' fi_getinfo_test checks it with no hints at all).
TEST(GetInfo, EveryEntryNamesItsSourceWithoutHints) {
    fi_info *raw = nullptr;
    ASSERT_FI_OK(fi_getinfo(kApiVersion, nullptr, nullptr, 0, nullptr, &raw));
    InfoPtr all(raw);
    size_t own = 0;
    for (fi_info *i = all.get(); i; i = i->next) {
        if (!is_own(i)) continue;
        ++own;
        ASSERT_NE(i->src_addr, nullptr) << i->domain_attr->name;
        ASSERT_EQ(i->src_addrlen, sizeof(sockaddr_in));
        EXPECT_EQ(static_cast<const sockaddr_in *>(i->src_addr)->sin_family, AF_INET);
        if (std::string(i->domain_attr->name) == "lo") {
            EXPECT_EQ(ipv4(i->src_addr), "127.0.0.1");
        }
    }
    EXPECT_GE(own, 1u);
}

// A wildcard listen with a service through tandem;ofi_rxm: rxm asks tandem without the
// service and writes the port into each answer's src_addr, so tandem's answers must carry
// one (the core crashed here when they did not).
TEST(GetInfo, WildcardListenWithAServiceThroughRxm) {
    InfoPtr hints = alloc_hints();
    hints->fabric_attr->prov_name = strdup((std::string(provider_name()) + ";ofi_rxm").c_str());
    hints->ep_attr->type = FI_EP_RDM;
    fi_info *raw = nullptr;
    ASSERT_FI_OK(fi_getinfo(kApiVersion, nullptr, "4713", FI_SOURCE, hints.get(), &raw));
    InfoPtr all(raw);
    for (fi_info *i = all.get(); i; i = i->next) {
        ASSERT_NE(i->src_addr, nullptr);
        EXPECT_EQ(ntohs(static_cast<const sockaddr_in *>(i->src_addr)->sin_port), 4713);
    }
}

// tx_attr and rx_attr carry their direction's capabilities; FI_LOCAL_COMM, FI_REMOTE_COMM
// and FI_SHARED_AV are the domain's (fabtests' fi_getinfo_test checks this, hints or not).
TEST(GetInfo, TransmitAndReceiveCapsHoldNoDomainCaps) {
    constexpr uint64_t kDomainCaps = FI_LOCAL_COMM | FI_REMOTE_COMM | FI_SHARED_AV;
    fi_info *raw = nullptr;
    ASSERT_FI_OK(fi_getinfo(kApiVersion, nullptr, nullptr, 0, nullptr, &raw));
    InfoPtr all(raw);
    for (fi_info *i = all.get(); i; i = i->next) {
        if (!is_own(i)) continue;
        EXPECT_EQ(i->tx_attr->caps & kDomainCaps, 0u) << i->domain_attr->name;
        EXPECT_EQ(i->rx_attr->caps & kDomainCaps, 0u) << i->domain_attr->name;
        EXPECT_EQ(i->tx_attr->caps & ~i->caps, 0u);
        EXPECT_EQ(i->rx_attr->caps & ~i->caps, 0u);
    }
}

// A shared AV is something only an RDM endpoint has: hints asking for it in domain caps get
// RDM entries that report it, and no MSG entry.
TEST(GetInfo, SharedAvDomainCapIsAnsweredByRdmOnly) {
    InfoPtr hints = base_hints(FI_EP_UNSPEC);
    hints->domain_attr->caps = FI_SHARED_AV;
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    for (fi_info *i = list.get(); i; i = i->next) {
        EXPECT_EQ(i->ep_attr->type, FI_EP_RDM);
        EXPECT_TRUE(i->domain_attr->caps & FI_SHARED_AV);
    }
}

// fi_getinfo(3): a passive endpoint given in hints->handle is copied to every answer's handle.
TEST(GetInfo, PassiveEndpointHandleIsCopied) {
    InfoPtr hints = base_hints(FI_EP_MSG);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list, "127.0.0.1", nullptr, FI_SOURCE));
    Fid<fid_fabric> fabric;
    ASSERT_FI_OK(fi_fabric(list->fabric_attr, fabric.out(), nullptr));
    Fid<fid_pep> pep;
    ASSERT_FI_OK(fi_passive_ep(fabric, list.get(), pep.out(), nullptr));
    hints->handle = &pep->fid;
    fi_info *raw = nullptr;
    ASSERT_FI_OK(fi_getinfo(kApiVersion, "127.0.0.1", "4714", 0, hints.get(), &raw));
    hints->handle = nullptr;
    InfoPtr all(raw);
    for (fi_info *i = all.get(); i; i = i->next) EXPECT_EQ(i->handle, &pep->fid);
}

// FI_MR_LOCAL / VIRT_ADDR / ALLOCATED / PROV_KEY are negotiated: whatever subset the
// application offers, the provider answers and never requires a mode that was not offered.
TEST(GetInfo, MrModeIsNegotiatedForEveryOfferedSubset) {
    for (int offered : {0, FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_PROV_KEY,
                        FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED,
                        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY}) {
        InfoPtr hints = base_hints(FI_EP_RDM);
        hints->caps = FI_MSG | FI_TAGGED | FI_RMA;
        hints->domain_attr->mr_mode = offered;
        InfoPtr list;
        ASSERT_FI_OK(getinfo(hints.get(), &list)) << "offered mr_mode 0x" << std::hex << offered;
        for (fi_info *i = list.get(); i; i = i->next) {
            int got = i->domain_attr->mr_mode;
            EXPECT_EQ(got & ~offered, 0)
                << "offered 0x" << std::hex << offered << ", got 0x" << got;
        }
    }
}

TEST(GetInfo, FabricAndDomainOpenFromEveryInfo) {
    InfoPtr hints = base_hints(FI_EP_RDM);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list, "127.0.0.1", nullptr, FI_SOURCE));
    fi_info *i = list.get();
    Fid<fid_fabric> fabric;
    ASSERT_FI_OK(fi_fabric(i->fabric_attr, fabric.out(), nullptr));
    Fid<fid_domain> domain;
    ASSERT_FI_OK(fi_domain(fabric, i, domain.out(), nullptr));
    EXPECT_GT(i->domain_attr->mr_key_size, 0u);
    EXPECT_GE(i->domain_attr->mr_iov_limit, 1u);
    EXPECT_GE(i->domain_attr->cq_cnt, 1u);
    EXPECT_GE(i->domain_attr->ep_cnt, 2u);
}

TEST(GetInfo, DupInfoOfProviderInfoOpensFabric) {
    InfoPtr hints = base_hints(FI_EP_MSG);
    InfoPtr list;
    ASSERT_FI_OK(getinfo(hints.get(), &list));
    InfoPtr dup(fi_dupinfo(list.get()));
    ASSERT_NE(dup, nullptr);
    Fid<fid_fabric> fabric;
    ASSERT_FI_OK(fi_fabric(dup->fabric_attr, fabric.out(), nullptr));
    Fid<fid_domain> domain;
    ASSERT_FI_OK(fi_domain(fabric, dup.get(), domain.out(), nullptr));
}

}  // namespace
}  // namespace tandem_test

namespace tandem_test {
namespace {

// A destination on another host is not reached from the loopback domain: an endpoint at
// 127.0.0.1 could connect out but never be connected to in return. A destination of this
// host (its own address, or loopback) is.
TEST(GetInfo, LoopbackDomainOnlyForThisHostsAddresses) {
    auto domains = [](const char *node) {
        InfoPtr hints = alloc_hints();
        hints->fabric_attr->prov_name = strdup(provider_name());
        InfoPtr out;
        std::set<std::string> names;
        if (getinfo(hints.get(), &out, node, "4711") == 0)
            for (fi_info *i = out.get(); i; i = i->next) names.insert(i->domain_attr->name);
        return names;
    };
    EXPECT_EQ(domains("203.0.113.7").count("lo"), 0u) << "lo offered for a host of TEST-NET-3";
    EXPECT_EQ(domains("127.0.0.2").count("lo"), 1u);
}

}  // namespace
}  // namespace tandem_test

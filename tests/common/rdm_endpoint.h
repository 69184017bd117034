// One tandem RDM endpoint on 127.0.0.1 with its fabric, domain, CQ and AV, opened through the
// libfabric ABI only: the set-up the peer tests share (each asks for the capabilities it
// needs; the environment, set before the provider loads, picks the path).
#pragma once

#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <netinet/in.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace tandem_test {

struct RdmEndpoint {
    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_cq *cq = nullptr;
    fid_av *av = nullptr;
    fid_ep *ep = nullptr;
    // Called before fi_enable, when set (options that must come first).
    std::function<void(fid_ep *)> before_enable;
    uint64_t av_flags = 0;  // fi_av_attr::flags of the endpoint's AV

    // Returns false, with the step that failed in `why`, instead of asserting: usable in a
    // forked child, which reports through its exit status.
    // port: 0 for any, else the endpoint's own port (fi_getinfo's service with FI_SOURCE).
    bool try_open(std::string &why, uint64_t caps = FI_MSG | FI_TAGGED, uint16_t port = 0) {
        fi_info *hints = fi_allocinfo();
        hints->ep_attr->type = FI_EP_RDM;
        hints->caps = caps;
        hints->fabric_attr->prov_name = strdup("tandem");
        fi_info *all = nullptr;
        std::string service = std::to_string(port);
        int ret = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", port ? service.c_str() : nullptr,
                             port ? FI_SOURCE : 0, hints, &all);
        fi_freeinfo(hints);
        if (ret) return why = "fi_getinfo", false;
        for (fi_info *fi = all; fi && !info; fi = fi->next)
            if (strcmp(fi->fabric_attr->prov_name, "tandem") == 0) info = fi_dupinfo(fi);
        fi_freeinfo(all);
        if (!info) return why = "no plain tandem entry", false;
        return try_open_info(why);
    }
    // The same, for an endpoint described by `info` (set by the caller, freed by close()).
    bool try_open_info(std::string &why) {
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        av_attr.flags = av_flags;
        if (fi_fabric(info->fabric_attr, &fabric, nullptr) ||
            fi_domain(fabric, info, &domain, nullptr) ||
            fi_cq_open(domain, &cq_attr, &cq, nullptr) ||
            fi_av_open(domain, &av_attr, &av, nullptr) || fi_endpoint(domain, info, &ep, nullptr) ||
            fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) || fi_ep_bind(ep, &av->fid, 0))
            return why = "opening the endpoint", false;
        if (before_enable) before_enable(ep);
        if (fi_enable(ep)) return why = "fi_enable", false;
        return true;
    }
    void open(uint64_t caps = FI_MSG | FI_TAGGED) {
        std::string why;
        ASSERT_TRUE(try_open(why, caps)) << why;
    }
    // The endpoint's own address, when it is IPv4 (a zeroed one, family 0, otherwise).
    sockaddr_in ipv4_name() const {
        sockaddr_in name{};
        size_t len = sizeof name;
        if (!ep || fi_getname(&ep->fid, &name, &len) != 0 || name.sin_family != AF_INET) return {};
        return name;
    }
    // other's address in this endpoint's AV.
    fi_addr_t insert(const RdmEndpoint &other) {
        char name[64];
        size_t len = sizeof name;
        EXPECT_EQ(fi_getname(&other.ep->fid, name, &len), 0);
        fi_addr_t addr = FI_ADDR_NOTAVAIL;
        EXPECT_EQ(fi_av_insert(av, name, 1, &addr, 0, nullptr), 1);
        return addr;
    }
    // Drives progress; appends the contexts of successful completions, counts errors.
    void poll(std::vector<void *> &done, size_t &errors) {
        fi_cq_tagged_entry e[8];
        ssize_t n = fi_cq_read(cq, e, 8);
        for (ssize_t i = 0; i < n; ++i) done.push_back(e[i].op_context);
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(cq, &err, 0) == 1) ++errors;
        }
    }
    void close() {
        if (ep) fi_close(&ep->fid);
        if (av) fi_close(&av->fid);
        if (cq) fi_close(&cq->fid);
        if (domain) fi_close(&domain->fid);
        if (fabric) fi_close(&fabric->fid);
        fi_freeinfo(info);
        *this = RdmEndpoint{};
    }
};

}  // namespace tandem_test

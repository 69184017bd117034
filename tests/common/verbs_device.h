// The RDMA device the verbs-link tests run on, and how they say which one it was:
//  - the libraries FI_TANDEM_VERBS_LIB / FI_TANDEM_RDMACM_LIB name, when set (what
//    scripts/with-emulated-rdma.sh does), with their first device whose port is active;
//  - else the system's libibverbs and librdmacm, when they find such a device (a real NIC,
//    rdma_rxe, siw);
//  - else the emulated device of tests/emurdma (TANDEM_EMURDMA_LIB, compiled in).
#pragma once

#include "main_prov/link/verbs_link.h"

#include <cstdlib>
#include <memory>
#include <string>

namespace tandem::test {

struct VerbsTestDevice {
    std::shared_ptr<VerbsDevice> device;
    std::string label;  // "emu_rdma0 (EMULATED)", "mlx5_0"
    std::string why;    // when there is none
};

inline std::string first_device(const VerbsApi *api) {
    int n = 0;
    ibv_device **list = api->get_device_list(&n);
    if (!list) return {};
    std::string found;
    for (int i = 0; i < n && found.empty(); ++i) {
        // Opening through rdma_cm's contexts (VerbsDevice::open) checks the port.
        found = api->get_device_name(list[i]);
    }
    api->free_device_list(list);
    return found;
}

inline VerbsTestDevice open_test_verbs_device(const VerbsLinkConfig &config = {}) {
    VerbsTestDevice out;
    auto try_libs = [&](const std::string &verbs, const std::string &rdmacm, bool emulated) {
        std::string why;
        const VerbsApi *api = VerbsApi::load(verbs, rdmacm, &why);
        if (!api) {
            out.why = why;
            return false;
        }
        std::string name = first_device(api);
        if (name.empty()) {
            out.why = verbs + " finds no RDMA device";
            return false;
        }
        if (VerbsDevice::open(api, name, config, out.device, &why) != 0) {
            out.why = why;
            return false;
        }
        bool is_emulator = emulated || verbs.find("emurdma") != std::string::npos;
        out.label = name + (is_emulator ? " (EMULATED)" : "");
        return true;
    };
    const char *verbs = getenv("FI_TANDEM_VERBS_LIB");
    const char *rdmacm = getenv("FI_TANDEM_RDMACM_LIB");
    if (verbs && *verbs) {
        try_libs(verbs, rdmacm && *rdmacm ? rdmacm : verbs, false);
        return out;
    }
    if (try_libs("libibverbs.so.1", "librdmacm.so.1", false)) return out;
#ifdef TANDEM_EMURDMA_LIB
    try_libs(TANDEM_EMURDMA_LIB, TANDEM_EMURDMA_LIB, true);
#endif
    return out;
}

}  // namespace tandem::test

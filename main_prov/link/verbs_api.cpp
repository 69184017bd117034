// Loading the verbs table (verbs_api.h).
#include "main_prov/link/verbs_api.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace tandem {
namespace {

// field, symbol, required
#define TANDEM_VERBS_CALLS(X)                               \
    X(get_device_list, ibv_get_device_list, true)           \
    X(free_device_list, ibv_free_device_list, true)         \
    X(get_device_name, ibv_get_device_name, true)           \
    X(query_device, ibv_query_device, true)                 \
    X(query_port, ibv_query_port, true)                     \
    X(alloc_pd, ibv_alloc_pd, true)                         \
    X(dealloc_pd, ibv_dealloc_pd, true)                     \
    X(reg_mr, ibv_reg_mr, true)                             \
    X(reg_dmabuf_mr, ibv_reg_dmabuf_mr, false)              \
    X(dereg_mr, ibv_dereg_mr, true)                         \
    X(create_comp_channel, ibv_create_comp_channel, true)   \
    X(destroy_comp_channel, ibv_destroy_comp_channel, true) \
    X(create_cq, ibv_create_cq, true)                       \
    X(destroy_cq, ibv_destroy_cq, true)                     \
    X(get_cq_event, ibv_get_cq_event, true)                 \
    X(ack_cq_events, ibv_ack_cq_events, true)               \
    X(create_srq, ibv_create_srq, true)                     \
    X(destroy_srq, ibv_destroy_srq, true)                   \
    X(modify_qp, ibv_modify_qp, true)                       \
    X(query_qp, ibv_query_qp, true)                         \
    X(wc_status_str, ibv_wc_status_str, true)               \
    X(get_async_event, ibv_get_async_event, true)           \
    X(ack_async_event, ibv_ack_async_event, true)           \
    X(event_type_str, ibv_event_type_str, true)

#define TANDEM_RDMACM_CALLS(X)                                 \
    X(create_event_channel, rdma_create_event_channel, true)   \
    X(destroy_event_channel, rdma_destroy_event_channel, true) \
    X(create_id, rdma_create_id, true)                         \
    X(destroy_id, rdma_destroy_id, true)                       \
    X(bind_addr, rdma_bind_addr, true)                         \
    X(resolve_addr, rdma_resolve_addr, true)                   \
    X(resolve_route, rdma_resolve_route, true)                 \
    X(listen, rdma_listen, true)                               \
    X(create_qp, rdma_create_qp, true)                         \
    X(destroy_qp, rdma_destroy_qp, true)                       \
    X(connect, rdma_connect, true)                             \
    X(accept, rdma_accept, true)                               \
    X(reject, rdma_reject, true)                               \
    X(disconnect, rdma_disconnect, true)                       \
    X(get_cm_event, rdma_get_cm_event, true)                   \
    X(ack_cm_event, rdma_ack_cm_event, true)                   \
    X(migrate_id, rdma_migrate_id, true)                       \
    X(event_str, rdma_event_str, true)                         \
    X(get_devices, rdma_get_devices, true)                     \
    X(free_devices, rdma_free_devices, true)

bool find(void *lib, const char *symbol, bool required, void **out, std::string *why) {
    *out = dlsym(lib, symbol);
    if (*out || !required) return true;
    *why = std::string("no ") + symbol;
    return false;
}

void *open_library(const std::string &path, std::string *why) {
    void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *err = dlerror();
        *why = "cannot load " + path + (err ? std::string(": ") + err : std::string());
    }
    return lib;
}

std::unique_ptr<VerbsApi> load_table(const std::string &verbs_path, const std::string &rdmacm_path,
                                     std::string *why) {
    void *verbs = open_library(verbs_path, why);
    if (!verbs) return nullptr;
    void *rdmacm = open_library(rdmacm_path, why);
    if (!rdmacm) return nullptr;
    auto api = std::make_unique<VerbsApi>();
    void *sym = nullptr;
#define TANDEM_FIND(field, symbol, required)                        \
    if (!find(verbs, #symbol, required, &sym, why)) return nullptr; \
    api->field = reinterpret_cast<decltype(api->field)>(sym);
    TANDEM_VERBS_CALLS(TANDEM_FIND)
#undef TANDEM_FIND
#define TANDEM_FIND(field, symbol, required)                         \
    if (!find(rdmacm, #symbol, required, &sym, why)) return nullptr; \
    api->field = reinterpret_cast<decltype(api->field)>(sym);
    TANDEM_RDMACM_CALLS(TANDEM_FIND)
#undef TANDEM_FIND
    api->verbs_path = verbs_path;
    api->rdmacm_path = rdmacm_path;
    return api;
}

}  // namespace

const VerbsApi *VerbsApi::load(const std::string &verbs_path, const std::string &rdmacm_path,
                               std::string *why) {
    static std::mutex mu;
    static std::map<std::pair<std::string, std::string>, std::unique_ptr<VerbsApi>> loaded;
    static std::map<std::pair<std::string, std::string>, std::string> failed;
    std::lock_guard lk(mu);
    auto key = std::make_pair(verbs_path, rdmacm_path);
    if (auto it = loaded.find(key); it != loaded.end()) return it->second.get();
    if (auto it = failed.find(key); it != failed.end()) {
        *why = it->second;
        return nullptr;
    }
    auto api = load_table(verbs_path, rdmacm_path, why);
    if (!api) {
        failed[key] = *why;
        return nullptr;
    }
    return (loaded[key] = std::move(api)).get();
}

}  // namespace tandem

// The libibverbs and librdmacm calls the verbs link makes, loaded at run time through one
// narrow table: tandem has no link-time dependency on rdma-core, loads and runs its TCP link
// on hosts without it, and can be pointed at another implementation of the same API (the
// emulated RDMA device of the tests) by naming the libraries (FI_TANDEM_VERBS_LIB,
// FI_TANDEM_RDMACM_LIB).
//
// The data path (ibv_post_send, ibv_post_recv, ibv_post_srq_recv, ibv_poll_cq,
// ibv_req_notify_cq) is not in the table: rdma-core's headers define those as inline calls
// through the context's own operations, which whatever library made the context filled in.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <string>

namespace tandem {

struct VerbsApi {
    // libibverbs
    ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(ibv_device **list);
    const char *(*get_device_name)(ibv_device *dev);
    int (*query_device)(ibv_context *ctx, ibv_device_attr *attr);
    // The exported ibv_query_port (the header's inline form needs the extended context);
    // it fills the leading fields of ibv_port_attr.
    int (*query_port)(ibv_context *ctx, uint8_t port, ibv_port_attr *attr);
    ibv_pd *(*alloc_pd)(ibv_context *ctx);
    int (*dealloc_pd)(ibv_pd *pd);
    ibv_mr *(*reg_mr)(ibv_pd *pd, void *addr, size_t len, int access);
    // Absent before rdma-core 34: then no GPUDirect registration.
    ibv_mr *(*reg_dmabuf_mr)(ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
                             int access);
    int (*dereg_mr)(ibv_mr *mr);
    ibv_comp_channel *(*create_comp_channel)(ibv_context *ctx);
    int (*destroy_comp_channel)(ibv_comp_channel *channel);
    ibv_cq *(*create_cq)(ibv_context *ctx, int cqe, void *cq_context, ibv_comp_channel *channel,
                         int comp_vector);
    int (*destroy_cq)(ibv_cq *cq);
    int (*get_cq_event)(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(ibv_cq *cq, unsigned int nevents);
    ibv_srq *(*create_srq)(ibv_pd *pd, ibv_srq_init_attr *attr);
    int (*destroy_srq)(ibv_srq *srq);
    int (*modify_qp)(ibv_qp *qp, ibv_qp_attr *attr, int mask);
    int (*query_qp)(ibv_qp *qp, ibv_qp_attr *attr, int mask, ibv_qp_init_attr *init);
    const char *(*wc_status_str)(ibv_wc_status status);
    int (*get_async_event)(ibv_context *ctx, ibv_async_event *event);
    void (*ack_async_event)(ibv_async_event *event);
    const char *(*event_type_str)(ibv_event_type type);

    // librdmacm
    rdma_event_channel *(*create_event_channel)();
    void (*destroy_event_channel)(rdma_event_channel *channel);
    int (*create_id)(rdma_event_channel *channel, rdma_cm_id **id, void *context,
                     rdma_port_space ps);
    int (*destroy_id)(rdma_cm_id *id);
    int (*bind_addr)(rdma_cm_id *id, sockaddr *addr);
    int (*resolve_addr)(rdma_cm_id *id, sockaddr *src, sockaddr *dst, int timeout_ms);
    int (*resolve_route)(rdma_cm_id *id, int timeout_ms);
    int (*listen)(rdma_cm_id *id, int backlog);
    int (*create_qp)(rdma_cm_id *id, ibv_pd *pd, ibv_qp_init_attr *attr);
    void (*destroy_qp)(rdma_cm_id *id);
    int (*connect)(rdma_cm_id *id, rdma_conn_param *param);
    int (*accept)(rdma_cm_id *id, rdma_conn_param *param);
    int (*reject)(rdma_cm_id *id, const void *priv, uint8_t len);
    int (*disconnect)(rdma_cm_id *id);
    int (*get_cm_event)(rdma_event_channel *channel, rdma_cm_event **event);
    int (*ack_cm_event)(rdma_cm_event *event);
    int (*migrate_id)(rdma_cm_id *id, rdma_event_channel *channel);
    const char *(*event_str)(rdma_cm_event_type event);
    ibv_context **(*get_devices)(int *num);
    void (*free_devices)(ibv_context **list);

    std::string verbs_path, rdmacm_path;  // what was loaded

    // The table for these libraries, loaded once per process and never unloaded (a context
    // may outlive every endpoint that used it); nullptr with *why set when a library or one of
    // its calls is missing.
    static const VerbsApi *load(const std::string &verbs_path, const std::string &rdmacm_path,
                                std::string *why);
};

}  // namespace tandem

// The NCCL network plugin ABI, versions 6 to 12: NCCL 2.30 looks for `ncclNetPlugin_v12` first
// (2.28 for `_v11`) and falls back, version by version, to `ncclNetPlugin_v6`. Declared here from
// NCCL's ext-net documentation and headers (ext-net/example/nccl/net_v*.h at v2.28.9-1,
// plugins/net/example/nccl/net_v12.h at v2.30.7-1), not copied: the static_asserts at the end
// pin every size and offset NCCL's own headers give on x86-64 and aarch64 (LP64), so that a
// wrong declaration fails the build rather than a job.
//
// v12 has v11's table, function for function and signature for signature; what changed is in
// the properties: a virtual NIC may fuse 8 devices (4 before), which moves every field after
// vProps, and railId/planeId (int16_t) are appended.
//
// The older tables differ in three ways only, which the adaptors in exports.cpp bridge:
//   - v11 has a per-communicator context (init returns it; listen and connect take it) and the
//     traffic class in init's config; v10 passes the config to connect; v9 and older neither.
//   - v9 widened isend/irecv sizes to size_t; v7 widened regMr's size to size_t (v8).
//   - newer properties append fields (regIsGlobal v8, forceFlush and the limits v9,
//     maxMultiRequestSize v11); v6 has no device offload handles.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::nccl {

enum Result : int {
    kSuccess = 0,
    kUnhandledCudaError = 1,
    kSystemError = 2,
    kInternalError = 3,
    kInvalidArgument = 4,
    kInvalidUsage = 5,
    kRemoteError = 6,
};

enum LogLevel : int {
    kLogNone = 0,
    kLogVersion = 1,
    kLogWarn = 2,
    kLogInfo = 3,
    kLogAbort = 4,
    kLogTrace = 5,
};
// Subsystem flags of a log line (NCCL_DEBUG_SUBSYS): the plugin logs as NET, INIT at start.
inline constexpr unsigned long kLogSubsysInit = 1;
inline constexpr unsigned long kLogSubsysNet = 16;

using Logger = void (*)(LogLevel level, unsigned long flags, const char *file, int line,
                        const char *fmt, ...);
// The profiler callback (v10+): the plugin records no events of its own.
using ProfilerCallback = Result (*)(void **event, int type, void *phandle, int64_t plugin_id,
                                    void *ext_data);

inline constexpr int kPtrHost = 0x1;
inline constexpr int kPtrCuda = 0x2;
inline constexpr int kPtrDmabuf = 0x4;

inline constexpr size_t kHandleMaxSize = 128;              // NCCL_NET_HANDLE_MAXSIZE
inline constexpr int kMaxRequests = 32;                    // NCCL_NET_MAX_REQUESTS, per comm
inline constexpr int kMaxDevsPerNic = 4;                   // NCCL_NET_MAX_DEVS_PER_NIC, v9-v11
inline constexpr int kMaxDevsPerNicV12 = 8;                // NCCL_NET_MAX_DEVS_PER_NIC_V12
inline constexpr int16_t kNetIdUndef = -1;                 // NCCL_NET_ID_UNDEF: railId, planeId
inline constexpr uintptr_t kOptionalRecvCompletion = 0x1;  // *request on entry to irecv (LL)
inline constexpr size_t kMaxNetSize = size_t{1} << 30;     // what NCCL's adaptors report before v9

enum DeviceType : int { kDeviceHost = 0, kDeviceUnpack = 1 };
inline constexpr int kDeviceInvalidVersion = 0;

// Device offload handle (v7+). This plugin offers none (netDeviceType HOST); the type exists
// for the connect/accept signatures.
struct DeviceHandle {
    DeviceType type;
    int version;
    void *handle;
    size_t size;
    int needs_proxy_progress;
};

struct VirtualDeviceProps {
    int ndevs;
    int devs[kMaxDevsPerNic];
};

struct VirtualDevicePropsV12 {
    int ndevs;
    int devs[kMaxDevsPerNicV12];
};

struct CommConfig {
    int traffic_class;  // -1: undefined
};

struct CommAttr {
    int32_t max_concurrent_peers, min_concurrent_peers, max_flows_per_peer, min_flows_per_peer;
};
struct NetAttr {
    CommAttr send_comm, recv_comm;
    uint32_t op, algo, proto;
};

// ---- properties --------------------------------------------------------------------------------

struct PropertiesV6 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int speed;  // Mbps
    int port;
    float latency;  // µs
    int max_comms;
    int max_recvs;
};
struct PropertiesV7 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    DeviceType device_type;
    int device_version;
};
struct PropertiesV8 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int reg_is_global;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    DeviceType device_type;
    int device_version;
};
// v9 and v10 share one layout.
struct PropertiesV9 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int reg_is_global;
    int force_flush;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    DeviceType device_type;
    int device_version;
    VirtualDeviceProps vprops;
    size_t max_p2p_bytes;
    size_t max_coll_bytes;
};
struct PropertiesV11 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int reg_is_global;
    int force_flush;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    DeviceType device_type;
    int device_version;
    VirtualDeviceProps vprops;
    size_t max_p2p_bytes;
    size_t max_coll_bytes;
    int max_multi_request_size;
};

// v12: vprops of 8 devices, and the rail and plane of the NIC (kNetIdUndef: NCCL ignores them).
struct PropertiesV12 {
    char *name;
    char *pci_path;
    uint64_t guid;
    int ptr_support;
    int reg_is_global;
    int force_flush;
    int speed;
    int port;
    float latency;
    int max_comms;
    int max_recvs;
    DeviceType device_type;
    int device_version;
    VirtualDevicePropsV12 vprops;
    size_t max_p2p_bytes;
    size_t max_coll_bytes;
    int max_multi_request_size;
    int16_t rail_id;
    int16_t plane_id;
};

// ---- the tables --------------------------------------------------------------------------------
// Each names its version, the symbol NCCL looks it up by, and its properties' layout (static
// members: no part of the layout).

struct NetV6 {
    static constexpr int kVersion = 6;
    static constexpr const char *kSymbol = "ncclNetPlugin_v6";
    using Properties = PropertiesV6;
    const char *name;
    Result (*init)(Logger);
    Result (*devices)(int *ndev);
    Result (*get_properties)(int dev, PropertiesV6 *props);
    Result (*listen)(int dev, void *handle, void **listen_comm);
    Result (*connect)(int dev, void *handle, void **send_comm);
    Result (*accept)(void *listen_comm, void **recv_comm);
    Result (*reg_mr)(void *comm, void *data, int size, int type, void **mhandle);
    Result (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                            void **mhandle);
    Result (*dereg_mr)(void *comm, void *mhandle);
    Result (*isend)(void *send_comm, void *data, int size, int tag, void *mhandle, void **request);
    Result (*irecv)(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                    void **request);
    Result (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                     void **request);
    Result (*test)(void *request, int *done, int *sizes);
    Result (*close_send)(void *send_comm);
    Result (*close_recv)(void *recv_comm);
    Result (*close_listen)(void *listen_comm);
};

// v7: v6 plus device handles on connect/accept, getDeviceMr and irecvConsumed. v8 is the same
// with regMr's size a size_t and regIsGlobal in the properties.
template <int V, typename Props, typename RegSize>
struct NetV7Layout {
    static constexpr int kVersion = V;
    static constexpr const char *kSymbol = V == 7 ? "ncclNetPlugin_v7" : "ncclNetPlugin_v8";
    using Properties = Props;
    const char *name;
    Result (*init)(Logger);
    Result (*devices)(int *ndev);
    Result (*get_properties)(int dev, Props *props);
    Result (*listen)(int dev, void *handle, void **listen_comm);
    Result (*connect)(int dev, void *handle, void **send_comm, DeviceHandle **send_dev_comm);
    Result (*accept)(void *listen_comm, void **recv_comm, DeviceHandle **recv_dev_comm);
    Result (*reg_mr)(void *comm, void *data, RegSize size, int type, void **mhandle);
    Result (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                            void **mhandle);
    Result (*dereg_mr)(void *comm, void *mhandle);
    Result (*isend)(void *send_comm, void *data, int size, int tag, void *mhandle, void **request);
    Result (*irecv)(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                    void **request);
    Result (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                     void **request);
    Result (*test)(void *request, int *done, int *sizes);
    Result (*close_send)(void *send_comm);
    Result (*close_recv)(void *recv_comm);
    Result (*close_listen)(void *listen_comm);
    Result (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    Result (*irecv_consumed)(void *recv_comm, int n, void *request);
};
using NetV7 = NetV7Layout<7, PropertiesV7, int>;
using NetV8 = NetV7Layout<8, PropertiesV8, size_t>;

// v9: size_t message sizes, makeVDevice.
struct NetV9 {
    static constexpr int kVersion = 9;
    static constexpr const char *kSymbol = "ncclNetPlugin_v9";
    using Properties = PropertiesV9;
    const char *name;
    Result (*init)(Logger);
    Result (*devices)(int *ndev);
    Result (*get_properties)(int dev, PropertiesV9 *props);
    Result (*listen)(int dev, void *handle, void **listen_comm);
    Result (*connect)(int dev, void *handle, void **send_comm, DeviceHandle **send_dev_comm);
    Result (*accept)(void *listen_comm, void **recv_comm, DeviceHandle **recv_dev_comm);
    Result (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
    Result (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                            void **mhandle);
    Result (*dereg_mr)(void *comm, void *mhandle);
    Result (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                    void **request);
    Result (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                    void **request);
    Result (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                     void **request);
    Result (*test)(void *request, int *done, int *sizes);
    Result (*close_send)(void *send_comm);
    Result (*close_recv)(void *recv_comm);
    Result (*close_listen)(void *listen_comm);
    Result (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    Result (*irecv_consumed)(void *recv_comm, int n, void *request);
    Result (*make_vdevice)(int *dev, VirtualDeviceProps *props);
};

// v10: the profiler callback in init, the config in connect, profiler handles on isend/irecv.
struct NetV10 {
    static constexpr int kVersion = 10;
    static constexpr const char *kSymbol = "ncclNetPlugin_v10";
    using Properties = PropertiesV9;
    const char *name;
    Result (*init)(Logger, ProfilerCallback);
    Result (*devices)(int *ndev);
    Result (*get_properties)(int dev, PropertiesV9 *props);
    Result (*listen)(int dev, void *handle, void **listen_comm);
    Result (*connect)(int dev, CommConfig *config, void *handle, void **send_comm,
                      DeviceHandle **send_dev_comm);
    Result (*accept)(void *listen_comm, void **recv_comm, DeviceHandle **recv_dev_comm);
    Result (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
    Result (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                            void **mhandle);
    Result (*dereg_mr)(void *comm, void *mhandle);
    Result (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                    void **request);
    Result (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                    void **phandles, void **request);
    Result (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                     void **request);
    Result (*test)(void *request, int *done, int *sizes);
    Result (*close_send)(void *send_comm);
    Result (*close_recv)(void *recv_comm);
    Result (*close_listen)(void *listen_comm);
    Result (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    Result (*irecv_consumed)(void *recv_comm, int n, void *request);
    Result (*make_vdevice)(int *dev, VirtualDeviceProps *props);
};

// v11: a context per communicator (from init, into listen/connect), finalize, setNetAttr.
struct NetV11 {
    static constexpr int kVersion = 11;
    static constexpr const char *kSymbol = "ncclNetPlugin_v11";
    using Properties = PropertiesV11;
    const char *name;
    Result (*init)(void **ctx, uint64_t comm_id, CommConfig *config, Logger, ProfilerCallback);
    Result (*devices)(int *ndev);
    Result (*get_properties)(int dev, PropertiesV11 *props);
    Result (*listen)(void *ctx, int dev, void *handle, void **listen_comm);
    Result (*connect)(void *ctx, int dev, void *handle, void **send_comm,
                      DeviceHandle **send_dev_comm);
    Result (*accept)(void *listen_comm, void **recv_comm, DeviceHandle **recv_dev_comm);
    Result (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
    Result (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                            void **mhandle);
    Result (*dereg_mr)(void *comm, void *mhandle);
    Result (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                    void **request);
    Result (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                    void **phandles, void **request);
    Result (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                     void **request);
    Result (*test)(void *request, int *done, int *sizes);
    Result (*close_send)(void *send_comm);
    Result (*close_recv)(void *recv_comm);
    Result (*close_listen)(void *listen_comm);
    Result (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    Result (*irecv_consumed)(void *recv_comm, int n, void *request);
    Result (*make_vdevice)(int *dev, VirtualDeviceProps *props);
    Result (*finalize)(void *ctx);
    Result (*set_net_attr)(void *ctx, NetAttr *attr);
};

// v12: v11's calls; the properties and makeVDevice's argument are v12's.
struct NetV12 {
    static constexpr int kVersion = 12;
    static constexpr const char *kSymbol = "ncclNetPlugin_v12";
    using Properties = PropertiesV12;
    const char *name;
    Result (*init)(void **ctx, uint64_t comm_id, CommConfig *config, Logger, ProfilerCallback);
    Result (*devices)(int *ndev);
    Result (*get_properties)(int dev, PropertiesV12 *props);
    Result (*listen)(void *ctx, int dev, void *handle, void **listen_comm);
    Result (*connect)(void *ctx, int dev, void *handle, void **send_comm,
                      DeviceHandle **send_dev_comm);
    Result (*accept)(void *listen_comm, void **recv_comm, DeviceHandle **recv_dev_comm);
    Result (*reg_mr)(void *comm, void *data, size_t size, int type, void **mhandle);
    Result (*reg_mr_dmabuf)(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                            void **mhandle);
    Result (*dereg_mr)(void *comm, void *mhandle);
    Result (*isend)(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                    void **request);
    Result (*irecv)(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                    void **phandles, void **request);
    Result (*iflush)(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                     void **request);
    Result (*test)(void *request, int *done, int *sizes);
    Result (*close_send)(void *send_comm);
    Result (*close_recv)(void *recv_comm);
    Result (*close_listen)(void *listen_comm);
    Result (*get_device_mr)(void *comm, void *mhandle, void **dptr_mhandle);
    Result (*irecv_consumed)(void *recv_comm, int n, void *request);
    Result (*make_vdevice)(int *dev, VirtualDevicePropsV12 *props);
    Result (*finalize)(void *ctx);
    Result (*set_net_attr)(void *ctx, NetAttr *attr);
};

// ---- the layouts NCCL's headers define (LP64) ---------------------------------------------------

static_assert(sizeof(Result) == 4 && sizeof(DeviceType) == 4);
static_assert(sizeof(DeviceHandle) == 32 && offsetof(DeviceHandle, size) == 16 &&
              offsetof(DeviceHandle, needs_proxy_progress) == 24);
static_assert(sizeof(VirtualDeviceProps) == 20 && sizeof(CommConfig) == 4);
static_assert(sizeof(VirtualDevicePropsV12) == 36 && offsetof(VirtualDevicePropsV12, devs) == 4);
static_assert(sizeof(NetAttr) == 44 && offsetof(NetAttr, op) == 32);

static_assert(sizeof(PropertiesV6) == 48 && offsetof(PropertiesV6, ptr_support) == 24 &&
              offsetof(PropertiesV6, max_recvs) == 44);
static_assert(sizeof(PropertiesV7) == 56 && offsetof(PropertiesV7, speed) == 28);
static_assert(sizeof(PropertiesV8) == 64 && offsetof(PropertiesV8, speed) == 32 &&
              offsetof(PropertiesV8, device_version) == 56);
static_assert(sizeof(PropertiesV9) == 104 && offsetof(PropertiesV9, vprops) == 64 &&
              offsetof(PropertiesV9, max_p2p_bytes) == 88 &&
              offsetof(PropertiesV9, max_coll_bytes) == 96);
static_assert(sizeof(PropertiesV11) == 112 && offsetof(PropertiesV11, ptr_support) == 24 &&
              offsetof(PropertiesV11, latency) == 44 &&
              offsetof(PropertiesV11, device_type) == 56 && offsetof(PropertiesV11, vprops) == 64 &&
              offsetof(PropertiesV11, max_p2p_bytes) == 88 &&
              offsetof(PropertiesV11, max_coll_bytes) == 96 &&
              offsetof(PropertiesV11, max_multi_request_size) == 104);
static_assert(sizeof(PropertiesV12) == 128 && offsetof(PropertiesV12, ptr_support) == 24 &&
              offsetof(PropertiesV12, speed) == 36 && offsetof(PropertiesV12, latency) == 44 &&
              offsetof(PropertiesV12, device_type) == 56 && offsetof(PropertiesV12, vprops) == 64 &&
              offsetof(PropertiesV12, max_p2p_bytes) == 104 &&
              offsetof(PropertiesV12, max_coll_bytes) == 112 &&
              offsetof(PropertiesV12, max_multi_request_size) == 120 &&
              offsetof(PropertiesV12, rail_id) == 124 && offsetof(PropertiesV12, plane_id) == 126);

static_assert(sizeof(NetV6) == 136 && offsetof(NetV6, close_listen) == 128);
static_assert(sizeof(NetV7) == 152 && offsetof(NetV7, irecv_consumed) == 144);
static_assert(sizeof(NetV8) == 152 && offsetof(NetV8, irecv_consumed) == 144);
static_assert(sizeof(NetV9) == 160 && offsetof(NetV9, make_vdevice) == 152);
static_assert(sizeof(NetV10) == 160 && offsetof(NetV10, isend) == 80 &&
              offsetof(NetV10, make_vdevice) == 152);
static_assert(sizeof(NetV11) == 176 && offsetof(NetV11, isend) == 80 &&
              offsetof(NetV11, test) == 104 && offsetof(NetV11, get_device_mr) == 136 &&
              offsetof(NetV11, make_vdevice) == 152 && offsetof(NetV11, finalize) == 160 &&
              offsetof(NetV11, set_net_attr) == 168);
static_assert(sizeof(NetV12) == 176 && offsetof(NetV12, get_properties) == 24 &&
              offsetof(NetV12, isend) == 80 && offsetof(NetV12, test) == 104 &&
              offsetof(NetV12, make_vdevice) == 152 && offsetof(NetV12, finalize) == 160 &&
              offsetof(NetV12, set_net_attr) == 168);

}  // namespace tandem::nccl

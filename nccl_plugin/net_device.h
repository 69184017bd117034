// One NCCL network device of the plugin: one of tandem's RDM domains (an interface, as
// fi_getinfo lists them), opened at its first listen or connect with one endpoint, one tagged
// CQ and one address table that every comm of the device shares. Comms differ by the numbers
// in their tags (common/wire.h, "The NCCL network plugin").
//
// Protocol, per send and receive buffer (docs/architecture.md, "The NCCL network plugin"):
//   - the receiver posts a tagged receive into the buffer and sends a clear-to-send (NcclCts:
//     where the buffer is, its key and size) to the sender, those of a burst of receives in one
//     message;
//   - a send up to the eager limit goes at once as a tagged message into that receive, and
//     completes when it has left (its clear-to-send is dropped when it comes);
//   - a larger one waits for its clear-to-send, is written into the buffer with fi_write (so
//     device memory moves peer to peer as FI_OPT_FI_HMEM_P2P allows), and once the write has
//     completed (the data is in place) it is announced by a 0-byte tagged message whose remote
//     CQ data is its size. Into a buffer too small it writes nothing and announces that, and
//     both ends fail it.
//
// Thread safety: every call locks the device; NCCL's proxy threads of different communicators
// may share it.
#pragma once

#include "common/fabric_compat.h"
#include "common/wire.h"
#include "nccl_plugin/device.h"
#include "nccl_plugin/handle_table.h"
#include "nccl_plugin/log.h"
#include "nccl_plugin/nccl_net_abi.h"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <array>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tandem::nccl {

inline constexpr int kMaxRecvs = 8;  // buffers of one grouped receive (maxRecvs)

// iflush of a device of the plugin. tandem completes a receive into device memory after the CUDA
// copy that wrote it (node-local path and TCP link alike), so there is nothing to flush: no
// request, as NCCL's own transports answer when no flush is needed, once the arguments are
// checked against the device's receive comms and memory handles (under its lock).
template <class RecvTable, class MemoryTable>
Result flush_nothing(std::mutex &mu, const RecvTable &recvs, const MemoryTable &memory,
                     void *recv_comm, int n, void **mhandles, void **request) {
    if (!request) WARN_RETURN(kInternalError, "NET/tandem: iflush without an output");
    *request = nullptr;
    if (n < 1 || n > kMaxRecvs)
        WARN_RETURN(kInternalError, "NET/tandem: iflush of %d buffers (maxRecvs is %d)", n,
                    kMaxRecvs);
    std::lock_guard lk(mu);
    if (!recvs.find(recv_comm))
        WARN_RETURN(kInvalidUsage, "NET/tandem: iflush: %p is no receive comm", recv_comm);
    for (int i = 0; i < n; ++i)
        if (mhandles && mhandles[i] && !memory.find(mhandles[i]))
            WARN_RETURN(kInvalidUsage, "NET/tandem: iflush: %p is no memory handle", mhandles[i]);
    return kSuccess;
}

// Settings read once, at the first init (docs/user-guide.md, "NCCL").
struct Options {
    // NCCL_TANDEM_EAGER_MAX. Up to tandem's own link eager limit a tagged message costs one
    // frame on the link and a single copy node-local, as a write does, without waiting for the
    // clear-to-send; measured, it moved 64 KiB 5-10% faster than a write (docs/user-guide.md).
    size_t eager_max = 65536;
    int p2p = -1;  // NCCL_TANDEM_P2P: an FI_HMEM_P2P_* value; -1 keeps tandem's
};

// What getProperties reports, found at init.
struct DeviceDescription {
    std::string name;      // the domain (interface) name
    std::string pci_path;  // /sys/... of its PCI function; empty for a virtual interface
    int speed_mbps = 0;
    size_t max_msg_size = 0;
    bool hmem = false;  // the domain offers FI_HMEM: CUDA buffers may be registered
};

class NetDevice : public Device {
  public:
    // `info` is one of fi_getinfo's results for this device (copied).
    NetDevice(uint8_t index, const fi_info *info, DeviceDescription description,
              const Options &options);
    ~NetDevice();
    NetDevice(const NetDevice &) = delete;
    NetDevice &operator=(const NetDevice &) = delete;

    const DeviceDescription &description() const { return description_; }

    Result listen(void *handle, void **listen_comm) override;
    Result connect(void *handle, void **send_comm) override;
    Result accept(void *listen_comm, void **recv_comm) override;
    Result reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) override;
    Result reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                         void **mhandle) override;
    Result dereg_mr(void *comm, void *mhandle) override;
    Result isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                 void **request) override;
    // isend, written at `offset` into the receive buffer (a virtual NIC's part of a message).
    // Only a send above the eager limit (an RMA write) may have an offset.
    Result isend_at(void *send_comm, void *data, size_t size, size_t offset, int tag, void *mhandle,
                    void **request);
    Result irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
                 void **mhandles, void **request) override;
    Result iflush(void *recv_comm, int n, void **mhandles, void **request) override;
    Result test(void *request, int *done, int *sizes) override;
    Result close_send(void *send_comm) override;
    Result close_recv(void *recv_comm) override;
    Result close_listen(void *listen_comm) override;

    void shut_down() override;
    size_t open_comms() override;
    size_t eager_max() const { return options_.eager_max; }

  private:
    Result register_memory(void *comm, void *data, size_t size, int type,
                           const compat::MrDmabuf *dmabuf, void **mhandle);
    // One operation posted to libfabric; its fi_context2 is what completions hand back.
    enum class OpKind : uint8_t {
        SendData,     // an eager tagged send
        Write,        // the RMA write of a large send
        RecvData,     // one buffer of a grouped receive
        CtsRecv,      // a send comm's standing receive of clear-to-sends
        ConnectRecv,  // a listen comm's receive of the Connect
        AcceptRecv,   // a connecting send comm's receive of the Accept
        Handshake,    // a Connect or Accept on its way
    };
    struct Op {
        fi_context2 ctx;  // first: op_context is the Op
        OpKind kind;
        int sub = 0;           // the buffer of the request
        uint64_t request = 0;  // handle (the request may be gone: the comm was closed)
        uint64_t comm = 0;     // handle of the comm it serves
        uint64_t mr = 0;       // memory handle it uses, 0 for none
        uint64_t fin_tag = 0, fin_size = 0;  // Write: its announcement, sent once it completed
        wire::NcclConnect connect;           // ConnectRecv, AcceptRecv, Handshake
        std::vector<wire::NcclCts> batch;    // CtsRecv: kNcclCtsBatch entries
    };
    struct Request {
        uint64_t comm = 0;
        bool send = false;
        int n = 1;
        int pending = 0;  // conditions still to come (sends: data left and CTS arrived)
        Result error = kSuccess;
        std::array<int, kMaxRecvs> sizes{};
    };
    struct MemHandle {
        fid_mr *mr = nullptr;
        void *desc = nullptr;
        uint64_t key = 0;
        uintptr_t base = 0;
        size_t size = 0;
        int users = 0;  // operations under way on it
    };
    struct ListenComm {
        uint32_t number = 0;
        uint64_t nonce = 0;
        Op *posted = nullptr;  // the Connect receive
        bool arrived = false, accepted = false;
        wire::NcclConnect peer{};
    };
    // A large send waiting for its clear-to-send, or (writes_) for room to start.
    struct PendingSend {
        uint64_t request = 0;
        void *data = nullptr;
        size_t size = 0;
        uint64_t mr = 0;
        size_t offset = 0;  // into the receive buffer
    };
    struct SendComm {
        uint32_t number = 0, remote = 0;
        fi_addr_t peer = FI_ADDR_UNSPEC;
        uint64_t nonce = 0;
        bool ready = false, failed = false;
        std::unordered_map<int, uint32_t> seq;  // per NCCL tag: sends issued
        // Clear-to-sends of buffers whose send is still to come; large sends waiting for
        // theirs. By (tag, count).
        std::unordered_map<uint64_t, wire::NcclCts> cts;
        std::unordered_map<uint64_t, PendingSend> waiting;
        std::vector<Op *> posted;
        int inflight = 0;
    };
    struct RecvComm {
        uint32_t number = 0, remote = 0;
        fi_addr_t peer = FI_ADDR_UNSPEC;
        std::unordered_map<int, uint32_t> seq;  // per NCCL tag: buffers posted
        std::vector<Op *> posted;
        std::vector<wire::NcclCts> cts_out;  // clear-to-sends not yet sent (one message)
        int inflight = 0;
    };
    struct ControlMessage {
        fi_addr_t to;
        uint64_t tag, data;
        bool with_data;
        std::vector<uint8_t> bytes;
    };
    struct QueuedWrite {
        uint64_t comm;
        PendingSend send;
        wire::NcclCts cts;
    };

    Result open_locked();
    void close_locked();
    void progress_locked();
    void complete(Op *op, uint64_t flags, size_t len, uint64_t data);
    // complete's cases: true from those that posted their receive again (the op goes on).
    void recv_data_done(const Op &op, uint64_t flags, size_t len, uint64_t data);
    bool cts_batch_arrived(Op *op, size_t len);
    bool connect_arrived(Op *op, size_t len);
    void accept_arrived(const Op &op, size_t len);
    void fail(Op *op, int err, const char *cause);
    void finish_op(Op *op);
    void sub_done(uint64_t request, Result error);
    void cts_arrived(uint64_t comm_handle, SendComm &comm, const wire::NcclCts &cts);
    bool start_write(const QueuedWrite &w);
    Result post_receive(Op *op, void *buf, size_t len, void *desc, fi_addr_t from, uint64_t tag,
                        uint64_t ignore);
    void send_control(fi_addr_t to, uint64_t tag, const void *buf, size_t len, uint64_t data,
                      bool with_data);
    void flush_control();
    void flush_cts();
    void send_cts(RecvComm &comm);
    bool flush_writes();
    Op *new_op(int kind);
    void release_mr(uint64_t mr);
    uint32_t take_number();
    Result fabric_error(const char *call, int ret);
    void cancel_posted(std::vector<Op *> &posted);
    void drop_requests(uint64_t comm);
    fi_addr_t peer_address(const uint8_t *addr, size_t len);
    // connect's parts.
    Result connect_again(wire::NcclHandle &in, void *handle, void **send_comm);
    Result post_send_comm_receives(uint64_t h, SendComm &comm);
    ssize_t send_handshake(Op *op, fi_addr_t peer, uint64_t tag);

    uint8_t index_;
    fi_info *info_ = nullptr;
    DeviceDescription description_;
    Options options_;

    std::mutex mu_;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_av *av_ = nullptr;
    fid_cq *cq_ = nullptr;
    fid_ep *ep_ = nullptr;
    std::array<uint8_t, wire::kNcclMaxAddr> name_{};
    size_t name_len_ = 0;
    bool virt_addr_ = false;  // RMA addresses are virtual (FI_MR_VIRT_ADDR), else offsets

    HandleTable<ListenComm> listens_;
    HandleTable<SendComm> sends_;
    HandleTable<RecvComm> recvs_;
    HandleTable<Request> requests_;
    HandleTable<MemHandle> memory_;
    std::unordered_set<Op *> ops_;          // posted to libfabric: freed at their completion
    std::unordered_set<uint32_t> numbers_;  // comm numbers in use
    std::unordered_map<std::string, fi_addr_t> peers_;  // by endpoint name
    uint32_t next_number_ = 1;
    std::deque<ControlMessage> control_;  // injects that found no room, in order
    std::vector<uint64_t> cts_pending_;   // receive comms with clear-to-sends to send
    std::vector<Op *> spare_ops_;         // finished operations, for reuse
    std::deque<QueuedWrite> writes_;      // large sends that found no room, in order
};

}  // namespace tandem::nccl

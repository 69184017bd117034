// The verbs link: LinkTransport/LinkConnection over RDMA verbs RC queue pairs, connected by
// rdma_cm, driven by the owner's progress calls (the NIC moves the data; no thread here).
//
//  VerbsDevice     one RDMA device port of a domain: the context rdma_cm uses for it and one
//                  protection domain, so that every endpoint of the domain reaches memory the
//                  domain registered (LinkDomain::register_region -> ibv_reg_mr / dma-buf).
//  VerbsTransport  per endpoint: an rdma_cm event channel and listener, one CQ with a
//                  completion channel (its fd is what wait sets sleep on), one SRQ every queue
//                  pair draws its receives from, and a registered slab of send buffers (a send
//                  above the inline size is copied into one, so the protocol's send buffers
//                  need no registration). The protocol's receive buffers go to the SRQ
//                  themselves, each registered the first time it is posted (the protocol posts
//                  the same buffers again and again, for the transport's life): a message
//                  without a buffer meets a receiver-not-ready at the NIC, as the contract
//                  wants.
//  VerbsConnection one RC queue pair and its rdma_cm id.
//
// Local memory of RDMA reads and writes (the application's buffers) is registered for the
// one work request and deregistered when it completes; device memory through its dma-buf
// where the device and the NIC allow (GPUDirect RDMA), else staged through a host buffer.
//
// Defined in verbs_device.cpp (VerbsDevice), verbs_connection.cpp (a queue pair's work
// requests), verbs_cm.cpp (rdma_cm: listen, connect, accept, events) and verbs_link.cpp (the
// rest of VerbsTransport); verbs_link_internal.h holds what those files share.
#pragma once

#include "main_prov/link/link.h"
#include "main_prov/link/verbs_api.h"

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem {

struct VerbsLinkConfig {
    uint32_t send_slots = 64;   // registered send buffers per transport
    uint32_t srq_depth = 4096;  // receive buffers the SRQ holds (the device may allow fewer)
    uint32_t sq_depth = 256;    // send work requests per queue pair
    uint32_t cq_depth = 8192;
    uint32_t max_inline = 64;  // asked of each queue pair (the device may give less)
    // RC retries: 7 retries a receiver-not-ready for ever, as the link contract wants (a
    // message without a posted buffer waits for one).
    uint8_t rnr_retry = 7;
    uint8_t retry = 7;
    int resolve_timeout_ms = 2000;
    // GPUDirect RDMA: register device memory with the NIC (dma-buf). Off: device memory is
    // staged through host buffers as on the TCP link.
    bool device_p2p = true;
};

class VerbsTransport;

class VerbsDevice final : public LinkDomain, public std::enable_shared_from_this<VerbsDevice> {
  public:
    // The device named `name` (ibv_get_device_name), with an active port, through rdma_cm's own
    // context for it: a queue pair rdma_cm creates must be in a PD of that context.
    static int open(const VerbsApi *api, const std::string &name, const VerbsLinkConfig &config,
                    std::shared_ptr<VerbsDevice> &out, std::string *why);
    ~VerbsDevice() override;

    const char *kind() const override { return "verbs"; }
    const LinkCaps &caps() const override { return caps_; }
    int register_region(const iovec &iov, hmem::MemRef mem, uint64_t access,
                        std::unique_ptr<LinkRegion> &out) override;
    int register_dmabuf_region(const iovec &iov, hmem::MemRef mem, int fd, uint64_t offset,
                               uint64_t access, std::unique_ptr<LinkRegion> &out) override;
    std::unique_ptr<LinkTransport> transport(RemoteKeyResolver *resolver,
                                             size_t max_send_size) override;

    const VerbsApi &api() const { return *api_; }
    ibv_context *context() const { return ctx_; }
    ibv_pd *pd() const { return pd_; }
    const std::string &name() const { return name_; }
    const ibv_device_attr &attr() const { return attr_; }
    const VerbsLinkConfig &config() const { return config_; }
    // Registers local memory for one work request (host by address, device by dma-buf);
    // nullptr when it cannot (logged).
    ibv_mr *register_local(void *addr, size_t len, hmem::MemRef mem, int access);
    bool registers_device_memory() const { return caps_.device_p2p; }

  private:
    VerbsDevice() = default;

    const VerbsApi *api_ = nullptr;
    ibv_context **cm_devices_ = nullptr;  // rdma_get_devices' list, freed on close
    ibv_context *ctx_ = nullptr;
    ibv_pd *pd_ = nullptr;
    std::string name_;
    ibv_device_attr attr_{};
    VerbsLinkConfig config_;
    LinkCaps caps_;
};

class VerbsConnection final : public LinkConnection {
  public:
    enum class State : uint8_t {
        Resolving,        // active: address and route being resolved
        Connecting,       // active: rdma_connect sent
        RequestReceived,  // passive: reported ConnectRequest, waiting for accept()/reject()
        Accepting,        // passive: rdma_accept sent
        Established,
        Closing,  // rdma_disconnect sent, DISCONNECTED not seen yet
        Closed,   // disconnected, rejected or failed; work requests flushed
    };

    VerbsConnection(VerbsTransport *transport, rdma_cm_id *id, State state);
    ~VerbsConnection() override;

    int post_send(const iovec *iov, size_t count, const uint32_t *imm, uint64_t wr_id,
                  bool if_write_ok = false) override;
    int post_write(const iovec *iov, const hmem::MemRef *mem, size_t count, RemoteRegion dst,
                   const uint32_t *imm, uint64_t wr_id) override;
    int post_read(const iovec *iov, const hmem::MemRef *mem, size_t count, RemoteRegion src,
                  uint64_t wr_id) override;
    int accept(const void *priv, size_t len) override;
    int reject(const void *priv, size_t len) override;
    void disconnect() override;

    // Accepted counts: posts wait (deferred) until the queue pair can send.
    bool established() const override {
        return state_ == State::Established || state_ == State::Accepting;
    }
    bool failed() const override { return state_ == State::Closed; }
    sockaddr_storage peer_address() const override;
    sockaddr_storage local_address() const override;
    int wait_fd() const override { return -1; }  // the transport's CQ and CM channel

    State state() const { return state_; }
    uint32_t qp_num() const { return qp_ ? qp_->qp_num : 0; }

  private:
    friend class VerbsTransport;

    // A work request the link accepted but has not given the NIC yet (no send slot free or
    // the send queue full): issued in order, before anything posted after it.
    struct Deferred {
        WcOpcode opcode;
        std::vector<iovec> iov;
        std::vector<hmem::MemRef> mem;  // empty: host
        RemoteRegion remote{};
        bool has_imm = false;
        uint32_t imm = 0;
        uint64_t wr_id = 0;
    };

    int submit(Deferred &&wr);
    // 1: given to the NIC; 0: no room yet (stays deferred); <0: refused.
    int issue(Deferred &wr);
    // issue()'s helpers, defined beside it and inlined there (stage_rdma, the rare path,
    // is not): they fill `w` for the send-queue record numbered `record`. 1: ready; 0: no
    // room yet; <0: refused.
    inline int fill_send(const Deferred &wr, size_t len, uint32_t record, ibv_send_wr &w);
    inline int fill_rdma(const Deferred &wr, size_t len, uint32_t record, ibv_send_wr &w);
    int stage_rdma(const Deferred &wr, size_t len, uint32_t record, ibv_send_wr &w);
    int create_qp();
    int send_reject(const void *priv, size_t len);
    void fail(const char *why);
    void flush_deferred();

    VerbsTransport *transport_;
    const VerbsApi *api_;  // outlives every transport (a released connection has none)
    rdma_cm_id *id_;
    ibv_qp *qp_ = nullptr;
    State state_;
    bool reported_down_ = false;
    bool rejected_ = false;            // rejected by its owner: the link's, to let go (bury)
    bool ready_ = false;               // ESTABLISHED seen: the queue pair sends
    bool disconnect_pending_ = false;  // closing once what was posted has completed
    uint32_t max_inline_ = 0;
    uint32_t max_sge_ = 1;
    uint32_t sq_depth_ = 1;
    std::deque<uint32_t> outstanding_;  // records at the NIC, in posting order
    std::deque<Deferred> deferred_;
    std::vector<uint8_t> connect_priv_;  // active: sent by rdma_connect once the route is known
};

class VerbsTransport final : public LinkTransport {
  public:
    VerbsTransport(std::shared_ptr<VerbsDevice> device, RemoteKeyResolver *resolver,
                   size_t max_send_size);
    ~VerbsTransport() override;

    // Whether the queues and slabs could be made (a transport that failed refuses everything).
    int status() const { return status_; }

    const LinkCaps &caps() const override { return caps_; }
    int listen(const sockaddr *addr, socklen_t len, int backlog) override;
    sockaddr_storage name() const override;
    LinkConnection *connect(const sockaddr *dst, socklen_t len, const void *priv, size_t priv_len,
                            const sockaddr *src = nullptr, socklen_t src_len = 0) override;
    void adopt(std::unique_ptr<LinkConnection> conn) override;
    void destroy(LinkConnection *conn) override;
    int post_recv(void *buf, size_t len, uint64_t wr_id) override;
    int poll(WorkCompletion *wc, int max) override;
    bool poll_cm(CmEvent &event) override;
    void wait_fds(std::vector<WaitFd> &out) const override;
    void progress_now() override { progress(); }
    bool idle() const override;
    bool busy() const override;
    void disconnect_all() override;
    bool drain(int timeout_ms) override;
    void abort_all() override;
    std::unique_ptr<LinkConnection> release(LinkConnection *conn) override;
    std::unique_ptr<LinkTransport> fresh() const override {
        return device_->transport(resolver_, slot_size_);
    }

    VerbsDevice &device() const { return *device_; }
    void set_device_p2p(bool allowed) override { device_p2p_ = allowed; }

  private:
    friend class VerbsConnection;

    // What the NIC holds for one send-queue work request until its completion.
    struct Record {
        VerbsConnection *conn = nullptr;
        uint64_t wr_id = 0;
        WcOpcode opcode = WcOpcode::Send;
        int32_t slot = -1;          // send slab slot
        std::vector<ibv_mr *> mrs;  // registrations made for this work request
        // Device memory staged through host memory: a read lands in `bounce` and is copied
        // to these pieces when it completes.
        std::vector<uint8_t> bounce;
        std::vector<iovec> scatter_iov;
        std::vector<hmem::MemRef> scatter_mem;
        bool reported = false;  // its completion was already given (aborted): drop the CQE
    };
    // A receive buffer of the protocol at the NIC (its receive work request carries the
    // index).
    struct PostedRecv {
        uint64_t wr_id = 0;
        size_t len = 0;
    };

    void progress();
    void read_cm_events();
    void process_cm_event(rdma_cm_event *ev);
    void poll_cq();
    void retry_deferred();
    void reap_graveyard();
    void bury_rejected();
    ibv_mr *recv_registration(void *buf, size_t len);
    uint32_t new_record();
    void free_record(uint32_t index);
    int take_send_slot();
    uint8_t *send_slot(int32_t slot) const;
    VerbsConnection *find(const LinkConnection *conn) const;
    VerbsConnection *by_qp(uint32_t qp_num) const;
    void report(const CmEvent &ev) { cm_events_.push_back(ev); }
    void complete(const WorkCompletion &wc) { completions_.push_back(wc); }
    void watch_qp(VerbsConnection *conn);
    void unwatch_qp(VerbsConnection *conn);

    std::shared_ptr<VerbsDevice> device_;
    const VerbsApi &api_;
    LinkCaps caps_;  // the device's, with this transport's message size
    RemoteKeyResolver *resolver_;
    int status_ = 0;
    bool rejected_waiting_ = false;  // a rejected connection is still in conns_ (bury_rejected)
    rdma_event_channel *channel_ = nullptr;
    rdma_cm_id *listen_id_ = nullptr;
    ibv_comp_channel *comp_channel_ = nullptr;
    ibv_cq *cq_ = nullptr;
    unsigned unacked_cq_events_ = 0;
    ibv_srq *srq_ = nullptr;
    uint8_t *send_slab_ = nullptr;
    size_t slot_size_ = 0;
    ibv_mr *send_mr_ = nullptr;
    // The protocol's receive buffers, each registered once (by address and length).
    std::unordered_map<const void *, ibv_mr *> recv_mrs_;
    std::vector<PostedRecv> posted_;
    std::vector<uint32_t> free_posted_;
    std::vector<int32_t> free_send_slots_;
    std::vector<Record> records_;
    std::vector<uint32_t> free_records_;
    std::vector<std::unique_ptr<VerbsConnection>> conns_;
    std::vector<std::unique_ptr<VerbsConnection>> graveyard_;  // destroyed, work still at the NIC
    std::unordered_map<uint32_t, VerbsConnection *> by_qp_;
    std::deque<WorkCompletion> completions_;
    std::deque<CmEvent> cm_events_;
    bool deferred_work_ = false;  // some connection holds deferred work requests
    // Connections being made or closed: the rdma_cm channel is read on every pass meanwhile.
    unsigned transitional_ = 0;
    uint64_t passes_ = 0;
    bool cq_failed_ = false;
    bool device_p2p_ = true;  // device memory registered with the NIC (else staged)
};

}  // namespace tandem

// A virtual NIC (makeVDevice): several of the plugin's physical devices (tandem domains: network
// interfaces, RDMA ports) fused into one NCCL device. A connection over it is one link per
// member, each a connection of that member (NetDevice), and every message is split across
// them (docs/architecture.md, "The NCCL network plugin", "Virtual NICs").
//
//   - Striping. A message of at least two stripes (kStripeMin, and always above the members'
//     eager limit) is cut into up to one contiguous part per member; each part is written by
//     its member at its offset into the one receive buffer (NetDevice::isend_at). A smaller
//     message goes whole over one member, round robin. Every member carries one send per
//     message, the others 0 bytes, so that the receiver, which cannot know the size in
//     advance, posts the whole buffer on every member, and the k-th send of every member meets
//     the k-th receive. A receive completes once all members' parts have arrived; its size is
//     their sum.
//   - Connection set-up. NCCL's 128-byte handle has room for one member's listen handle only.
//     The handle carries member 0's; once member 0 is connected, the sender listens on member 0
//     in the other direction and sends that handle over the link (a "hello", the first message
//     of the link, with tag kBootTag); the receiver connects back and sends the listen handles
//     of the other members, which the sender then connects. The reverse link is closed after.
//
// Thread safety: every call locks the virtual device, then the members it calls (which lock
// their own); members never call back.
#pragma once

#include "nccl_plugin/device.h"
#include "nccl_plugin/handle_table.h"
#include "nccl_plugin/net_device.h"

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace tandem::nccl {

class VirtualDevice : public Device {
  public:
    // `members` are the physical devices (their plugin indices in `ids`), all of one process.
    VirtualDevice(uint8_t index, std::vector<NetDevice *> members, std::vector<int> ids);

    const DeviceDescription &description() const { return description_; }
    const std::vector<int> &member_ids() const { return ids_; }
    // Bytes each member has carried for this device's comms (sent, received), completed ones.
    bool member_bytes(size_t member, uint64_t *sent, uint64_t *received);

    Result listen(void *handle, void **listen_comm) override;
    Result connect(void *handle, void **send_comm) override;
    Result accept(void *listen_comm, void **recv_comm) override;
    Result reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) override;
    Result reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                         void **mhandle) override;
    Result dereg_mr(void *comm, void *mhandle) override;
    Result isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                 void **request) override;
    Result irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
                 void **mhandles, void **request) override;
    Result iflush(void *recv_comm, int n, void **mhandles, void **request) override;
    Result test(void *request, int *done, int *sizes) override;
    Result close_send(void *send_comm) override;
    Result close_recv(void *recv_comm) override;
    Result close_listen(void *listen_comm) override;

    void shut_down() override {}  // the members close their own endpoints
    size_t open_comms() override;

    static constexpr size_t kStripeMin = 256 * 1024;  // smallest part of a split message
    static constexpr int kBootTag = 0x76626f6f;       // the set-up messages on member 0's link

  private:
    using HandleBuf = std::array<uint8_t, kHandleMaxSize>;
    static constexpr int kMaxMembers = kMaxDevsPerNicV12;
    // Set-up messages (host memory, registered with the member-0 comm that carries them).
    struct Hello {
        uint32_t magic = 0, ndevs = 0;
        HandleBuf reverse{};  // the sender's listen handle on member 0
    };
    struct MemberHandles {
        uint32_t magic = 0, count = 0;
        std::array<HandleBuf, kMaxMembers - 1> handles{};  // members 1..k-1
    };
    // A set-up message and its registration and request on one member-0 comm.
    template <typename M>
    struct Control {
        std::unique_ptr<M> msg = std::make_unique<M>();
        void *mh = nullptr, *req = nullptr, *comm = nullptr;
    };
    struct ListenComm {
        std::vector<void *> listens;     // per member
        std::vector<HandleBuf> handles;  // per member: what its listen gave
        std::vector<void *> recvs;       // per member, as accepted
        int stage = 0;
        Control<Hello> hello;
        Control<MemberHandles> out;
        HandleBuf reverse{};
        void *rev_send = nullptr;
        bool accepted = false;
    };
    struct Part {
        uint64_t request;
        int member;
        char *data;
        size_t size, offset;
        int tag;
        void *mhandle;
    };
    struct SendComm {
        std::vector<void *> comms;       // per member
        std::vector<HandleBuf> handles;  // per member: the receiver's listen handles
        int stage = 0;
        bool ready = false;
        Control<Hello> hello;
        Control<MemberHandles> in;
        void *rev_listen = nullptr, *rev_recv = nullptr;
        std::deque<Part> queue;  // parts no member has taken yet, in order
        uint64_t next_member = 0;
        int inflight = 0;
    };
    struct RecvComm {
        std::vector<void *> comms;
        int inflight = 0;
    };
    struct Request {
        uint64_t comm = 0;
        bool send = false;
        int n = 1;
        std::array<void *, kMaxMembers> parts{};  // member requests under way
        std::array<size_t, kMaxMembers> bytes{};  // sends: what each part carries
        int pending = 0;                          // parts not completed (posted or not)
        Result error = kSuccess;
        std::array<int, kMaxRecvs> sizes{};
    };
    struct MemHandle {
        std::vector<void *> mh;  // per member; nullptr once deregistered
    };

    size_t k() const { return members_.size(); }
    Result connect_step(SendComm &s);
    Result send_hello(SendComm &s);
    Result receive_handles(SendComm &s);
    Result accept_step(ListenComm &l);
    Result receive_hello(ListenComm &l);
    Result send_handles(ListenComm &l);
    template <typename M>
    Result post_control(Control<M> &c, NetDevice *dev, bool send);
    template <typename M>
    Result finish_control(Control<M> &c, NetDevice *dev, bool *done);
    void plan(SendComm &s, uint64_t rh, char *data, size_t size, int tag, const MemHandle *m);
    void pump(SendComm &s);
    void part_done(Request &r, int member, Result rc, const int *sizes);
    void drop_requests(uint64_t comm);
    Result reg_each(void *comm, void **mhandle,
                    const std::function<Result(size_t, void *, void **)> &reg);

    uint8_t index_;
    std::vector<NetDevice *> members_;
    std::vector<int> ids_;
    DeviceDescription description_;
    size_t stripe_min_;

    std::mutex mu_;
    HandleTable<ListenComm> listens_;
    HandleTable<SendComm> sends_;
    HandleTable<RecvComm> recvs_;
    HandleTable<Request> requests_;
    HandleTable<MemHandle> memory_;
    std::vector<uint64_t> sent_, received_;  // per member
};

}  // namespace tandem::nccl

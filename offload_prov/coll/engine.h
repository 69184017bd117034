// The collective engine of one off_tandem endpoint: the groups its owner joined and their
// operations in flight. Each operation is a schedule (schedule.h, chosen by selection.cpp) run
// by an Operation whose transfers are peer transfers on the owner's endpoint (FI_PEER_TRANSFER,
// tagged wire::coll_tag), so they travel over tandem's own transport and are matched only
// against the twin's receives, never the application's.
//
// A join is itself a collective: the members allgather the hash of their member list in rank
// order under a tag derived from the set alone, so members that listed the set in different
// orders still meet, and fail the join with FI_EINVAL rather than talk past each other.
//
// Device buffers (an fi_mr_desc naming device memory) are staged: the input is copied to host
// memory by the device's copy engine before the first round, the result back after the last.
#pragma once

#include "hmem/hmem.h"
#include "offload_prov/coll/operation.h"
#include "peer/peer_coll.h"

#include <rdma/fi_endpoint.h>

#include <list>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

namespace tandem::off::coll {

class Engine final : public Transport {
  public:
    explicit Engine(fid_ep *owner) : owner_(owner) {}
    ~Engine() override;

    int join(const peer::CollJoin &j, uint64_t *group);
    int post(uint64_t group, const peer::CollWork &w);
    int leave(uint64_t group);
    // Advances every operation; reports those that finished.
    void progress();
    bool busy() const { return !running_.empty(); }

    // Completions of peer transfers: whether the context is one of ours, and its end.
    static bool owns(const void *context);
    void transfer_done(void *context, int err);

    int send(uint32_t peer, uint64_t tag, const void *buf, size_t len, Operation *op) override;
    int recv(uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *op) override;

  private:
    struct Group {
        std::vector<fi_addr_t> members;
        uint32_t rank = 0;
        uint32_t id = 0;  // tag bits (wire::coll_tag)
        uint64_t ordered_key = 0;
        uint16_t next_seq = 0;
        size_t running = 0;  // operations (the join among them) not yet reported
    };
    struct Running {
        Group *group = nullptr;
        std::optional<Operation> op;
        // Staged device buffers: the host copies the schedule works on.
        std::vector<uint8_t> send_stage, recv_stage;
        void *recv_user = nullptr;
        hmem::MemRef recv_mem{};
        size_t recv_bytes = 0;
        bool recv_staged = false;
        // A join: the keys the members sent, checked against ours when the exchange is over.
        bool join = false;
        uint64_t key = 0;
        std::vector<uint64_t> keys;
        int status = 0;  // set before the operation runs (staging failed)
        void *arg = nullptr;
        void (*done)(void *arg, int err) = nullptr;
    };

    int finish(Running &r);

    fid_ep *owner_;
    std::map<uint64_t, std::unique_ptr<Group>> groups_;  // by handle
    uint64_t next_handle_ = 1;
    std::list<Running> running_;
    std::unordered_map<uint64_t, uint32_t> joins_of_set_;  // joins so far, by set_key
    Group *current_ = nullptr;                             // whose operation is progressing
};

}  // namespace tandem::off::coll

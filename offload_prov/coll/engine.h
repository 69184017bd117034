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
//
// Failure. A member that dies must not leave the others waiting forever:
//  - an operation that waited kProbeAfter without any transfer ending probes the members it
//    waits for (a CollNotice on the group's notice channel); a probe that cannot be delivered
//    (the member's process is gone: its connection reset or refused) fails the operation with
//    FI_ECONNRESET;
//  - an operation that fails, for whatever reason, tells every other member (an Abort notice
//    with its number and error), so members waiting on a survivor that gave up fail too rather
//    than wait for it;
//  - a failed operation cancels its receives and reports once its last transfer has ended.
#pragma once

#include "common/wire.h"
#include "hmem/hmem.h"
#include "offload_prov/coll/operation.h"
#include "offload_prov/coll/shm_group.h"
#include "peer/peer_coll.h"

#include <rdma/fi_endpoint.h>

#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tandem::off::coll {

class Engine final : public Transport {
  public:
    // How long an operation waits on its transfers before it probes the members it waits for.
    static constexpr std::chrono::milliseconds kProbeAfter{500};
    // How often a process asleep while operations run wakes for the checks of the members
    // they wait on (arm: a dead member writes nothing, and the checks run in passes).
    static constexpr int64_t kAsleepCheckMs = 100;
    using Clock = std::chrono::steady_clock;

    // reachable: whether a member (an fi_addr of the owner's AV) runs on this node, where the
    // twin's shared memory reaches it.
    Engine(fid_ep *owner, std::function<bool(fi_addr_t)> reachable)
        : owner_(owner), reachable_(std::move(reachable)) {}
    ~Engine() override;

    int join(const peer::CollJoin &j, uint64_t *group);
    int post(uint64_t group, const peer::CollWork &w);
    int leave(uint64_t group);
    // Advances every operation; reports those that finished.
    void progress();
    // Nothing for progress() to do (inline: the owner's every pass asks).
    bool idle() const { return !repost_notices_ && running_.empty(); }
    bool busy() const { return !running_.empty(); }
    // A sleep may come before the next pass: that pass reads the clock for the probes and has
    // the node-local operations look whether their members still run, whatever the count of
    // passes says (which a sleeping process does not advance).
    void checks_due() { checks_due_ = true; }

    // Completions of peer transfers: whether the context is one of ours, and its end.
    static bool owns(const void *context);
    void transfer_done(void *context, int err);

    int send(uint32_t peer, uint64_t tag, const void *buf, size_t len, Operation *op) override;
    int recv(uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *op) override;

  private:
    struct Running;
    struct Group;
    // The context of one peer transfer of ours (the magic tells it from the twin's hellos).
    struct Transfer {
        uint32_t magic;
        enum class Kind : uint8_t { Data, Notice, NoticeReceive } kind;
        bool recv = false;
        uint32_t peer = 0;
        Running *run = nullptr;  // Data, and the probes of an operation
        Group *group = nullptr;  // NoticeReceive
        wire::CollNotice notice{};
    };
    struct Group {
        std::vector<fi_addr_t> members;
        uint32_t rank = 0;
        uint32_t id = 0;  // tag bits (wire::coll_tag)
        uint16_t next_seq = 0;
        size_t running = 0;  // operations (the join among them) not yet reported
        bool left = false;   // the owner let it go; freed once nothing of it is in flight
        Transfer *notice_rx = nullptr;  // posted on the notice channel, or null
        std::set<uint16_t> aborted;     // operations others failed before ours started
        // How its collectives run, decided by the join's exchange: Messages (peer transfers
        // between all members), Shm (every member on this node: all in shm), or Hier (members
        // on several nodes, some sharing one: allreduce and barrier run node-local, then
        // among the nodes' leaders, then node-local again; the rest by messages).
        enum class Mode : uint8_t { Messages, Shm, Hier } mode = Mode::Messages;
        // The segment of this member's node (Shm: the whole group; Hier: the members that
        // share this node, when more than this one). Its leader, the node's lowest rank,
        // creates it at the join; the others open it once the exchange agreed on it.
        std::unique_ptr<ShmGroup> shm;
        std::string shm_name;
        uint32_t node_size = 1, node_rank = 0;  // in the segment
        std::vector<uint32_t> leaders;          // Hier: every node's leader, by rank
        int leader_index = -1;                  // ours among them, or -1
    };
    struct Running {
        Group *group = nullptr;
        uint16_t seq = 0;
        std::optional<Operation> op;
        std::optional<ShmOp> shm_op;  // instead of op, on a node-local group
        // Hierarchical (Mode::Hier): shm_op into the leader's partial result, op among the
        // leaders (rank_map: their ranks), node_out from the leader to its node.
        bool hier = false;
        int stage = 0;
        std::optional<ShmOp> node_out;
        std::vector<uint8_t> partial;
        const std::vector<uint32_t> *rank_map = nullptr;
        // Staged device buffers: the host copies the schedule works on.
        std::vector<uint8_t> send_stage, recv_stage;
        void *recv_user = nullptr;
        hmem::MemRef recv_mem{};
        size_t recv_bytes = 0;
        bool recv_staged = false;
        // A join: each member's key and whether it can use shared memory with all the others,
        // checked when the exchange is over; then, for a node-local group, the segment.
        bool join = false;
        uint64_t mine[3] = {};       // key, members on this node, this node's leader
        std::vector<uint64_t> keys;  // 3 per member, in set_order
        std::vector<uint32_t> set_order;
        enum class JoinPhase : uint8_t { Exchange, Attach, WaitAttached } join_phase{};
        int status = 0;  // set before the operation runs (staging failed)
        // Failure handling: receives in flight (cancelled on failure), transfers ended (and
        // as many as the last timed pass saw, since when none ended), probes in flight,
        // whether the failure was handled.
        std::unordered_set<Transfer *> recvs;
        uint64_t transfers_ended = 0, transfers_seen = 0;
        std::chrono::steady_clock::time_point quiet_since{};
        size_t probes = 0;
        bool aborted = false;
        bool abort_from_peer = false;
        void *arg = nullptr;
        void (*done)(void *arg, int err) = nullptr;
    };

    int finish(Running &r);
    // post's parts: device buffers staged through host copies, and a hierarchical start.
    void stage_buffers(Running &r, const Group &g, const peer::CollWork &w, const peer::CollIo &io,
                       const void **send, void **recv);
    void start_hier(Running &r, Group &g, const peer::CollWork &w, const Args &a,
                    const Thresholds &t, const void *send, void *recv);
    // The join's steps after the exchange; true once it can be reported.
    bool join_after_exchange(Running &r);
    void choose_mode(Running &r);
    // The message part of an operation: progress, abort on failure, probes when silent.
    bool progress_messages(Running &r, bool timed, Clock::time_point now);
    bool progress_hier(Running &r, bool timed, Clock::time_point now);
    void post_notice_receive(Group &g);
    void notice_arrived(Group &g, const wire::CollNotice &n);
    void send_notice(Group &g, uint32_t peer, const wire::CollNotice &n, Running *run);
    void abort(Running &r);
    void probe(Running &r);
    void drop_group(Group *g);
    uint32_t member_of(uint32_t peer) const;
    int issue(Transfer *t, fi_addr_t addr, uint64_t tag, void *buf, size_t len);
    Transfer *new_transfer(const Transfer &t);
    void free_transfer(Transfer *t);
    std::unordered_set<Transfer *> live_;  // transfers started and not ended

    fid_ep *owner_;
    std::function<bool(fi_addr_t)> reachable_;
    std::map<uint64_t, std::unique_ptr<Group>> groups_;  // by handle
    std::vector<std::unique_ptr<Group>> leaving_;        // left, notice receive still posted
    uint64_t next_handle_ = 1;
    std::list<Running> running_;
    std::list<Running> spare_;  // finished entries, reused
    std::vector<std::pair<std::list<Running>::iterator, int>> over_;
    Running &new_running();
    std::unordered_map<uint64_t, uint32_t> joins_of_set_;  // joins so far, by set_key
    Running *current_ = nullptr;                           // whose operation is progressing
    uint64_t passes_ = 0;
    bool checks_due_ = false;
    bool repost_notices_ = false;  // a group's notice receive ended (or could not be posted)
};

}  // namespace tandem::off::coll

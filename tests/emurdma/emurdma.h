// Internals of the emulated RDMA device (see emurdma_verbs.cpp for what is emulated). Three parts
// share this header: the verbs calls (emurdma_verbs.cpp), the connection manager
// (emurdma_cm.cpp) and the NIC, the thread of each context that moves the data
// (emurdma_nic.cpp).
//
// Locking: one mutex, State::mu, guards every object of the library. The app's calls and the NIC
// threads take it for each step; nobody blocks while holding it (socket I/O is non-blocking, and
// the waits of the blocking calls are condition-variable waits on it). That makes every destroy
// path safe against a running NIC: a NIC thread drops the lock only around poll() and finds its
// connections again by serial number afterwards. It also makes the NIC's work one pass at a time
// whoever does it: the NIC thread, or the app's own data-path calls (ibv_poll_cq reads and
// executes what is pending on the context's connections, ibv_post_send transmits at once; see
// emurdma_nic.cpp), which drive the device while the app polls so that the data path does not
// wait for a scheduler slice of the NIC thread.
#pragma once

#include "tests/emurdma/emurdma_control.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

// The functions the library exports, with the system headers' prototypes.
#define EMURDMA_API extern "C" __attribute__((visibility("default")))

namespace emurdma {

using Clock = std::chrono::steady_clock;

// The device as ibv_query_device / ibv_query_port describe it.
constexpr char kDeviceName[] = "emu_rdma0";
constexpr std::uint64_t kNodeGuid = 0xe3d4'5a00'0000'0001ULL;
constexpr std::uint32_t kVendorId = 0xe3d4;  // made up: no real vendor's quirks apply
constexpr std::uint32_t kMaxQpWr = 4096;
constexpr std::uint32_t kMaxSrqWr = 4096;
constexpr int kMaxCqe = 65536;
constexpr int kMaxQp = 4096;
constexpr std::uint64_t kMaxMrSize = 1ULL << 40;
constexpr std::uint32_t kMaxMsgSize = 1U << 30;
constexpr int kMaxRdAtom = 16;
constexpr int kDefaultMaxInline = 128;
constexpr int kDefaultMaxSge = 16;

// rdma_cm over IB/RoCE: the CM messages' private data, less rdma_cm's own header in the REQ.
// The receiver always sees the full size, zero-padded, as IB CM delivers it.
constexpr std::size_t kReqPrivMax = 56;
constexpr std::size_t kRepPrivMax = 196;
constexpr std::size_t kRejPrivMax = 148;
// IB CM reject reasons (the status of RDMA_CM_EVENT_REJECTED).
constexpr int kRejInvalidServiceId = 8;  // nobody listens on that port
constexpr int kRejConsumer = 28;         // rdma_reject

struct Context;
struct Pd;
struct Mr;
struct Cq;
struct CompChannel;
struct Srq;
struct Qp;
struct CmId;
struct Channel;

// The wire between two QPs (one Unix stream socket): a header, then `len` payload bytes.
enum FrameType : std::uint8_t {
    // Connection management, in IB CM's terms.
    kCmReq = 1,
    kCmRep,
    kCmRtu,
    kCmRej,
    kCmDreq,
    kCmDrep,
    kQpErr,  // the sender's QP went to the error state: it will answer nothing any more
    // Requests (executed by the responder, strictly in order).
    kSend = 16,
    kWrite,
    kRead,
    // Responses, one per request, in request order.
    kAck = 32,
    kReadResp,
    kNak,
};
enum NakCode : std::uint8_t { kNakAccess = 1, kNakRnr, kNakInvReq, kNakRemOp };
constexpr std::uint8_t kHasImm = 1;

struct Hdr {
    std::uint8_t type;
    std::uint8_t code;  // NAK code, REJ reason, kHasImm on requests
    std::uint16_t pad;
    std::uint32_t imm;  // network byte order, as posted
    std::uint64_t raddr;
    std::uint32_t rkey;
    std::uint32_t rlen;  // READ: bytes asked for
    std::uint64_t len;   // payload bytes that follow
};
static_assert(sizeof(Hdr) == 32);

// CM payloads.
struct CmReqMsg {
    sockaddr_storage src, dst;
    std::uint32_t qpn;
    std::uint8_t rnr_retry, retry_count, responder_resources, initiator_depth;
    std::uint8_t pdlen;
    std::uint8_t pdata[kReqPrivMax];
};
struct CmRepMsg {
    std::uint32_t qpn;
    std::uint8_t rnr_retry, responder_resources, initiator_depth;
    std::uint8_t pdlen;
    std::uint8_t pdata[kRepPrivMax];
};
struct CmRejMsg {
    std::uint8_t pdlen;
    std::uint8_t pdata[kRejPrivMax];
};

struct Frame {
    Hdr h;
    std::vector<std::uint8_t> data;
};

// A growable byte buffer whose room is not zero-filled (what a socket read lands in).
struct ByteBuf {
    std::unique_ptr<std::uint8_t[]> p;
    std::size_t len = 0, cap = 0;

    ByteBuf() = default;
    ByteBuf(ByteBuf &&o) noexcept : p(std::move(o.p)), len(o.len), cap(o.cap) { o.len = o.cap = 0; }
    ByteBuf &operator=(ByteBuf &&o) noexcept {
        p = std::move(o.p);
        len = o.len;
        cap = o.cap;
        o.len = o.cap = 0;
        return *this;
    }
    void clear() { len = 0; }
    // Room for n more bytes after len.
    std::uint8_t *room(std::size_t n) {
        if (cap - len < n) {
            std::size_t nc = std::max(len + n, cap * 2);
            std::unique_ptr<std::uint8_t[]> q(new std::uint8_t[nc]);
            if (len) memcpy(q.get(), p.get(), len);
            p = std::move(q);
            cap = nc;
        }
        return p.get() + len;
    }
    void drop_front(std::size_t n) {
        if (n == 0) return;  // (a partial frame stays where it is, not moved onto itself)
        if (n < len) memmove(p.get(), p.get() + n, len - n);
        len = n < len ? len - n : 0;
    }
};

struct Pd {
    ibv_pd pub;
    Context *ctx;
    int users = 0;  // MRs, SRQs, QPs
};

struct Mr {
    ibv_mr pub;
    Pd *pd;
    std::uint64_t base;    // the MR's first address as keys see it (addr, or the iova)
    std::uint64_t length;  // bytes from base
    std::uint8_t *host;    // where base lives in this process (the app's memory, or our mapping)
    void *map_addr = nullptr;  // dma-buf: our mapping of the fd, unmapped at dereg
    std::size_t map_len = 0;
    int access;
};

struct CompChannel {
    ibv_comp_channel pub;
    Context *ctx;
    std::deque<Cq *> q;  // CQs with an event not yet read
    std::condition_variable cv;
    int users = 0;  // CQs
};

struct Cq {
    ibv_cq pub;
    Context *ctx;
    CompChannel *ch;
    std::deque<ibv_wc> q;
    int cap;
    bool armed = false;
    bool overrun = false;  // more CQEs came than it holds: in error from then on
    int users = 0;         // QPs
};

struct RecvWqe {
    std::uint64_t wr_id;
    std::vector<ibv_sge> sge;
};

struct Srq {
    ibv_srq pub;
    Pd *pd;
    std::deque<RecvWqe> q;
    std::uint32_t max_wr, max_sge;
    int users = 0;  // QPs
};

struct SendWqe {
    enum St : std::uint8_t { kPending, kSent, kDone };
    std::uint64_t wr_id;
    ibv_wr_opcode op;
    bool signaled;
    bool inl;
    bool fault = false;  // EMURDMA_FAULT: the QP fails once this one completes
    St st = kPending;
    ibv_wc_status status = IBV_WC_SUCCESS;
    std::uint32_t imm;
    std::uint32_t rkey;
    std::uint64_t raddr;
    std::uint64_t len;
    std::vector<ibv_sge> sge;
    std::vector<std::uint8_t> data;  // inline payload, copied at post time
};

struct Qp {
    ibv_qp pub;
    Pd *pd;
    Cq *scq, *rcq;
    Srq *srq;
    CmId *id = nullptr;  // the connection (its socket)
    ibv_qp_cap cap;
    bool sig_all;
    std::deque<SendWqe> sq;
    std::size_t next_tx = 0;  // sq[0, next_tx) are transmitted or done
    std::deque<RecvWqe> rq;
    std::uint8_t rnr_retry = 7, retry_cnt = 7;
    std::uint8_t min_rnr_timer = 14;  // IB encoding: 1.28 ms
    std::uint32_t peer_qpn = 0;
    std::uint8_t peer_rnr_retry =
        7;                   // the requester's retry count, for its sends that find no receive
    bool peer_gone = false;  // the peer's QP failed: our next request cannot be answered
    std::uint64_t posted_sends = 0;
};

// An event channel, a completion channel and a context's async events share a pattern: a queue
// and an eventfd (EFD_SEMAPHORE) whose count equals the queue's length (changed under the lock
// only), so the fd the app polls is readable exactly while something is queued.
void sig_raise(int fd);
void sig_lower(int fd);
bool fd_nonblocking(int fd);

// The wait of the blocking get calls (rdma_get_cm_event, ibv_get_cq_event, ibv_get_async_event):
// blocks unless the app made the fd non-blocking, then fails with EAGAIN.
// The app is about to sleep in the library: the NICs stop leaving its connections to its calls.
void app_blocks();

template <class Pred>
bool wait_queue(std::unique_lock<std::mutex> &lk, std::condition_variable &cv, int fd, Pred ready) {
    bool told = false;
    while (!ready()) {
        if (fd_nonblocking(fd)) {
            errno = EAGAIN;
            return false;
        }
        if (!told) {
            app_blocks();
            told = true;
        }
        cv.wait(lk);
    }
    return true;
}

struct Context {
    ibv_context pub;
    bool cm_owned = false;  // rdma_cm's context (rdma_get_devices), never closed by the app
    bool dead = false;      // removed (emurdma_remove_device)
    bool stop = false;
    int wake_fd = -1;
    bool wake_pending = false;
    int ep = -1;  // epoll set of the connections' sockets (not listeners): what is readable
    // The app drives this NIC (ibv_poll_cq) until then; meanwhile the NIC thread leaves the
    // connections' sockets to it and sleeps (nic_backoff) rather than compete for the CPU.
    Clock::time_point app_until{};
    bool nic_backoff = false;
    std::thread nic;
    std::deque<ibv_async_event> async_q;
    std::condition_variable async_cv;
    std::map<std::uint64_t, CmId *> ids;  // ids whose sockets this NIC serves, by serial
    int users = 0;                        // PDs, CQs, completion channels
};

struct Event {
    rdma_cm_event pub;
    CmId *owner;
    std::uint8_t pdata[256];
};

struct Channel {
    rdma_event_channel pub;
    std::deque<Event *> q;
    std::condition_variable cv;
};

enum class CmState {
    kIdle,
    kBound,
    kAddrResolved,
    kRouteResolved,
    kListen,
    kEmbryo,      // accepted socket of a listener, REQ not read yet
    kReqRcvd,     // CONNECT_REQUEST delivered
    kConnecting,  // REQ sent
    kAccepted,    // REP sent, RTU not yet read
    kEstablished,
    kDisconnecting,  // DREQ sent
    kDisconnected,
    kRejected,
};

struct CmId {
    rdma_cm_id pub;
    std::uint64_t serial;
    CmState state = CmState::kIdle;
    Channel *ch;
    Context *ctx = nullptr;  // the NIC that serves its sockets
    int port_fd = -1;        // its port in the emulator's port space
    int listen_fd = -1;
    int sock = -1;
    bool wildcard = false;
    std::uint16_t port = 0;
    // What goes out: tx from tx_off, and the payloads of large READ responses, which are sent
    // straight from the responder's MR as the socket takes them (a NIC reads the memory while it
    // transmits; a copy of tens of MiB first made a READ take seconds under a sanitizer). Each
    // goes out when tx_off reaches its `at`, before the rest of tx.
    std::vector<std::uint8_t> tx;
    std::size_t tx_off = 0;
    struct TxFromMr {
        std::size_t at;
        Mr *mr;
        const std::uint8_t *p;
        std::size_t len;
    };
    std::deque<TxFromMr> tx_from_mr;
    ByteBuf rx;  // bytes read, not yet a whole frame
    // A READ response whose payload is still coming: placed in the READ's memory as it arrives,
    // as a NIC places it, never gathered whole in rx first.
    Hdr rx_resp{};
    std::uint64_t rx_resp_at = 0, rx_resp_left = 0;
    bool in_ep = false;         // sock is in ctx->ep
    bool reads_held = false;    // emurdma_hold_reads: sock is kept out of ctx->ep
    std::deque<Frame> rx_reqs;  // requests from the peer, executed in order
    bool rnr_armed = false;     // the head request waits for a receive
    Clock::time_point rnr_deadline;
    bool rx_drop = false;  // the peer gave up on an RNR: discard what it sent after it
    Qp *qp = nullptr;
    CmId *listener = nullptr;  // embryo: the listener that owns it
    std::set<CmId *> embryos;  // listener: accepted sockets without a REQ yet
    std::uint32_t peer_qpn = 0;
    std::uint8_t peer_rnr_retry = 7;
    bool disc_reported = false;
    bool close_after_flush = false;
    bool peer_closed = false;
};

struct State {
    std::mutex mu;
    int max_inline = kDefaultMaxInline;
    int max_sge = kDefaultMaxSge;
    std::uint64_t fault_after = 0;
    std::vector<std::string> netdevs{"lo"};  // the interfaces whose addresses it serves
    bool port_up = true;
    Context *cm_ctx = nullptr;
    std::vector<Context *> contexts;  // open, including removed ones
    std::unordered_map<std::uint32_t, Mr *> lkeys, rkeys;
    std::unordered_map<std::uint32_t, Qp *> qps;
    std::set<CmId *> ids;  // visible to the app (not embryos)
    std::set<Channel *> channels;
    std::vector<CmId *> graveyard;  // embryos the NIC dropped, freed at the end of its pass
    std::uint64_t next_serial = 1;
    emurdma_stats stats{};
};

// A new object whose public struct starts zeroed, as libibverbs and librdmacm hand out theirs:
// the fields the emulator does not set read as 0 (its own members have their initializers).
template <class T>
T *new_object() {
    auto *o = new T;
    memset(&o->pub, 0, sizeof(o->pub));
    return o;
}

// The process's state (replaced in a child after fork: see emurdma_verbs.cpp).
State &S();

// Device and contexts (verbs).
extern ibv_device g_device;
Context *open_context();  // starts its NIC
Context *cm_context();    // rdma_cm's context, opened on first use
std::uint32_t random_key(bool (*taken)(std::uint32_t));
Mr *find_mr(Pd *pd, std::uint32_t lkey);
std::uint8_t *mr_span(Mr *mr, std::uint64_t addr, std::uint64_t len);
void push_cqe(Cq *cq, const ibv_wc &wc);
void flush_cqe(Qp *qp, Cq *cq, std::uint64_t wr_id, ibv_wc_opcode op);
ibv_wc_opcode wc_opcode(ibv_wr_opcode op);
void queue_async(Context *ctx, ibv_async_event ev);
Qp *create_qp_locked(Pd *pd, ibv_qp_init_attr *attr, int *err);
void destroy_qp_locked(Qp *qp);

// NIC.
void nic_main(Context *ctx);
void wake(Context *ctx);
// The app's calls driving the NIC (under the lock): a pass over the context's connections
// (ibv_poll_cq), transmission of a QP's new work requests (ibv_post_send), the requests that
// waited for a receive (ibv_post_recv, ibv_post_srq_recv).
void app_pass(Context *ctx, bool armed);
void app_sent(Qp *qp);
void app_recv_posted(Qp *qp);
void app_srq_posted(Srq *srq);
void send_frame(CmId *id, const Hdr &h, const void *payload, std::size_t len);
// Whether an id has bytes to send (tx or tx_from_mr), and dropping them all.
bool tx_pending(const CmId *id);
void tx_clear(CmId *id);
// ibv_dereg_mr: READ responses still sending from mr take a copy of what they have left.
void tx_copy_from_mr(Mr *mr);
void qp_to_error(Qp *qp, bool notify_peer);
void inject_error(Qp *qp);
void close_sock(CmId *id);
void cm_serve(CmId *id);  // registers an id's sockets with its NIC
void hold_reads(CmId *id, bool hold);

// Connection manager, called by the NIC.
void queue_cm_event(CmId *id, rdma_cm_event_type type, int status, const void *pdata,
                    std::size_t len, std::size_t padded, CmId *listen_id = nullptr);
void cm_on_accept(CmId *listener);
void cm_on_frame(CmId *id, const Hdr &h, const std::uint8_t *payload);
void cm_on_eof(CmId *id);
void cm_device_removed();
// The address this host would use to reach dst (null: any) of that family, if the device serves
// one.
bool served_source(int family, const sockaddr *dst, sockaddr_storage *out);

}  // namespace emurdma

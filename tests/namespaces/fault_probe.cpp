// fault_probe: one side of a two-process workload over tandem's RDM endpoint, for the network
// fault matrix (fault_matrix.sh runs a server and a client in two network namespaces and
// injects loss, delay, reordering, duplication and outages between them). Public libfabric
// API only: it is what an application sees.
//
//   fault_probe server ADDR PORT [options]   an endpoint bound to ADDR:PORT serves sessions
//   fault_probe client ADDR PORT [options]   connects to the server at ADDR:PORT
//
// Options:
//   --rounds N        rounds of the first session (client; default 4)
//   --min-seconds S   and keep running rounds until S seconds have passed (client; default 0),
//                     so that traffic is in flight whenever the test cuts the link
//   --bound-ms B      every operation must end (completion or error completion) within B ms of
//                     being posted (default 20000)
//   --max-seconds S   limit of the whole run, waiting for the peer included (default 120)
//   --expect ok       every operation completes with the right data, in one session (default)
//   --expect reconnect
//                     the first session fails (its pending operations end in errors within
//                     the bound), then a fresh endpoint (client) reaches the same server
//                     endpoint and a new session completes without error
//   --after-rounds N  rounds of the session after a reconnect (default 2)
//   --gate PATH       client: reconnect only once PATH exists (the test makes it when the link
//                     is back up, so the new connection does not race the outage)
//
// A session: the client sends HELLO (its address and memory window) with a tagged send, the
// server answers WELCOME. Then rounds, the same on both sides:
//   1. post this round's receives, then send READY(r): the peer sends no data before it, so
//      every data message lands in a posted receive (a send that completed was delivered);
//   2. on the peer's READY(r): untagged and tagged sends, eager (1 KiB) and rendezvous (1 MiB);
//      an RMA write into the peer's window and a read of it (256 KiB); fetching FI_SUM atomics
//      and a chain of FI_CSWAP on the peer's window;
//   3. when all of that has ended, send DONE(r); on the peer's DONE(r), check what the peer
//      did to our window (its write, its atomics) and start the next round.
// Sends ask for FI_TRANSMIT_COMPLETE (the endpoint's default transmit flags): a send completes
// once the peer has the message. RMA reads and fetching atomics complete with their data.
// Every data message carries its session, round, sequence number, length and checksum; the
// receiver checks them all, the payload's pattern, and that no sequence number comes twice.
// Atomics: add i adds 1 << 8i, so each byte of the slot counts the executions of one add (a
// duplicate shows as a 2); every fetched value must show only other adds, at most once.
//
// After a failure the client's HELLO (and the server's WELCOME) carry a report of what
// completed in the failed round, and the other side checks that every send that completed was
// received and every write and atomic that completed is in its memory ("no loss of a
// completed operation").
//
// Nothing may hang: operations are polled with fi_cq_read against their deadlines. If one
// has not ended by its deadline the probe names it and exits 3. Receives are the exception:
// a receive is not tied to a peer, so the provider cannot fail it when the peer vanishes. The
// receives of a session that failed are cancelled; with --expect reconnect, so is a receive
// still waiting at its deadline (its peer is gone). A cancelled receive must then end
// (FI_ECANCELED) within a second.
//
// Output: one line per round, then one summary line:
//   fault_probe[ROLE]: result=PASS|FAIL|STUCK sessions=N rounds=N ok{kind=n ...}
//   err{kind=n ...} canceled=N rx_timeouts=N max_ms=X dup=N corrupt=N lost=N stale=N
// Exit status: 0 PASS, 1 FAIL, 2 usage or set-up error, 3 STUCK.
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

constexpr size_t kEagerSize = 1024;     // well below tandem's eager limit (64 KiB)
constexpr size_t kRndvSize = 1 << 20;   // well above it: rendezvous
constexpr size_t kRmaSize = 256 << 10;  // each RMA write and read
constexpr int kEagerPerRound = 8;       // eager sends per round of each kind (untagged, tagged)
constexpr int kSendsPerRound = 2 * (kEagerPerRound + 1);  // plus one rendezvous of each kind
constexpr int kSumsPerRound = 8;  // add i adds 1 << 8i: one byte of the slot per add
constexpr int kCswapSteps = 3;    // 0 -> A, A -> B, a compare that fails (B stays)
constexpr uint32_t kMaxRounds = 4096;

// A side's memory window, registered for remote read and write.
constexpr size_t kTargetOff = 0;             // the peer writes here
constexpr size_t kSourceOff = kRmaSize;      // the peer reads from here
constexpr size_t kAtomicOff = 2 * kRmaSize;  // per round: the sum slot, then the cswap slot
constexpr size_t kWindowSize = kAtomicOff + kMaxRounds * 16;

constexpr uint32_t kMagic = 0x7a6e6466;  // "fdnz"

enum Role : uint8_t { kServer = 1, kClient = 2 };

enum Kind : int {
    kMsgEagerTx,
    kMsgEagerRx,
    kMsgRndvTx,
    kMsgRndvRx,
    kTagEagerTx,
    kTagEagerRx,
    kTagRndvTx,
    kTagRndvRx,
    kWrite,
    kRead,
    kSum,
    kCswap,
    kCtrlTx,  // HELLO, WELCOME, READY, DONE
    kCtrlRx,
    kKinds
};
const char *const kKindName[kKinds] = {"msg_eager_tx", "msg_eager_rx", "msg_rndv_tx", "msg_rndv_rx",
                                       "tag_eager_tx", "tag_eager_rx", "tag_rndv_tx", "tag_rndv_rx",
                                       "write",        "read",         "sum",         "cswap",
                                       "ctrl_tx",      "ctrl_rx"};

// Tags: 4 bits of kind, 16 of session, 36 of round or sequence number (56 bits in all).
enum TagKind : uint64_t { kTagHello = 1, kTagWelcome, kTagReady, kTagDone, kTagData };
constexpr uint64_t kTagValueMask = (1ull << 36) - 1;
uint64_t make_tag(uint64_t kind, uint16_t session, uint64_t value) {
    return kind << 52 | uint64_t(session) << 36 | (value & kTagValueMask);
}

// Index of a send within its round: untagged eager, untagged rendezvous, tagged eager, tagged
// rendezvous. Sequence number = round * kSendsPerRound + index, per sender and session.
constexpr int kUntaggedRndv = kEagerPerRound;
constexpr int kTaggedFirst = kEagerPerRound + 1;
constexpr int kTaggedRndv = kSendsPerRound - 1;
bool is_rndv(int index) {
    return index == kUntaggedRndv || index == kTaggedRndv;
}
bool is_tagged(int index) {
    return index >= kTaggedFirst;
}
size_t size_of(int index) {
    return is_rndv(index) ? kRndvSize : kEagerSize;
}
Kind tx_kind(int index) {
    return is_tagged(index) ? (is_rndv(index) ? kTagRndvTx : kTagEagerTx)
                            : (is_rndv(index) ? kMsgRndvTx : kMsgEagerTx);
}
Kind rx_kind(int index) {
    return Kind(tx_kind(index) + 1);
}

// Data patterns: 64-bit words of a mixing function of a seed that names the stream (message
// payload, written region, read source), the session, the writer and its index.
enum Stream : uint64_t { kStreamMsg = 1, kStreamWrite, kStreamSource };
uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
uint64_t seed_of(uint16_t session, uint8_t role, Stream stream, uint64_t index) {
    return mix(uint64_t(session) << 48 ^ uint64_t(role) << 40 ^ uint64_t(stream) << 32 ^ index);
}
void fill(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = mix(seed + i);
        memcpy(p + i, &w, std::min<size_t>(8, n - i));
    }
}
// Offset of the first byte that differs from the pattern, or n.
size_t mismatch(const uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = mix(seed + i);
        size_t k = std::min<size_t>(8, n - i);
        if (memcmp(p + i, &w, k) != 0) return i;
    }
    return n;
}
uint64_t checksum(const uint8_t *p, size_t n) {  // FNV-1a
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
uint64_t cswap_value(int step, uint16_t session, uint32_t round) {
    // The values the chain installs: A (step 0), B (step 1), C (offered by step 2, refused).
    return (0xA0ull + uint64_t(step)) << 56 | uint64_t(session) << 32 | round;
}
uint64_t sum_add(int i) {
    return 1ull << (8 * i);
}
struct MsgHeader {  // at the start of every data and control message
    uint32_t magic;
    uint16_t session;
    uint8_t role;  // sender
    uint8_t last;  // DONE: the client ends the session with this round
    uint32_t round;
    uint32_t index;  // data: index within the round
    uint64_t seq;
    uint64_t length;    // whole message, header included
    uint64_t checksum;  // of the bytes after the header
};

// What completed in a session's last round, as its sender saw it: the other side checks that
// all of it reached it.
struct Report {
    uint16_t session;  // 0: no report
    uint8_t started;   // round `current` was started (its READY sent)
    uint8_t write_ok;
    uint8_t sum_ok_mask;
    uint8_t cswap_ok;  // steps of the chain that completed
    uint16_t pad;
    uint32_t rounds_complete;
    uint32_t current;
    uint64_t tx_ok_mask;  // sends of round `current` that completed, by index
};

struct HelloMsg {  // client -> server (HELLO) and server -> client (WELCOME, name_len 0)
    MsgHeader h;
    uint64_t key;   // the sender's window
    uint64_t base;  // its address (for FI_MR_VIRT_ADDR)
    Report prev;    // of the sender's previous session with this peer
    uint32_t name_len;
    uint8_t name[256];  // HELLO: the client's fabric address
};

struct Options {
    Role role = kClient;
    std::string addr, port;
    uint32_t rounds = 4;
    double min_seconds = 0;
    int bound_ms = 20000;
    double max_seconds = 120;
    bool expect_reconnect = false;
    uint32_t after_rounds = 2;
    std::string gate;
};

struct Session;

struct Op {
    fi_context2 ctx{};  // first member: completions hand back &ctx, which is the Op
    Kind kind = kCtrlTx;
    Session *session = nullptr;
    uint32_t round = 0;
    int index = 0;  // send/receive index, sum index, cswap step
    uint64_t tag_kind = 0;
    bool is_recv = false;
    bool persistent = false;  // the server's HELLO receive: waits for clients, no deadline
    bool ended = false;
    bool cancel_sent = false;
    Clock::time_point posted, deadline;
    std::vector<uint8_t> buf;
    uint64_t operand = 0, compare = 0, result = 0;
    std::string what() const;
};

struct Window {
    uint8_t *mem = nullptr;
    fid_mr *mr = nullptr;
    uint64_t key = 0;
    ~Window() { free(mem); }
    uint64_t &slot(uint32_t round, int which) {
        return *reinterpret_cast<uint64_t *>(mem + kAtomicOff + round * 16 + which * 8);
    }
};

struct Session {
    uint16_t id = 0;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    uint8_t peer_role = 0;
    uint64_t peer_key = 0, peer_base = 0;
    Window win;
    uint32_t round = 0, rounds_complete = 0;
    bool started = false;
    int outstanding = 0;  // operations of the round that must end before DONE
    bool done_sent = false, done_tx_ok = false, done_rx_ok = false;
    bool my_last = false, peer_last = false;
    bool failed = false, finished = false;
    int live = 0;  // operations of this session not ended
    // The current round as this side's sender saw it, and its receiver.
    uint64_t tx_ok_mask = 0, rx_ok_mask = 0;
    bool write_ok = false;
    uint8_t sum_ok_mask = 0;
    int cswap_ok = 0;
    std::set<uint64_t> seen_seqs;
    Clock::time_point begun, round_begun;
    std::string fail_reason;
    Report report() const {
        Report r{};
        r.session = id;
        r.started = started;
        r.write_ok = write_ok;
        r.sum_ok_mask = sum_ok_mask;
        r.cswap_ok = uint8_t(cswap_ok);
        r.rounds_complete = rounds_complete;
        r.current = round;
        r.tx_ok_mask = tx_ok_mask;
        return r;
    }
};

std::string Op::what() const {
    const char *ctrl = tag_kind == kTagHello     ? " (HELLO)"
                       : tag_kind == kTagWelcome ? " (WELCOME)"
                       : tag_kind == kTagReady   ? " (READY)"
                       : tag_kind == kTagDone    ? " (DONE)"
                                                 : "";
    char s[160];
    snprintf(s, sizeof s, "%s%s session %u round %u index %d", kKindName[kind], ctrl,
             session ? session->id : 0u, round, index);
    return s;
}

struct Completion {
    Op *op;
    bool ok;
    size_t len;
    int err;
    std::string errstr;
};

class Probe {
  public:
    explicit Probe(const Options &o) : o_(o) {}
    int run();

  private:
    // Set-up.
    bool open_fabric();
    bool open_endpoint();
    void close_endpoint();
    bool register_window(Session &s);
    void close_window(Session &s);
    // Operations.
    Op *new_op(Kind kind, Session *s);
    bool post(Op *op, const char *what, const std::function<ssize_t()> &call);
    void post_data_recv(Session &s, int index);
    void post_data_send(Session &s, int index);
    void post_ctrl_recv(Session &s, uint64_t tag_kind);
    void post_ctrl_send(Session &s, uint64_t tag_kind);
    void post_sum(Session &s, int i);
    void post_cswap(Session &s, int step);
    uint64_t remote(const Session &s, size_t off) const {
        return (virt_addr_ ? s.peer_base : 0) + off;
    }
    // Progress.
    void progress();
    void read_cq();
    void handle(const Completion &c);
    void handle_session_op(Session &s, Op &op, const Completion &c);
    bool check_data(Session &s, Op &op, size_t len);
    void op_ended(Op &op);
    void fail_session(Session &s, const std::string &why);
    void check_deadlines();
    [[noreturn]] void stuck(const std::vector<Op *> &expired);
    // Rounds.
    void start_round(Session &s);
    void issue_data(Session &s);
    void round_op_ok(Session &s);
    void maybe_send_done(Session &s);
    void maybe_finish_round(Session &s);
    void verify_window(Session &s, uint32_t round, const Report *partial);
    void check_report(Session &mine, const Report &peer);
    // Roles.
    int run_client();
    int run_server();
    std::unique_ptr<Session> client_connect(uint16_t id, const Session *prev);
    bool run_session(Session &s);
    void linger(double ms);
    void fatal(const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    void note(const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    int finish(bool pass, const char *why);
    bool past_max() const { return ms_since(start_) > o_.max_seconds * 1000; }

    Options o_;
    Clock::time_point start_ = Clock::now();
    const char *role_name_ = "?";
    fi_info *info_ = nullptr;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_ep *ep_ = nullptr;
    fid_cq *cq_ = nullptr;
    fid_av *av_ = nullptr;
    bool virt_addr_ = false;
    std::vector<uint8_t> server_name_;  // client: the server's address (fi_getinfo's dest_addr)

    // Ops live until their endpoint closes, so that a second completion for one is seen as
    // such rather than landing in freed memory.
    std::deque<std::unique_ptr<Op>> ops_;
    std::unordered_set<Op *> live_;
    std::deque<Completion> queue_;
    // Server: the HELLO receive and what arrived in it.
    Op *hello_rx_ = nullptr;
    std::deque<HelloMsg> hellos_;
    // Client: the handshake's state.
    bool welcome_ok_ = false, hello_done_ = false, hello_ok_ = false;
    HelloMsg welcome_{};

    // Counts.
    uint64_t ok_[kKinds] = {}, err_[kKinds] = {};
    uint64_t canceled_ = 0, rx_timeouts_ = 0, dup_ = 0, corrupt_ = 0, lost_ = 0, stale_ = 0;
    uint64_t hello_retries_ = 0, sessions_ = 0, rounds_ = 0, failed_sessions_ = 0;
    double max_ms_ = 0;
};

void Probe::note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("fault_probe[%s] %8.1f ms: ", role_name_, ms_since(start_));
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

void Probe::fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fault_probe[%s]: error: ", role_name_);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

bool Probe::open_fabric() {
    fi_info *hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC;
    // What this program can live with: provider keys, registered memory allocated, remote
    // addresses either virtual or offsets (it handles both). No FI_MR_LOCAL: local buffers
    // need no descriptors.
    hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR;
    hints->fabric_attr->prov_name = strdup("tandem");
    // Sends complete once the peer has the message (FI_TRANSMIT_COMPLETE), not when their
    // buffer may be reused (FI_INJECT_COMPLETE, tandem's level for eager sends otherwise):
    // only then may "a send that completed was received" be asserted across a failure.
    hints->tx_attr->op_flags = FI_TRANSMIT_COMPLETE;
    fi_info *all = nullptr;
    // The server's endpoint takes ADDR:PORT as its own address (FI_SOURCE); the client's
    // fi_getinfo resolves the server's address as the destination.
    int ret = fi_getinfo(FI_VERSION(1, 17), o_.addr.c_str(), o_.port.c_str(),
                         o_.role == kServer ? FI_SOURCE : 0, hints, &all);
    fi_freeinfo(hints);
    if (ret) fatal("fi_getinfo(%s, %s): %s", o_.addr.c_str(), o_.port.c_str(), fi_strerror(-ret));
    // The core may list tandem with a utility provider layered over it: take tandem's own.
    for (fi_info *fi = all; fi && !info_; fi = fi->next)
        if (strcmp(fi->fabric_attr->prov_name, "tandem") == 0) info_ = fi_dupinfo(fi);
    fi_freeinfo(all);
    if (!info_) fatal("fi_getinfo listed no plain tandem endpoint");
    if (o_.role == kClient) {
        if (!info_->dest_addr) fatal("fi_getinfo gave no destination address");
        auto *p = static_cast<uint8_t *>(info_->dest_addr);
        server_name_.assign(p, p + info_->dest_addrlen);
        // The endpoint itself takes any address of this host.
        free(info_->dest_addr);
        info_->dest_addr = nullptr;
        info_->dest_addrlen = 0;
    }
    if (!(info_->tx_attr->op_flags & FI_TRANSMIT_COMPLETE))
        fatal("the provider dropped FI_TRANSMIT_COMPLETE from the transmit flags");
    uint64_t mr_mode = info_->domain_attr->mr_mode;
    if (mr_mode & ~uint64_t(FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR))
        fatal("the provider asks for mr_mode 0x%" PRIx64 ", more than offered", mr_mode);
    virt_addr_ = mr_mode & FI_MR_VIRT_ADDR;
    if ((ret = fi_fabric(info_->fabric_attr, &fabric_, nullptr)))
        fatal("fi_fabric: %s", fi_strerror(-ret));
    if ((ret = fi_domain(fabric_, info_, &domain_, nullptr)))
        fatal("fi_domain: %s", fi_strerror(-ret));
    note("domain %s, mr_mode 0x%" PRIx64, info_->domain_attr->name, mr_mode);
    return true;
}

bool Probe::open_endpoint() {
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    int ret;
    if ((ret = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)))
        fatal("fi_cq_open: %s", fi_strerror(-ret));
    if ((ret = fi_av_open(domain_, &av_attr, &av_, nullptr)))
        fatal("fi_av_open: %s", fi_strerror(-ret));
    if ((ret = fi_endpoint(domain_, info_, &ep_, nullptr)))
        fatal("fi_endpoint: %s", fi_strerror(-ret));
    if ((ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)) ||
        (ret = fi_ep_bind(ep_, &av_->fid, 0)) || (ret = fi_enable(ep_)))
        fatal("binding and enabling the endpoint: %s", fi_strerror(-ret));
    char name[256];
    size_t len = sizeof name;
    char str[128] = "?";
    size_t slen = sizeof str;
    if (fi_getname(&ep_->fid, name, &len) == 0) fi_av_straddr(av_, name, str, &slen);
    note("endpoint open at %s", str);
    return true;
}

void Probe::close_endpoint() {
    if (ep_) fi_close(&ep_->fid);
    if (av_) fi_close(&av_->fid);
    if (cq_) fi_close(&cq_->fid);
    ep_ = nullptr;
    av_ = nullptr;
    cq_ = nullptr;
    live_.clear();
    ops_.clear();
    queue_.clear();
}

bool Probe::register_window(Session &s) {
    s.win.mem = static_cast<uint8_t *>(aligned_alloc(4096, kWindowSize));
    memset(s.win.mem, 0, kWindowSize);
    int ret = fi_mr_reg(domain_, s.win.mem, kWindowSize, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0,
                        &s.win.mr, nullptr);
    if (ret) fatal("fi_mr_reg: %s", fi_strerror(-ret));
    s.win.key = fi_mr_key(s.win.mr);
    return true;
}

void Probe::close_window(Session &s) {
    if (s.win.mr) fi_close(&s.win.mr->fid);
    s.win.mr = nullptr;
}

Op *Probe::new_op(Kind kind, Session *s) {
    ops_.push_back(std::make_unique<Op>());
    Op *op = ops_.back().get();
    op->kind = kind;
    op->session = s;
    op->round = s ? s->round : 0;
    op->posted = Clock::now();
    op->deadline = op->posted + std::chrono::milliseconds(o_.bound_ms);
    return op;
}

// Posts with `call`, retrying while the provider's queues are full (-FI_EAGAIN); completions
// read meanwhile wait in queue_ (handled by progress(), never from inside a post).
bool Probe::post(Op *op, const char *what, const std::function<ssize_t()> &call) {
    for (;;) {
        ssize_t ret = call();
        if (ret == 0) break;
        if (ret != -FI_EAGAIN) {
            // Refused outright: the operation never started. That is an error outcome of its
            // own, counted as such (an application would see the same).
            note("%s: %s refused: %s", op->what().c_str(), what, fi_strerror(int(-ret)));
            ++err_[op->kind];
            op->ended = true;
            if (op->session) fail_session(*op->session, std::string(what) + " refused");
            return false;
        }
        read_cq();
        check_deadlines();
    }
    live_.insert(op);
    if (op->session) ++op->session->live;
    return true;
}

void Probe::post_data_recv(Session &s, int index) {
    Op *op = new_op(rx_kind(index), &s);
    op->is_recv = true;
    op->index = index;
    if (is_tagged(index)) {
        op->buf.resize(size_of(index));
        uint64_t tag = make_tag(kTagData, s.id, uint64_t(s.round) * kSendsPerRound + index);
        post(op, "fi_trecv", [&] {
            return fi_trecv(ep_, op->buf.data(), op->buf.size(), nullptr, s.peer, tag, 0, &op->ctx);
        });
    } else {
        // Untagged receives match in posting order; each can take the largest message, so
        // that matching does not depend on the order the peer's sends arrive in.
        op->buf.resize(kRndvSize);
        post(op, "fi_recv", [&] {
            return fi_recv(ep_, op->buf.data(), op->buf.size(), nullptr, s.peer, &op->ctx);
        });
    }
}

void Probe::post_data_send(Session &s, int index) {
    Op *op = new_op(tx_kind(index), &s);
    op->index = index;
    op->buf.resize(size_of(index));
    MsgHeader h{};
    h.magic = kMagic;
    h.session = s.id;
    h.role = uint8_t(o_.role);
    h.round = s.round;
    h.index = uint32_t(index);
    h.seq = uint64_t(s.round) * kSendsPerRound + index;
    h.length = op->buf.size();
    uint8_t *payload = op->buf.data() + sizeof h;
    size_t n = op->buf.size() - sizeof h;
    fill(payload, n, seed_of(s.id, uint8_t(o_.role), kStreamMsg, h.seq));
    h.checksum = checksum(payload, n);
    memcpy(op->buf.data(), &h, sizeof h);
    if (is_tagged(index)) {
        uint64_t tag = make_tag(kTagData, s.id, h.seq);
        post(op, "fi_tsend", [&] {
            return fi_tsend(ep_, op->buf.data(), op->buf.size(), nullptr, s.peer, tag, &op->ctx);
        });
    } else {
        post(op, "fi_send", [&] {
            return fi_send(ep_, op->buf.data(), op->buf.size(), nullptr, s.peer, &op->ctx);
        });
    }
}

void Probe::post_ctrl_recv(Session &s, uint64_t tag_kind) {
    Op *op = new_op(kCtrlRx, &s);
    op->is_recv = true;
    op->tag_kind = tag_kind;
    op->buf.resize(sizeof(HelloMsg));
    uint64_t tag = make_tag(tag_kind, s.id, s.round);
    post(op, "fi_trecv", [&] {
        return fi_trecv(ep_, op->buf.data(), op->buf.size(), nullptr, s.peer, tag, 0, &op->ctx);
    });
}

void Probe::post_ctrl_send(Session &s, uint64_t tag_kind) {
    Op *op = new_op(kCtrlTx, &s);
    op->tag_kind = tag_kind;
    MsgHeader h{};
    h.magic = kMagic;
    h.session = s.id;
    h.role = uint8_t(o_.role);
    h.last = tag_kind == kTagDone && s.my_last;
    h.round = s.round;
    h.length = sizeof h;
    op->buf.resize(sizeof h);
    memcpy(op->buf.data(), &h, sizeof h);
    uint64_t tag = make_tag(tag_kind, s.id, s.round);
    post(op, "fi_tsend", [&] {
        return fi_tsend(ep_, op->buf.data(), op->buf.size(), nullptr, s.peer, tag, &op->ctx);
    });
}

void Probe::post_sum(Session &s, int i) {
    Op *op = new_op(kSum, &s);
    op->index = i;
    op->operand = sum_add(i);
    uint64_t addr = remote(s, kAtomicOff + s.round * 16);
    post(op, "fi_fetch_atomic", [&] {
        return fi_fetch_atomic(ep_, &op->operand, 1, nullptr, &op->result, nullptr, s.peer, addr,
                               s.peer_key, FI_UINT64, FI_SUM, &op->ctx);
    });
}

void Probe::post_cswap(Session &s, int step) {
    Op *op = new_op(kCswap, &s);
    op->index = step;
    // Step 2 compares with 0, which the slot no longer holds: the swap must not happen.
    op->compare = step == 0 ? 0 : step == 1 ? cswap_value(0, s.id, s.round) : 0;
    op->operand = cswap_value(step, s.id, s.round);
    uint64_t addr = remote(s, kAtomicOff + s.round * 16 + 8);
    post(op, "fi_compare_atomic", [&] {
        return fi_compare_atomic(ep_, &op->operand, 1, nullptr, &op->compare, nullptr, &op->result,
                                 nullptr, s.peer, addr, s.peer_key, FI_UINT64, FI_CSWAP, &op->ctx);
    });
}

void Probe::read_cq() {
    if (!cq_) return;
    fi_cq_tagged_entry e[16];
    ssize_t n = fi_cq_read(cq_, e, 16);
    for (ssize_t i = 0; i < n; ++i)
        queue_.push_back({static_cast<Op *>(e[i].op_context), true, e[i].len, 0, {}});
    if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        char err_data[256];
        err.err_data = err_data;
        err.err_data_size = sizeof err_data;
        if (fi_cq_readerr(cq_, &err, 0) == 1) {
            char buf[256] = "";
            fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof buf);
            queue_.push_back({static_cast<Op *>(err.op_context), false, err.len, err.err,
                              std::string(fi_strerror(err.err)) + " (" + buf + ")"});
        }
    } else if (n < 0 && n != -FI_EAGAIN) {
        fatal("fi_cq_read: %s", fi_strerror(int(-n)));
    }
}

void Probe::progress() {
    read_cq();
    while (!queue_.empty()) {
        Completion c = queue_.front();
        queue_.pop_front();
        handle(c);
    }
    check_deadlines();
}

void Probe::op_ended(Op &op) {
    op.ended = true;
    live_.erase(&op);
    if (op.session) --op.session->live;
    if (!op.persistent) max_ms_ = std::max(max_ms_, ms_since(op.posted));
}

void Probe::handle(const Completion &c) {
    Op *op = c.op;
    if (!op || !live_.count(op)) {
        // A completion for an operation that already ended (or never existed): the provider
        // reported something twice.
        bool known = false;
        for (auto &p : ops_) known |= p.get() == op;
        note("DUPLICATE completion: %s for %s", c.ok ? "success" : c.errstr.c_str(),
             known ? op->what().c_str() : "an unknown context");
        ++dup_;
        return;
    }
    op_ended(*op);
    if (!c.ok && !op->session && op->tag_kind == kTagHello) {
        // The client's HELLO before the server listens (or while the route settles): retried,
        // counted apart from the faults' errors.
        note("HELLO not delivered (%s); retrying", c.errstr.c_str());
    } else if (!c.ok) {
        if (c.err == FI_ECANCELED) {
            ++canceled_;
        } else {
            ++err_[op->kind];
            note("error completion: %s after %.1f ms: %s", op->what().c_str(), ms_since(op->posted),
                 c.errstr.c_str());
        }
    } else {
        ++ok_[op->kind];
    }
    if (op == hello_rx_) {
        hello_rx_ = nullptr;
        if (c.ok) {
            HelloMsg m{};
            memcpy(&m, op->buf.data(), std::min(c.len, sizeof m));
            if (c.len < offsetof(HelloMsg, name) || m.h.magic != kMagic ||
                m.name_len > sizeof m.name) {
                note("a malformed HELLO (%zu bytes)", c.len);
                ++corrupt_;
            } else {
                hellos_.push_back(m);
            }
        }
        return;
    }
    if (!op->session) {  // the client's handshake
        if (op->tag_kind == kTagHello) {
            hello_done_ = true;
            hello_ok_ = c.ok;
        } else if (op->tag_kind == kTagWelcome && c.ok) {
            memcpy(&welcome_, op->buf.data(), std::min(c.len, sizeof welcome_));
            welcome_ok_ = welcome_.h.magic == kMagic;
            if (!welcome_ok_) ++corrupt_;
        }
        return;
    }
    handle_session_op(*op->session, *op, c);
    op->buf.clear();
    op->buf.shrink_to_fit();
}

void Probe::fail_session(Session &s, const std::string &why) {
    if (s.failed) return;
    s.failed = true;
    s.fail_reason = why;
    note("session %u failed in round %u: %s; cancelling its receives", s.id, s.round, why.c_str());
    // Receives are not tied to the peer that failed: nothing but the application ends them.
    for (Op *op : live_) {
        if (op->session != &s || !op->is_recv || op->cancel_sent) continue;
        op->cancel_sent = true;
        op->deadline = std::max(op->deadline, Clock::now() + std::chrono::seconds(1));
        fi_cancel(&ep_->fid, &op->ctx);
    }
}

bool Probe::check_data(Session &s, Op &op, size_t len) {
    MsgHeader h{};
    if (len < sizeof h) {
        note("CORRUPT: %s: %zu bytes, shorter than a header", op.what().c_str(), len);
        ++corrupt_;
        return false;
    }
    memcpy(&h, op.buf.data(), sizeof h);
    if (h.magic != kMagic || h.role != s.peer_role) {
        note("CORRUPT: %s: bad magic or sender", op.what().c_str());
        ++corrupt_;
        return false;
    }
    if (h.session != s.id || h.round != s.round) {
        note("STALE: %s: a message of session %u round %u", op.what().c_str(), h.session, h.round);
        ++stale_;
        return false;
    }
    if (h.index >= uint32_t(kSendsPerRound) || is_tagged(int(h.index)) != is_tagged(op.index) ||
        (is_tagged(op.index) && int(h.index) != op.index) ||
        h.seq != uint64_t(h.round) * kSendsPerRound + h.index) {
        note("CORRUPT: %s: index %u seq %" PRIu64 " not expected here", op.what().c_str(), h.index,
             h.seq);
        ++corrupt_;
        return false;
    }
    if (!s.seen_seqs.insert(h.seq).second) {
        note("DUPLICATE: %s: sequence number %" PRIu64 " delivered twice", op.what().c_str(),
             h.seq);
        ++dup_;
        return false;
    }
    op.index = int(h.index);
    op.kind = rx_kind(op.index);
    size_t want = size_of(op.index);
    const uint8_t *payload = op.buf.data() + sizeof h;
    if (len != want || h.length != want) {
        note("CORRUPT: %s: %zu bytes (header says %" PRIu64 "), expected %zu", op.what().c_str(),
             len, h.length, want);
        ++corrupt_;
        return false;
    }
    size_t bad = mismatch(payload, want - sizeof h, seed_of(s.id, s.peer_role, kStreamMsg, h.seq));
    if (checksum(payload, want - sizeof h) != h.checksum || bad != want - sizeof h) {
        note("CORRUPT: %s: seq %" PRIu64 " payload differs at byte %zu", op.what().c_str(), h.seq,
             bad + sizeof h);
        ++corrupt_;
        return false;
    }
    s.rx_ok_mask |= 1ull << op.index;
    return true;
}

void Probe::handle_session_op(Session &s, Op &op, const Completion &c) {
    if (!c.ok) {
        // The receive of a message counts as the kind its index names only once it has one.
        if (c.err != FI_ECANCELED)
            fail_session(s, std::string(kKindName[op.kind]) + ": " + c.errstr);
        return;
    }
    bool current = op.round == s.round;
    switch (op.kind) {
        case kMsgEagerRx:
        case kMsgRndvRx:
        case kTagEagerRx:
        case kTagRndvRx: {
            Kind before = op.kind;
            bool good = check_data(s, op, c.len);
            if (op.kind != before) {  // an untagged receive took the message of another kind
                --ok_[before];
                ++ok_[op.kind];
            }
            if (good && current) round_op_ok(s);
            if (!good) fail_session(s, "bad data received");
            return;
        }
        case kMsgEagerTx:
        case kMsgRndvTx:
        case kTagEagerTx:
        case kTagRndvTx:
            if (current) s.tx_ok_mask |= 1ull << op.index;
            round_op_ok(s);
            return;
        case kWrite:
            s.write_ok = true;
            round_op_ok(s);
            return;
        case kRead: {
            size_t bad = mismatch(op.buf.data(), kRmaSize,
                                  seed_of(s.id, s.peer_role, kStreamSource, op.round));
            if (bad != kRmaSize) {
                note("CORRUPT: RMA read of round %u differs at byte %zu", op.round, bad);
                ++corrupt_;
                fail_session(s, "RMA read returned wrong data");
                return;
            }
            round_op_ok(s);
            return;
        }
        case kSum: {
            // The value before this add: at most one execution of each other add, none of
            // this one.
            bool good = true;
            for (int i = 0; i < 8; ++i) {
                uint64_t b = op.result >> (8 * i) & 0xff;
                if (b > 1 || (i == op.index && b != 0)) good = false;
            }
            if (!good) {
                note("DUPLICATE: FI_SUM %d fetched 0x%016" PRIx64 ": an add ran twice", op.index,
                     op.result);
                ++dup_;
                fail_session(s, "an atomic ran twice");
                return;
            }
            s.sum_ok_mask |= uint8_t(1u << op.index);
            round_op_ok(s);
            return;
        }
        case kCswap: {
            uint64_t want = op.index == 0 ? 0 : cswap_value(op.index - 1, s.id, op.round);
            if (op.result != want) {
                note("CORRUPT: FI_CSWAP step %d fetched 0x%016" PRIx64 ", expected 0x%016" PRIx64,
                     op.index, op.result, want);
                ++corrupt_;
                fail_session(s, "FI_CSWAP fetched a wrong value");
                return;
            }
            s.cswap_ok = op.index + 1;
            if (op.index + 1 < kCswapSteps && !s.failed) post_cswap(s, op.index + 1);
            round_op_ok(s);
            return;
        }
        case kCtrlRx: {
            MsgHeader h{};
            memcpy(&h, op.buf.data(), std::min(c.len, sizeof h));
            if (c.len < sizeof h || h.magic != kMagic || h.session != s.id || h.round != op.round) {
                note("CORRUPT: %s: a bad control message", op.what().c_str());
                ++corrupt_;
                fail_session(s, "bad control message");
                return;
            }
            if (op.tag_kind == kTagReady) {
                round_op_ok(s);
                if (!s.failed) issue_data(s);
            } else if (op.tag_kind == kTagDone) {
                s.peer_last = h.last;
                s.done_rx_ok = true;
                maybe_finish_round(s);
            }
            return;
        }
        case kCtrlTx:
            if (op.tag_kind == kTagReady) round_op_ok(s);
            if (op.tag_kind == kTagDone) {
                s.done_tx_ok = true;
                maybe_finish_round(s);
            }
            return;
        case kKinds:
            return;
    }
}

void Probe::round_op_ok(Session &s) {
    --s.outstanding;
    maybe_send_done(s);
}

void Probe::maybe_send_done(Session &s) {
    if (s.failed || s.done_sent || s.outstanding > 0) return;
    // The client decides when the session ends, and says so in its DONE.
    if (o_.role == kClient) {
        double elapsed = ms_since(s.begun) / 1000;
        uint32_t want = sessions_ > 1 ? o_.after_rounds : o_.rounds;
        if (o_.expect_reconnect && sessions_ == 1)
            s.my_last = elapsed > o_.max_seconds / 2 || s.round + 2 >= kMaxRounds;
        else
            s.my_last = s.round + 1 >= want && elapsed >= o_.min_seconds;
    }
    s.done_sent = true;
    post_ctrl_send(s, kTagDone);
}

void Probe::start_round(Session &s) {
    s.started = true;
    s.round_begun = Clock::now();
    s.tx_ok_mask = s.rx_ok_mask = 0;
    s.write_ok = false;
    s.sum_ok_mask = 0;
    s.cswap_ok = 0;
    s.done_sent = s.done_tx_ok = s.done_rx_ok = false;
    // The peer reads this round's source only after our READY, below.
    fill(s.win.mem + kSourceOff, kRmaSize, seed_of(s.id, uint8_t(o_.role), kStreamSource, s.round));
    s.outstanding = 2 + kSendsPerRound * 2 + 2 + kSumsPerRound + kCswapSteps;
    post_ctrl_recv(s, kTagReady);
    post_ctrl_recv(s, kTagDone);
    for (int i = 0; i < kSendsPerRound; ++i) post_data_recv(s, i);
    post_ctrl_send(s, kTagReady);
}

void Probe::issue_data(Session &s) {
    // Rendezvous first, so that the large transfers overlap the rest.
    post_data_send(s, kUntaggedRndv);
    post_data_send(s, kTaggedRndv);
    for (int i = 0; i < kSendsPerRound; ++i)
        if (!is_rndv(i)) post_data_send(s, i);
    Op *w = new_op(kWrite, &s);
    w->buf.resize(kRmaSize);
    fill(w->buf.data(), kRmaSize, seed_of(s.id, uint8_t(o_.role), kStreamWrite, s.round));
    uint64_t waddr = remote(s, kTargetOff);
    post(w, "fi_write", [&] {
        return fi_write(ep_, w->buf.data(), kRmaSize, nullptr, s.peer, waddr, s.peer_key, &w->ctx);
    });
    Op *r = new_op(kRead, &s);
    r->buf.assign(kRmaSize, 0);
    uint64_t raddr = remote(s, kSourceOff);
    post(r, "fi_read", [&] {
        return fi_read(ep_, r->buf.data(), kRmaSize, nullptr, s.peer, raddr, s.peer_key, &r->ctx);
    });
    for (int i = 0; i < kSumsPerRound; ++i) post_sum(s, i);
    post_cswap(s, 0);
}

// What the peer did to our window in `round`: everything (partial == nullptr), or what its
// report says completed.
void Probe::verify_window(Session &s, uint32_t round, const Report *partial) {
    if (!partial || partial->write_ok) {
        size_t bad = mismatch(s.win.mem + kTargetOff, kRmaSize,
                              seed_of(s.id, s.peer_role, kStreamWrite, round));
        if (bad != kRmaSize) {
            note("%s: the peer's RMA write of round %u is not in our window (byte %zu differs)",
                 partial ? "LOST" : "CORRUPT", round, bad);
            ++(partial ? lost_ : corrupt_);
        }
    }
    uint64_t sum = s.win.slot(round, 0), cs = s.win.slot(round, 1);
    uint8_t sum_ok = partial ? partial->sum_ok_mask : 0xff;
    for (int i = 0; i < kSumsPerRound; ++i) {
        uint64_t b = sum >> (8 * i) & 0xff;
        if (b > 1) {
            note("DUPLICATE: add %d of round %u ran %" PRIu64 " times (slot 0x%016" PRIx64 ")", i,
                 round, b, sum);
            ++dup_;
        } else if ((sum_ok >> i & 1) && b != 1) {
            note("LOST: add %d of round %u completed but is not in the slot 0x%016" PRIx64, i,
                 round, sum);
            ++lost_;
        }
    }
    int cswap_ok = partial ? partial->cswap_ok : kCswapSteps;
    uint64_t a = cswap_value(0, s.id, round), b = cswap_value(1, s.id, round);
    bool cs_good = cswap_ok >= 2   ? cs == b
                   : cswap_ok == 1 ? (cs == a || cs == b)
                                   : (cs == 0 || cs == a || cs == b);
    if (!cs_good) {
        note("%s: the FI_CSWAP slot of round %u holds 0x%016" PRIx64 " after %d steps",
             partial ? "LOST" : "CORRUPT", round, cs, cswap_ok);
        ++(partial ? lost_ : corrupt_);
    }
}

void Probe::maybe_finish_round(Session &s) {
    if (s.failed || !s.done_tx_ok || !s.done_rx_ok) return;
    verify_window(s, s.round, nullptr);
    ++s.rounds_complete;
    ++rounds_;
    note("session %u round %u complete in %.1f ms", s.id, s.round, ms_since(s.round_begun));
    s.started = false;
    if (s.my_last || s.peer_last) {
        s.finished = true;
        return;
    }
    ++s.round;
    if (s.round >= kMaxRounds) {
        fail_session(s, "out of rounds");
        return;
    }
    start_round(s);
}

// The peer's report of a failed session, checked against what reached this side.
void Probe::check_report(Session &mine, const Report &peer) {
    if (peer.session != mine.id) {
        note("the peer reports no operation of session %u", mine.id);
        return;
    }
    note("the peer's report of session %u: %u rounds complete, round %u %s, sends 0x%" PRIx64
         " write %d sums 0x%02x cswap steps %d",
         mine.id, peer.rounds_complete, peer.current, peer.started ? "started" : "not started",
         peer.tx_ok_mask, peer.write_ok, peer.sum_ok_mask, peer.cswap_ok);
    if (!mine.started) return;  // our current round never began: its predecessors were checked
    uint32_t r = mine.round;
    if (peer.rounds_complete > r) {
        // The peer finished our current round: everything of it reached us.
        for (int i = 0; i < kSendsPerRound; ++i)
            if (!(mine.rx_ok_mask >> i & 1)) {
                note("LOST: send %d of round %u completed at the peer, never received", i, r);
                ++lost_;
            }
        verify_window(mine, r, nullptr);
    } else if (peer.rounds_complete == r && peer.started && peer.current == r) {
        for (int i = 0; i < kSendsPerRound; ++i)
            if ((peer.tx_ok_mask >> i & 1) && !(mine.rx_ok_mask >> i & 1)) {
                note("LOST: send %d of round %u completed at the peer, never received", i, r);
                ++lost_;
            }
        verify_window(mine, r, &peer);
    }
}

void Probe::check_deadlines() {
    auto now = Clock::now();
    std::vector<Op *> expired;
    for (Op *op : live_) {
        if (op->persistent || now < op->deadline) continue;
        if (o_.expect_reconnect && op->is_recv && !op->cancel_sent) {
            // A receive outlived the bound: its peer is gone (it cannot fail by itself).
            ++rx_timeouts_;
            note("%s waited %.0f ms: the peer is gone", op->what().c_str(), ms_since(op->posted));
            if (op->session) fail_session(*op->session, "a receive outlived the bound");
            if (!op->cancel_sent) {
                op->cancel_sent = true;
                op->deadline = now + std::chrono::seconds(1);
                fi_cancel(&ep_->fid, &op->ctx);
            }
            continue;
        }
        expired.push_back(op);
    }
    if (!expired.empty()) stuck(expired);
}

void Probe::stuck(const std::vector<Op *> &expired) {
    for (Op *op : expired)
        printf("STUCK: %s posted %.0f ms ago%s, bound %d ms\n", op->what().c_str(),
               ms_since(op->posted), op->cancel_sent ? " (cancelled)" : "", o_.bound_ms);
    for (Op *op : live_)
        if (std::find(expired.begin(), expired.end(), op) == expired.end())
            printf("pending: %s posted %.0f ms ago\n", op->what().c_str(), ms_since(op->posted));
    exit(finish(false, "stuck"));
}

int Probe::finish(bool pass, const char *why) {
    char ok[512] = "", err[512] = "";
    size_t okn = 0, errn = 0;
    for (int k = 0; k < kKinds; ++k) {
        okn += snprintf(ok + okn, sizeof ok - okn, "%s%s=%" PRIu64, k ? " " : "", kKindName[k],
                        ok_[k]);
        errn += snprintf(err + errn, sizeof err - errn, "%s%s=%" PRIu64, k ? " " : "", kKindName[k],
                         err_[k]);
    }
    bool is_stuck = strcmp(why, "stuck") == 0;
    printf("fault_probe[%s]: result=%s sessions=%" PRIu64 " failed_sessions=%" PRIu64
           " rounds=%" PRIu64 " ok{%s} err{%s} canceled=%" PRIu64 " rx_timeouts=%" PRIu64
           " hello_retries=%" PRIu64 " max_ms=%.1f dup=%" PRIu64 " corrupt=%" PRIu64
           " lost=%" PRIu64 " stale=%" PRIu64 "%s%s\n",
           role_name_,
           pass       ? "PASS"
           : is_stuck ? "STUCK"
                      : "FAIL",
           sessions_, failed_sessions_, rounds_, ok, err, canceled_, rx_timeouts_, hello_retries_,
           max_ms_, dup_, corrupt_, lost_, stale_, pass ? "" : " why=", pass ? "" : why);
    fflush(stdout);
    return pass ? 0 : is_stuck ? 3 : 1;
}

// Polls for a while so that our last acknowledgements reach the peer before we close.
void Probe::linger(double ms) {
    auto t = Clock::now();
    while (ms_since(t) < ms) progress();
}

// Runs a session until it finishes or fails and all its operations have ended.
bool Probe::run_session(Session &s) {
    while (!s.finished && !(s.failed && s.live == 0)) {
        progress();
        if (o_.role == kServer && !hellos_.empty() && !s.failed) {
            // A new HELLO while this session runs: its client started over, this one is dead.
            if (hellos_.front().h.session == s.id) {
                note("DUPLICATE: a second HELLO of session %u", s.id);
                ++dup_;
                hellos_.pop_front();
            } else {
                fail_session(s, "its client started a new session");
            }
        }
        if (s.failed && s.live > 0 && past_max()) stuck({});
    }
    if (s.failed) ++failed_sessions_;
    return s.finished && !s.failed;
}

std::unique_ptr<Session> Probe::client_connect(uint16_t id, const Session *prev) {
    auto s = std::make_unique<Session>();
    s->id = id;
    s->peer_role = kServer;
    s->begun = Clock::now();
    register_window(*s);
    if (fi_av_insert(av_, server_name_.data(), 1, &s->peer, 0, nullptr) != 1)
        fatal("fi_av_insert of the server's address failed");
    welcome_ok_ = false;
    Op *wrx = new_op(kCtrlRx, nullptr);
    wrx->is_recv = true;
    wrx->persistent = true;  // until the HELLO is through: then the bound applies
    wrx->tag_kind = kTagWelcome;
    wrx->buf.resize(sizeof(HelloMsg));
    uint64_t wtag = make_tag(kTagWelcome, id, 0);
    post(wrx, "fi_trecv", [&] {
        return fi_trecv(ep_, wrx->buf.data(), wrx->buf.size(), nullptr, s->peer, wtag, 0,
                        &wrx->ctx);
    });
    HelloMsg m{};
    m.h.magic = kMagic;
    m.h.session = id;
    m.h.role = kClient;
    m.key = s->win.key;
    m.base = reinterpret_cast<uintptr_t>(s->win.mem);
    if (prev) m.prev = prev->report();
    size_t len = sizeof m.name;
    if (fi_getname(&ep_->fid, m.name, &len)) fatal("fi_getname failed");
    m.name_len = uint32_t(len);
    // The server may not listen yet (or, after an outage, the route may still be settling):
    // a refused HELLO is retried until the run's limit.
    for (;;) {
        Op *h = new_op(kCtrlTx, nullptr);
        h->tag_kind = kTagHello;
        h->buf.resize(sizeof m);
        memcpy(h->buf.data(), &m, sizeof m);
        uint64_t htag = make_tag(kTagHello, id, 0);
        hello_done_ = false;
        if (post(h, "fi_tsend", [&] {
                return fi_tsend(ep_, h->buf.data(), h->buf.size(), nullptr, s->peer, htag, &h->ctx);
            })) {
            while (!hello_done_) progress();
            if (hello_ok_) break;
        }
        ++hello_retries_;
        if (past_max()) fatal("no HELLO reached the server within %.0f s", o_.max_seconds);
        auto t = Clock::now();
        while (ms_since(t) < 200) progress();
    }
    wrx->persistent = false;
    wrx->posted = Clock::now();
    wrx->deadline = wrx->posted + std::chrono::milliseconds(o_.bound_ms);
    while (!welcome_ok_) {
        progress();
        if (!live_.count(wrx) && !welcome_ok_) fatal("the WELCOME receive failed");
    }
    s->peer_key = welcome_.key;
    s->peer_base = welcome_.base;
    note("session %u established with %s:%s", id, o_.addr.c_str(), o_.port.c_str());
    ++sessions_;
    return s;
}

int Probe::run_client() {
    open_fabric();
    open_endpoint();
    uint16_t id = uint16_t((getpid() * 2654435761u) >> 16) | 1;
    std::unique_ptr<Session> s = client_connect(id, nullptr);
    start_round(*s);
    bool ok = run_session(*s);
    if (!o_.expect_reconnect) {
        if (ok) linger(300);
        return finish(ok && !dup_ && !corrupt_ && !lost_ && !stale_ && !canceled_ && !rx_timeouts_,
                      ok ? "a data check failed" : s->fail_reason.c_str());
    }
    if (ok) return finish(false, "the session did not fail: the outage missed the traffic");
    // Reconnect: the old endpoint closes (all its operations have ended), a fresh one reaches
    // the same server endpoint.
    note("session %u over (%s); reopening the endpoint", s->id, s->fail_reason.c_str());
    close_endpoint();
    close_window(*s);
    if (!o_.gate.empty()) {
        struct stat st;
        while (stat(o_.gate.c_str(), &st) != 0) {
            if (past_max()) fatal("the gate %s never appeared", o_.gate.c_str());
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }
    open_endpoint();
    std::unique_ptr<Session> s2 = client_connect(uint16_t(id + 2), s.get());
    check_report(*s, welcome_.prev);
    start_round(*s2);
    bool ok2 = run_session(*s2);
    if (ok2) linger(300);
    return finish(ok2 && !dup_ && !corrupt_ && !lost_ && !stale_,
                  ok2 ? "a data check failed" : s2->fail_reason.c_str());
}

int Probe::run_server() {
    open_fabric();
    open_endpoint();
    std::unique_ptr<Session> prev;
    for (;;) {
        // The HELLO receive stays posted; it takes a client's first message of any session.
        if (!hello_rx_) {
            Op *op = new_op(kCtrlRx, nullptr);
            op->is_recv = true;
            op->persistent = true;
            op->tag_kind = kTagHello;
            op->buf.resize(sizeof(HelloMsg));
            uint64_t tag = make_tag(kTagHello, 0, 0);
            uint64_t ignore = ~(uint64_t(0xf) << 52);
            hello_rx_ = op;
            if (!post(op, "fi_trecv", [&] {
                    return fi_trecv(ep_, op->buf.data(), op->buf.size(), nullptr, FI_ADDR_UNSPEC,
                                    tag, ignore, &op->ctx);
                }))
                fatal("cannot post the HELLO receive");
        }
        while (hellos_.empty()) {
            progress();
            if (past_max()) return finish(false, "no client came");
            if (!hello_rx_) break;
        }
        if (hellos_.empty()) continue;
        HelloMsg m = hellos_.front();
        hellos_.pop_front();
        if (prev && m.prev.session == prev->id) check_report(*prev, m.prev);
        auto s = std::make_unique<Session>();
        s->id = m.h.session;
        s->peer_role = kClient;
        s->peer_key = m.key;
        s->peer_base = m.base;
        s->begun = Clock::now();
        register_window(*s);
        if (fi_av_insert(av_, m.name, 1, &s->peer, 0, nullptr) != 1) {
            note("fi_av_insert of a client's address failed");
            ++corrupt_;
            continue;
        }
        ++sessions_;
        note("session %u: client accepted", s->id);
        // WELCOME: our window, and our report of the client's previous session.
        Op *w = new_op(kCtrlTx, s.get());
        w->tag_kind = kTagWelcome;
        HelloMsg wm{};
        wm.h.magic = kMagic;
        wm.h.session = s->id;
        wm.h.role = kServer;
        wm.key = s->win.key;
        wm.base = reinterpret_cast<uintptr_t>(s->win.mem);
        if (prev && m.prev.session == prev->id) wm.prev = prev->report();
        w->buf.resize(sizeof wm);
        memcpy(w->buf.data(), &wm, sizeof wm);
        uint64_t wtag = make_tag(kTagWelcome, s->id, 0);
        Session *sp = s.get();
        post(w, "fi_tsend", [&] {
            return fi_tsend(ep_, w->buf.data(), w->buf.size(), nullptr, sp->peer, wtag, &w->ctx);
        });
        start_round(*s);
        bool ok = run_session(*s);
        if (prev) close_window(*prev);
        prev = std::move(s);
        if (ok) {
            linger(300);
            bool clean = !dup_ && !corrupt_ && !lost_ && !stale_;
            if (!o_.expect_reconnect)
                return finish(clean && failed_sessions_ == 0 && !canceled_ && !rx_timeouts_,
                              "a data check failed");
            return finish(clean && failed_sessions_ >= 1,
                          failed_sessions_ ? "a data check failed" : "no session failed");
        }
        if (!o_.expect_reconnect) return finish(false, prev->fail_reason.c_str());
        note("session %u over (%s); waiting for the client to come back", prev->id,
             prev->fail_reason.c_str());
    }
}

int Probe::run() {
    role_name_ = o_.role == kServer ? "server" : "client";
    setvbuf(stdout, nullptr, _IOLBF, 0);
    int rc = o_.role == kServer ? run_server() : run_client();
    if (hello_rx_) fi_cancel(&ep_->fid, &hello_rx_->ctx);
    close_endpoint();
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    fi_freeinfo(info_);
    return rc;
}

[[noreturn]] void usage() {
    fprintf(stderr,
            "usage: fault_probe server|client ADDR PORT [--rounds N] [--min-seconds S]\n"
            "       [--bound-ms B] [--max-seconds S] [--expect ok|reconnect]\n"
            "       [--after-rounds N] [--gate PATH]\n");
    exit(2);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 4) usage();
    Options o;
    if (strcmp(argv[1], "server") == 0)
        o.role = kServer;
    else if (strcmp(argv[1], "client") == 0)
        o.role = kClient;
    else
        usage();
    o.addr = argv[2];
    o.port = argv[3];
    for (int i = 4; i < argc; ++i) {
        std::string a = argv[i];
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (a == "--rounds")
            o.rounds = uint32_t(std::max(1, atoi(v)));
        else if (a == "--min-seconds")
            o.min_seconds = atof(v);
        else if (a == "--bound-ms")
            o.bound_ms = std::max(1, atoi(v));
        else if (a == "--max-seconds")
            o.max_seconds = atof(v);
        else if (a == "--expect" && (strcmp(v, "ok") == 0 || strcmp(v, "reconnect") == 0))
            o.expect_reconnect = strcmp(v, "reconnect") == 0;
        else if (a == "--after-rounds")
            o.after_rounds = uint32_t(std::max(1, atoi(v)));
        else if (a == "--gate")
            o.gate = v;
        else
            usage();
    }
    return Probe(o).run();
}

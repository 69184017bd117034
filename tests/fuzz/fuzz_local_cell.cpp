// Fuzz target: the node-local path's cell parser and the protocol behind it (off_tandem's
// Endpoint::handle_cell and everything a cell reaches: eager and staged messages, rendezvous
// by cross-memory attach, RMA, atomics, device-memory cells), driven the way a hostile local
// process of the same user drives it: cells written straight into the victim endpoint's inbox
// ring in its shared segment. The victim is a tandem RDM endpoint of this process, opened
// through libfabric with the providers of this build; the cells claim to come from a real
// endpoint in another process of the harness (so that answers have somewhere to go and
// single copy has a process to reach). Checks, on top of the sanitizers: the victim keeps
// running, and its receive buffers' guard bytes are never written.
#include "offload_prov/endpoint.h"
#include "main_prov/shm/inbox_segment.h"
#include "common/shm_ring.h"
#include "main_prov/shm/shm_segment.h"
#include "tests/common/rdm_endpoint.h"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <sys/prctl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace tandem;

constexpr uint64_t kKeyMagic = 0x4b4b4b4b4b4b4b4bull;  // replaced by the region's real key
constexpr uint32_t kPidMagic = 0x50494450;             // "PDIP": replaced by the sender's pid
constexpr size_t kRecvSize = 64 * 1024;
constexpr size_t kGuard = 64;
constexpr size_t kReceives = 8;  // of each kind: untagged, tagged

// A tandem RDM endpoint (tests/common/rdm_endpoint.h) and its name.
struct Endpoint : tandem_test::RdmEndpoint {
    std::string name;
    bool open() {
        std::string why;
        if (!try_open(why, FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC)) {
            fprintf(stderr, "fuzz_local_cell: %s\n", why.c_str());
            return false;
        }
        char buf[64];
        size_t len = sizeof buf;
        if (fi_getname(&ep->fid, buf, &len)) return false;
        name.assign(buf, len);
        return true;
    }
};

// The other process: a real endpoint the cells claim to come from. It makes progress now
// and then (so that the victim's answers find room in its inbox) until the harness exits.
[[noreturn]] void sender(int out) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    Endpoint s;
    if (!s.open()) _exit(1);
    uint32_t len = uint32_t(s.name.size());
    pid_t pid = getpid();
    if (write(out, &pid, sizeof pid) != sizeof pid || write(out, &len, sizeof len) != sizeof len ||
        write(out, s.name.data(), len) != ssize_t(len))
        _exit(1);
    fi_cq_tagged_entry e[16];
    for (;;) {
        while (fi_cq_read(s.cq, e, 16) != -FI_EAGAIN) {
            fi_cq_err_entry err{};
            fi_cq_readerr(s.cq, &err, 0);
        }
        usleep(200);
    }
}

struct Harness {
    Endpoint victim;
    pid_t sender_pid = 0;
    std::string sender_name;
    fid_mr *mr = nullptr;  // (left open: the victim lives as long as the process)
    uint64_t key = 0;
    std::vector<uint8_t> region = std::vector<uint8_t>(64 * 1024);
    std::vector<uint8_t> rx = std::vector<uint8_t>(2 * kReceives * (kRecvSize + 2 * kGuard), 0xa5);
    fi_context2 ctx[2 * kReceives];
    std::optional<shm::InboxSegment> segment;
    ShmRing *inbox = nullptr;
    uint32_t producer = 0;

    uint8_t *buffer(size_t i) { return rx.data() + i * (kRecvSize + 2 * kGuard) + kGuard; }
    void post(size_t i) {
        if (i < kReceives)
            fi_recv(victim.ep, buffer(i), kRecvSize, nullptr, FI_ADDR_UNSPEC, &ctx[i]);
        else
            fi_trecv(victim.ep, buffer(i), kRecvSize, nullptr, FI_ADDR_UNSPEC, 0, ~0ull, &ctx[i]);
    }
    void progress() {
        fi_cq_tagged_entry e[16];
        for (;;) {
            ssize_t n = fi_cq_read(victim.cq, e, 16);
            if (n == -FI_EAVAIL) {
                fi_cq_err_entry err{};
                if (fi_cq_readerr(victim.cq, &err, 0) != 1) return;
                repost(err.op_context, err.flags);
                continue;
            }
            if (n <= 0) return;
            for (ssize_t i = 0; i < n; ++i) repost(e[i].op_context, e[i].flags);
        }
    }
    void repost(void *context, uint64_t flags) {
        if (!(flags & FI_RECV)) return;
        for (size_t i = 0; i < 2 * kReceives; ++i)
            if (context == &ctx[i]) post(i);
    }
    bool guards_intact() {
        for (size_t i = 0; i < 2 * kReceives; ++i)
            for (size_t g = 0; g < kGuard; ++g)
                if (buffer(i)[-1 - ptrdiff_t(g)] != 0xa5 || buffer(i)[kRecvSize + g] != 0xa5)
                    return false;
        return true;
    }
};

Harness *g_harness;

void name_into(uint8_t *cell, size_t name_at, const std::string &name) {
    cell[2] = uint8_t(name.size());  // name_len: the same byte in both header formats
    memcpy(cell + name_at, name.data(), name.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    int fds[2];
    if (pipe(fds) != 0) abort();
    pid_t child = fork();  // before this process opens anything
    if (child == 0) {
        close(fds[0]);
        sender(fds[1]);
    }
    close(fds[1]);
    auto *h = g_harness = new Harness;
    uint32_t len = 0;
    if (read(fds[0], &h->sender_pid, sizeof h->sender_pid) != sizeof h->sender_pid ||
        read(fds[0], &len, sizeof len) != sizeof len || len > 64)
        abort();
    h->sender_name.resize(len);
    if (read(fds[0], h->sender_name.data(), len) != ssize_t(len)) abort();
    close(fds[0]);
    if (!h->victim.open()) {
        fprintf(stderr, "fuzz_local_cell: cannot open tandem (FI_PROVIDER_PATH?)\n");
        abort();
    }
    fi_addr_t addr;
    fi_av_insert(h->victim.av, h->sender_name.data(), 1, &addr, 0, nullptr);
    if (fi_mr_reg(h->victim.domain, h->region.data(), h->region.size(),
                  FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &h->mr, nullptr))
        abort();
    h->key = fi_mr_key(h->mr);
    for (size_t i = 0; i < 2 * kReceives; ++i) h->post(i);
    auto key = shm::local_key(h->victim.name.data(), h->victim.name.size());
    if (!key) abort();
    h->segment = shm::InboxSegment::open(*key, wire::kLocalCellSize);
    if (!h->segment) abort();
    h->inbox = h->segment->ring;
    h->producer = own_process_token();
    return 0;
}

// Input: cells, each one control byte, a 16-bit length and that many bytes of cell (the rest
// of the cell zero). Control bit 0: the sender's real name goes in (name_len and the name, at
// the place the cell's header format puts it); bit 1: every aligned 8-byte word kKeyMagic
// becomes the region's key and every aligned 4-byte word kPidMagic the sender's pid.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Harness &h = *g_harness;
    size_t at = 0;
    while (at + 3 <= size) {
        uint8_t ctl = data[at];
        size_t len = std::min<size_t>(data[at + 1] | size_t(data[at + 2]) << 8, size - at - 3);
        len = std::min<size_t>(len, wire::kLocalCellSize);
        const uint8_t *bytes = data + at + 3;
        at += 3 + len;
        void *slot = nullptr;
        for (int tries = 0; !(slot = h.inbox->try_reserve(h.producer)) && tries < 1000; ++tries)
            h.progress();
        if (!slot) abort();  // the victim stopped consuming its inbox
        auto *cell = static_cast<uint8_t *>(slot);
        memset(cell, 0, wire::kLocalCellSize);
        memcpy(cell, bytes, len);
        if (ctl & 1) {
            auto op = static_cast<wire::LocalOp>(cell[0]);
            bool compact = op == wire::LocalOp::Short || op == wire::LocalOp::Atomic;
            name_into(cell, compact ? sizeof(wire::LocalShortHeader) : sizeof(wire::LocalHeader),
                      h.sender_name);
        }
        if (ctl & 2) {
            for (size_t i = 0; i + 8 <= wire::kLocalCellSize; i += 8)
                if (uint64_t w; memcpy(&w, cell + i, 8), w == kKeyMagic)
                    memcpy(cell + i, &h.key, 8);
            for (size_t i = 0; i + 4 <= wire::kLocalCellSize; i += 4)
                if (uint32_t w; memcpy(&w, cell + i, 4), w == kPidMagic)
                    memcpy(cell + i, &h.sender_pid, 4);
        }
        h.inbox->publish(slot);
        h.progress();
    }
    for (int i = 0; i < 8; ++i) h.progress();
    if (!h.guards_intact()) abort();
    return 0;
}

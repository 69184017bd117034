// packet_relay: an Ethernet bridge in user space between two interfaces, with faults, for the
// network fault matrix (fault_matrix.sh). This kernel has no netem qdisc, so delay,
// reordering and duplication come from here: the relay sits in a namespace of its own between
// host A and host B (a veth pair to each, no IP forwarding), reads every frame from one
// interface with an AF_PACKET socket and writes it to the other. Everything is bridged (ARP
// and IPv6 neighbour discovery too); nothing is routed.
//
//   packet_relay IF1 IF2 [--delay-ms D] [--reorder-every N] [--dup-prob P] [--seed S]
//
//   --delay-ms D       every frame leaves D ms after it arrived (each direction)
//   --reorder-every N  one frame in N is held back and sent right after the next one (or
//                      after 20 ms if no next one comes, so that holding never turns into loss)
//   --dup-prob P       a frame is sent twice with probability P
//
// On SIGTERM or SIGINT it prints what it did ("packet_relay: frames=... delayed=...
// reordered=... duplicated=...") and exits 0: the test checks that the faults it asked for
// happened. It prints "packet_relay: ready" once both sockets are bound.
//
// Frames are read and written with a virtio-net header (PACKET_VNET_HDR): a veth hands over
// TCP segments as large GSO frames with their checksum left to the "hardware"; the header
// carries that state to the other side, where the kernel segments and checksums as needed.
// (There is no ethtool here to turn the offloads off.) The relay never looks into the header
// or the frame: it passes both on as they came.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) {
    g_stop = 1;
}

constexpr size_t kMaxFrame = 256 << 10;  // GSO frames reach 64 KiB; room for more
constexpr auto kMaxHold = std::chrono::milliseconds(20);

struct Frame {
    std::vector<uint8_t> bytes;  // virtio-net header, then the Ethernet frame
    Clock::time_point due;
};

struct Stats {
    uint64_t frames = 0, bytes = 0, delayed = 0, reordered = 0, hold_timeouts = 0, duplicated = 0,
             send_errors = 0, truncated = 0;
};

// One direction: frames read from `in` wait in `queue` until due, then go out on `out`.
struct Direction {
    int in = -1, out = -1;
    const char *name = "";
    std::deque<Frame> queue;  // in arrival order; the delay is fixed, so also in due order
    std::optional<Frame> held;
    Clock::time_point held_since;
    uint64_t count = 0;
};

int open_socket(const char *ifname) {
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
    if (fd < 0) {
        perror("packet_relay: socket(AF_PACKET)");
        exit(2);
    }
    int on = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &on, sizeof on) != 0) {
        perror("packet_relay: PACKET_VNET_HDR");
        exit(2);
    }
    // Our own transmissions on this interface must not come back to us as input.
    if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &on, sizeof on) != 0) {
        perror("packet_relay: PACKET_IGNORE_OUTGOING");
        exit(2);
    }
    unsigned idx = if_nametoindex(ifname);
    if (!idx) {
        fprintf(stderr, "packet_relay: no interface %s\n", ifname);
        exit(2);
    }
    sockaddr_ll sll{};
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = int(idx);
    if (bind(fd, reinterpret_cast<sockaddr *>(&sll), sizeof sll) != 0) {
        perror("packet_relay: bind");
        exit(2);
    }
    // A bridge port sees frames addressed to others: promiscuous, as long as we hold it.
    packet_mreq mr{};
    mr.mr_ifindex = int(idx);
    mr.mr_type = PACKET_MR_PROMISC;
    if (setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr) != 0) {
        perror("packet_relay: PACKET_MR_PROMISC");
        exit(2);
    }
    return fd;
}

class Relay {
  public:
    Relay(int delay_ms, unsigned reorder_every, double dup_prob, uint64_t seed)
        : delay_(std::chrono::milliseconds(delay_ms)),
          reorder_every_(reorder_every),
          dup_prob_(dup_prob),
          rng_(seed) {}

    void run(Direction &a, Direction &b) {
        std::vector<uint8_t> buf(kMaxFrame);
        while (!g_stop) {
            pollfd p[2] = {{a.in, POLLIN, 0}, {b.in, POLLIN, 0}};
            int rc = poll(p, 2, timeout_ms(a, b));
            if (rc < 0 && errno != EINTR) {
                perror("packet_relay: poll");
                exit(2);
            }
            if (rc > 0) {
                if (p[0].revents & POLLIN) drain(a, buf);
                if (p[1].revents & POLLIN) drain(b, buf);
            }
            flush(a);
            flush(b);
        }
        fprintf(stdout,
                "packet_relay: frames=%llu bytes=%llu delayed=%llu reordered=%llu "
                "hold_timeouts=%llu duplicated=%llu send_errors=%llu truncated=%llu\n",
                (unsigned long long)st_.frames, (unsigned long long)st_.bytes,
                (unsigned long long)st_.delayed, (unsigned long long)st_.reordered,
                (unsigned long long)st_.hold_timeouts, (unsigned long long)st_.duplicated,
                (unsigned long long)st_.send_errors, (unsigned long long)st_.truncated);
        fflush(stdout);
    }

  private:
    // Until the next frame is due (or a held one must go), at most 100 ms so that a signal is
    // noticed; -1 never, as poll() is interrupted by the signal anyway.
    int timeout_ms(const Direction &a, const Direction &b) const {
        auto now = Clock::now();
        auto next = now + std::chrono::milliseconds(100);
        for (const Direction *d : {&a, &b}) {
            if (!d->queue.empty()) next = std::min(next, d->queue.front().due);
            if (d->held) next = std::min(next, d->held_since + kMaxHold);
        }
        if (next <= now) return 0;
        // Round up: waking before the due time would only spin.
        auto us = std::chrono::duration_cast<std::chrono::microseconds>(next - now).count();
        return int((us + 999) / 1000);
    }

    void drain(Direction &d, std::vector<uint8_t> &buf) {
        for (;;) {
            ssize_t n = recv(d.in, buf.data(), buf.size(), MSG_TRUNC);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
                perror("packet_relay: recv");
                exit(2);
            }
            if (size_t(n) > buf.size()) {  // cannot happen with GSO limits; counted if it does
                ++st_.truncated;
                continue;
            }
            Frame f;
            f.bytes.assign(buf.begin(), buf.begin() + n);
            f.due = Clock::now() + delay_;
            d.queue.push_back(std::move(f));
        }
    }

    void send_frame(Direction &d, const Frame &f) {
        if (send(d.out, f.bytes.data(), f.bytes.size(), 0) < 0) {
            // A full queue or a link that is down drops the frame, as a wire would.
            ++st_.send_errors;
            return;
        }
        ++st_.frames;
        st_.bytes += f.bytes.size();
        if (delay_.count() > 0) ++st_.delayed;
    }

    void emit(Direction &d, const Frame &f) {
        send_frame(d, f);
        if (dup_prob_ > 0 && std::bernoulli_distribution(dup_prob_)(rng_)) {
            send_frame(d, f);
            ++st_.duplicated;
        }
    }

    void flush(Direction &d) {
        auto now = Clock::now();
        while (!d.queue.empty() && d.queue.front().due <= now) {
            Frame f = std::move(d.queue.front());
            d.queue.pop_front();
            if (reorder_every_ && !d.held && ++d.count % reorder_every_ == 0) {
                d.held = std::move(f);
                d.held_since = now;
                continue;
            }
            emit(d, f);
            if (d.held) {  // the held frame goes after the one that overtook it
                emit(d, *d.held);
                d.held.reset();
                ++st_.reordered;
            }
        }
        if (d.held && now - d.held_since >= kMaxHold) {
            emit(d, *d.held);
            d.held.reset();
            ++st_.hold_timeouts;
        }
    }

    std::chrono::milliseconds delay_;
    unsigned reorder_every_;
    double dup_prob_;
    std::mt19937_64 rng_;
    Stats st_;
};

[[noreturn]] void usage() {
    fprintf(stderr,
            "usage: packet_relay IF1 IF2 [--delay-ms D] [--reorder-every N] [--dup-prob P] "
            "[--seed S]\n");
    exit(2);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) usage();
    int delay_ms = 0;
    unsigned reorder_every = 0;
    double dup_prob = 0;
    uint64_t seed = 1;
    for (int i = 3; i < argc; ++i) {
        std::string a = argv[i];
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (a == "--delay-ms")
            delay_ms = atoi(v);
        else if (a == "--reorder-every")
            reorder_every = unsigned(atoi(v));
        else if (a == "--dup-prob")
            dup_prob = atof(v);
        else if (a == "--seed")
            seed = strtoull(v, nullptr, 0);
        else
            usage();
    }
    if (delay_ms < 0 || dup_prob < 0 || dup_prob > 1 || reorder_every == 1) usage();
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    int s1 = open_socket(argv[1]), s2 = open_socket(argv[2]);
    Direction ab, ba;
    ab.in = s1;
    ab.out = s2;
    ab.name = argv[1];
    ba.in = s2;
    ba.out = s1;
    ba.name = argv[2];
    printf("packet_relay: ready (%s <-> %s, delay %d ms, reorder 1 in %u, dup %.3f)\n", argv[1],
           argv[2], delay_ms, reorder_every, dup_prob);
    fflush(stdout);
    Relay(delay_ms, reorder_every, dup_prob, seed).run(ab, ba);
    close(s1);
    close(s2);
    return 0;
}

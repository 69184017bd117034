// Points where a test can freeze this process, to kill it there: peer death at a chosen moment
// of a protocol (tests/api/test_peer_death.cpp), where a SIGKILL at a random time would hit a
// different state on each run. TANDEM_TEST_STOP_AT=<point> (test processes only; documented
// for nobody else) makes the process stop itself (SIGSTOP) the first time it reaches that
// point; the test waits for it to be stopped, then kills it. Unset, a hook is one
// well-predicted branch on a flag read once.
#pragma once

#include <signal.h>

#include <cstdlib>
#include <cstring>

namespace tandem {

namespace test_hook_detail {
// Read when the library loads (a plain load at each hook, no guard of a function's static).
inline const char *const g_stop_point = [] {
    const char *p = std::getenv("TANDEM_TEST_STOP_AT");
    return p && *p ? p : nullptr;
}();
}  // namespace test_hook_detail

// TANDEM_TEST_SPLIT_WAIT=1 (test processes only): a node-local receiver that split a copy
// never takes the sender's part back (ep/split_copy.cpp) but waits for the sender, as a
// receiver does when the sender claimed its part first: the test of a sender killed in that
// state cannot otherwise tell in advance which of the two claims first. Read at each split
// (a test sets it for one case; a split copies at least 128 KiB, beside which getenv is
// nothing).
inline bool test_split_wait() {
    const char *p = std::getenv("TANDEM_TEST_SPLIT_WAIT");
    return p && std::strcmp(p, "1") == 0;
}

// The points (each named where it is placed):
//   local.ring_reserved   a node-local sender has claimed a cell of a peer's inbox and not
//                         published it
//   local.cts_arrived     a node-local sender of a large message got the receiver's Cts and
//                         has not claimed its half
//   local.cts_claimed     ... has claimed its half and not written it
//   local.before_cma_read a node-local receiver is about to copy a message out of its
//                         sender's memory
//   local.stream_backlogged  a node-local sender has written the first cells of a staged
//                         payload and keeps the rest until the peer's ring has room
//   link.request_received a TCP link listener has read a connection request, not answered it
//   link.read_requested   a TCP link target has read an RDMA read request, not answered it
//   link.write_received   a TCP link target has read an RDMA write's header, not its data
//   link.frame_partly_sent  a TCP link sender has put part of a frame on the socket
inline void stop_at(const char *point) {
    const char *armed = test_hook_detail::g_stop_point;
    if (__builtin_expect(armed != nullptr, 0) && std::strcmp(armed, point) == 0) {
        static bool stopped = false;
        if (!stopped) {
            stopped = true;
            raise(SIGSTOP);
        }
    }
}

}  // namespace tandem

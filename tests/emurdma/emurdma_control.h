/* Test control of the emulated RDMA device (tests/emurdma, libtandem-emurdma.so, test code only).
 * Plain C, exported from the library next to the ibv_* and rdma_* calls: a test finds these with
 * dlsym on the same handle it loaded the library with (dlopen of the same path gives the same
 * handle, so the provider and the test see one device).
 *
 * Environment, read once at the first call into the library:
 *   EMURDMA_NETDEV       network interfaces whose IPv4/IPv6 addresses the device serves, comma
 *                        separated, as a NIC with a port on each (default lo: every
 *                        127.0.0.0/8 address and ::1)
 *   EMURDMA_MAX_INLINE   largest IBV_SEND_INLINE payload (default 128 bytes)
 *   EMURDMA_MAX_SGE      scatter/gather entries per work request, send and receive (default 16)
 *   EMURDMA_FAULT        "qp_error_after:N": every QP of the process goes to the error state right
 *                        after the completion of its N-th posted send work request, as
 *                        emurdma_inject_qp_error does (whole-program fault tests). */
#ifndef TANDEM_TESTS_EMURDMA_CONTROL_H
#define TANDEM_TESTS_EMURDMA_CONTROL_H

#include <stdint.h>

#if defined(__GNUC__)
#define EMURDMA_EXPORT __attribute__((visibility("default")))
#else
#define EMURDMA_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Counters of this process since it loaded the library (or the last emurdma_reset_stats), and two
 * gauges. Work requests are counted when the NIC executes them, not when posted. */
struct emurdma_stats {
    unsigned long long sends;          /* SEND and SEND_WITH_IMM transmitted */
    unsigned long long writes;         /* RDMA_WRITE and RDMA_WRITE_WITH_IMM transmitted */
    unsigned long long reads;          /* RDMA_READ requests transmitted */
    unsigned long long read_responses; /* RDMA_READ requests served here (response begun) */
    unsigned long long inline_sends;   /* work requests posted with IBV_SEND_INLINE */
    unsigned long long rnr_waits; /* incoming messages that found no receive posted (once each) */
    unsigned long long remote_access_errors; /* IBV_WC_REM_ACCESS_ERR completions made here */
    unsigned long long flushes;              /* IBV_WC_WR_FLUSH_ERR completions made here */
    unsigned long long dmabuf_regs;          /* successful ibv_reg_dmabuf_mr */
    /* Gauges, not cleared by emurdma_reset_stats. */
    unsigned long long mrs_registered; /* live memory regions */
    unsigned long long qps;            /* live queue pairs */
};

EMURDMA_EXPORT void emurdma_get_stats(struct emurdma_stats *out);
EMURDMA_EXPORT void emurdma_reset_stats(void);

/* Moves the QP with that number (0: every QP of the process) to the error state as the device
 * would on a fatal error: its work requests flush, the peer's outstanding work completes with
 * IBV_WC_RETRY_EXC_ERR (its QP then goes to error too), and both rdma_cm ids get
 * RDMA_CM_EVENT_DISCONNECTED. Returns 0, or -1 when no such QP exists. */
EMURDMA_EXPORT int emurdma_inject_qp_error(uint32_t qp_num);

/* Hot removal of the device from this process: every rdma_cm id gets
 * RDMA_CM_EVENT_DEVICE_REMOVAL, every open context the async event IBV_EVENT_DEVICE_FATAL, every
 * QP goes to the error state (flush). The removed contexts stay usable for destroy calls only
 * (creating objects on them fails with EIO); ids created afterwards get a fresh device context, as
 * after a re-plug. */
EMURDMA_EXPORT void emurdma_remove_device(void);

/* Port 1 of every context of this process. Down: async IBV_EVENT_PORT_ERR, ibv_query_port says
 * IBV_PORT_DOWN, address resolution gives RDMA_CM_EVENT_ADDR_ERROR, rdma_connect
 * RDMA_CM_EVENT_UNREACHABLE, and send work requests of existing QPs complete with
 * IBV_WC_RETRY_EXC_ERR. Up: async IBV_EVENT_PORT_ACTIVE. */
EMURDMA_EXPORT void emurdma_set_port_state(int up);

/* Holds (hold != 0) or releases the reading of the connection of the QP with that number: while
 * held, neither the NIC thread nor the app's calls read what its peer sent, which stays in the
 * socket (and, once that is full, in the peer's NIC), as if this NIC were slow to take it.
 * Returns 0, or -1 when no such QP exists or it has no connection. */
EMURDMA_EXPORT int emurdma_hold_reads(uint32_t qp_num, int hold);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TANDEM_TESTS_EMURDMA_CONTROL_H */

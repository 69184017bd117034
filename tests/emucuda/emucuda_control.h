/* Test control of the emulated CUDA driver (tests/emucuda, built as libcuda.so.1 for the tests
 * only). Plain C, exported from the library next to the driver calls: a test either links the
 * library or finds these with dlsym(RTLD_DEFAULT / its dlopen handle, "emucuda_...").
 *
 * Environment read once, at the first call into the library (driver or control call):
 *   EMUCUDA_DEVICES          number of devices (default 1, at most 16; 0: cuInit succeeds,
 *                            cuDeviceGetCount gives 0)
 *   EMUCUDA_MEM_LIMIT        bytes of device memory this process may hold at once (default: none)
 *   EMUCUDA_IPC=0            cuIpcGetMemHandle / cuIpcOpenMemHandle give CUDA_ERROR_NOT_SUPPORTED
 *   EMUCUDA_PEER_ACCESS=0    no peer access between different devices
 *   EMUCUDA_DMABUF=0         no dma-buf export (attribute DMA_BUF_SUPPORTED is 0)
 *   EMUCUDA_SYNC_TIMEOUT_MS  how long a synchronizing call waits for a blocked stream before it
 *                            gives up with CUDA_ERROR_UNKNOWN (default 10000)
 * The control calls below change the switchable ones at run time. */
#ifndef TANDEM_TESTS_EMUCUDA_CONTROL_H
#define TANDEM_TESTS_EMUCUDA_CONTROL_H

#if defined(__GNUC__)
#define EMUCUDA_EXPORT __attribute__((visibility("default")))
#else
#define EMUCUDA_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Counters of successful calls unless said otherwise. Copies are counted when issued (an
 * asynchronous copy queued behind a stream wait counts at once). */
struct emucuda_stats {
    unsigned long long allocs, frees, htod_copies, dtoh_copies, dtod_copies,
        peer_copies, /* dtod between different devices (also counted in dtod_copies) */
        bytes_htod, bytes_dtoh, bytes_dtod, ipc_gets,
        ipc_opens,  /* successful opens incl. refcount hits */
        ipc_closes, /* successful closes incl. those that only drop a reference */
        dmabuf_gets, stream_mem_ops /* write-value and wait-value */,
        failed_calls; /* calls that returned an error (CUDA_ERROR_NOT_READY is no error) */
    /* Added after the list above. */
    unsigned long long htoh_copies, bytes_htoh; /* cuMemcpyAsync with two host addresses */
    unsigned long long event_records;
    unsigned long long sync_timeouts; /* synchronizing calls that gave up on a blocked stream */
    /* State, not counters: not cleared by emucuda_reset_stats. */
    unsigned long long live_allocs, live_bytes, live_ipc_mappings;
};

EMUCUDA_EXPORT void emucuda_get_stats(struct emucuda_stats *out);
EMUCUDA_EXPORT void emucuda_reset_stats(void);
EMUCUDA_EXPORT void emucuda_set_ipc_enabled(int enabled);
EMUCUDA_EXPORT void emucuda_set_peer_access(int enabled);
EMUCUDA_EXPORT void emucuda_set_mem_limit(unsigned long long bytes /* 0 = none */);
EMUCUDA_EXPORT void emucuda_set_sync_timeout_ms(unsigned ms /* 0 = the default, 10 s */);
/* Failure injection: the next `count` calls of a kind fail with `error` (a CUresult), as a
 * device would (a copy faulting, a mapping out of memory). */
enum { EMUCUDA_FAIL_COPY = 1 /* every cuMemcpy* */, EMUCUDA_FAIL_IPC_OPEN = 2 };
EMUCUDA_EXPORT void emucuda_fail_next(int what, int count, int error);
/* The same after `pass` more calls of the kind have succeeded (a fault in mid-transfer). */
EMUCUDA_EXPORT void emucuda_fail_after(int what, int pass, int count, int error);
/* Does p lie inside a live allocation or an opened IPC mapping of this process (the range the
 * pointer attributes report: base .. base + requested size)? */
EMUCUDA_EXPORT int emucuda_is_device_address(const void *p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TANDEM_TESTS_EMUCUDA_CONTROL_H */

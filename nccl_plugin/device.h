// What every NCCL device of the plugin answers: a physical one (NetDevice, one tandem domain)
// or a virtual NIC (VirtualDevice, several of them fused by makeVDevice). Plugin routes each
// call by the device byte of the handle (handle_table.h) to one of these; the calls take the
// newest table version's arguments (exports.cpp adapts the older ones).
#pragma once

#include "nccl_plugin/nccl_net_abi.h"

#include <cstddef>
#include <cstdint>

namespace tandem::nccl {

class Device {
  public:
    virtual ~Device() = default;

    virtual Result listen(void *handle, void **listen_comm) = 0;
    virtual Result connect(void *handle, void **send_comm) = 0;
    virtual Result accept(void *listen_comm, void **recv_comm) = 0;
    virtual Result reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) = 0;
    virtual Result reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                 int fd, void **mhandle) = 0;
    virtual Result dereg_mr(void *comm, void *mhandle) = 0;
    virtual Result isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                         void **request) = 0;
    virtual Result irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
                         void **mhandles, void **request) = 0;
    virtual Result iflush(void *recv_comm, int n, void **mhandles, void **request) = 0;
    virtual Result test(void *request, int *done, int *sizes) = 0;
    virtual Result close_send(void *send_comm) = 0;
    virtual Result close_recv(void *recv_comm) = 0;
    virtual Result close_listen(void *listen_comm) = 0;

    // Closes what the device opened (the last context finalized, no comm open).
    virtual void shut_down() = 0;
    virtual size_t open_comms() = 0;
};

}  // namespace tandem::nccl

// The plugin's process-wide state: NCCL's logger, the options, the devices found at the first
// init, and the contexts NCCL holds (v11 initialises once per communicator). exports.cpp adapts
// every table version to the calls below, which take the newest version's arguments.
#pragma once

#include "nccl_plugin/log.h"
#include "nccl_plugin/nccl_net_abi.h"
#include "nccl_plugin/net_device.h"
#include "nccl_plugin/vdevice.h"

#include <atomic>
#include <memory>
#include <vector>

namespace tandem::nccl {

class Plugin {
  public:
    static Plugin &instance();

    // Finds the devices at the first call; later calls only count the context.
    Result init(void **ctx, const CommConfig *config, Logger logger);
    Result finalize(void *ctx);
    Result devices(int *count);
    Result properties(int dev, PropertiesV12 *props);
    // makeVDevice: a virtual NIC of `ndevs` physical devices (at most `max_devs`, the table's
    // NCCL_NET_MAX_DEVS_PER_NIC), numbered after every device so far.
    Result make_vdevice(int *dev, const int *devs, int ndevs, int max_devs);
    // The bytes member `member` of virtual device `dev` has carried (the tests' view).
    bool member_bytes(int dev, int member, uint64_t *sent, uint64_t *received);

    // The device of a comm, request or memory handle (nullptr, and a WARN, for a bad one).
    Device *device_of(const void *handle, const char *call);
    Device *device(int dev, const char *call);

  private:
    Plugin() = default;
    Result discover();

    std::mutex mu_;
    bool discovered_ = false;
    Result discovery_result_ = kSuccess;
    Options options_;
    // The physical devices, found by discover(), then the virtual NICs of makeVDevice; never
    // reallocated (reserved for all 255 that handles can name) and published by device_count_,
    // so that the calls of every message find their device without a lock.
    struct Slot {
        std::unique_ptr<Device> device;
        NetDevice *net = nullptr;       // a physical device
        VirtualDevice *virt = nullptr;  // a virtual NIC
    };
    std::vector<Slot> devices_;
    std::atomic<size_t> device_count_{0};
    int contexts_ = 0;
};

}  // namespace tandem::nccl

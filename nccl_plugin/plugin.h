// The plugin's process-wide state: NCCL's logger, the options, the devices found at the first
// init, and the contexts NCCL holds (v11 initialises once per communicator). exports.cpp adapts
// every table version to the calls below, which take the newest version's arguments.
#pragma once

#include "nccl_plugin/nccl_net_abi.h"
#include "nccl_plugin/net_device.h"

#include <atomic>
#include <memory>
#include <vector>

namespace tandem::nccl {

// Every error goes to NCCL's logger once, as a WARN with its libfabric cause.
void log(LogLevel level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define NCCL_TANDEM_WARN(...) \
    ::tandem::nccl::log(::tandem::nccl::kLogWarn, __FILE__, __LINE__, __VA_ARGS__)
#define NCCL_TANDEM_INFO(...) \
    ::tandem::nccl::log(::tandem::nccl::kLogInfo, __FILE__, __LINE__, __VA_ARGS__)

class Plugin {
  public:
    static Plugin &instance();

    // Finds the devices at the first call; later calls only count the context.
    Result init(void **ctx, const CommConfig *config, Logger logger);
    Result finalize(void *ctx);
    Result devices(int *count);
    Result properties(int dev, PropertiesV11 *props);

    // The device of a comm, request or memory handle (nullptr, and a WARN, for a bad one).
    NetDevice *device_of(const void *handle, const char *call);
    NetDevice *device(int dev, const char *call);

  private:
    Plugin() = default;
    Result discover();

    std::mutex mu_;
    bool discovered_ = false;
    Result discovery_result_ = kSuccess;
    Options options_;
    // Filled once, by discover(); device_count_ publishes it, so that the calls of every
    // message find their device without a lock.
    std::vector<std::unique_ptr<NetDevice>> devices_;
    std::atomic<size_t> device_count_{0};
    int contexts_ = 0;
};

}  // namespace tandem::nccl

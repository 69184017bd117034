// The plugin's log lines go to NCCL's logger (plugin.cpp keeps it): every error once, as a WARN
// with its libfabric cause.
#pragma once

#include "nccl_plugin/nccl_net_abi.h"

namespace tandem::nccl {

void log(LogLevel level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

}  // namespace tandem::nccl

#define NCCL_TANDEM_WARN(...) \
    ::tandem::nccl::log(::tandem::nccl::kLogWarn, __FILE__, __LINE__, __VA_ARGS__)
#define NCCL_TANDEM_INFO(...) \
    ::tandem::nccl::log(::tandem::nccl::kLogInfo, __FILE__, __LINE__, __VA_ARGS__)
// Logs the WARN and returns `result` from the calling function.
#define WARN_RETURN(result, ...)       \
    do {                               \
        NCCL_TANDEM_WARN(__VA_ARGS__); \
        return result;                 \
    } while (0)

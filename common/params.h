// Provider parameters: every tunable is defined with fi_param_define (so `fi_info -e` lists it
// with its help text) and read with fi_param_get (so FI_<PROV>_<NAME> sets it).
#pragma once

#include <rdma/fabric.h>
#include <rdma/providers/fi_prov.h>

#include <cstddef>
#include <string>

namespace tandem {

class ParamReader {
  public:
    explicit ParamReader(fi_provider *prov) : prov_(prov) {}

    size_t size(const char *name, const char *help, size_t fallback) const;
    bool flag(const char *name, const char *help, bool fallback) const;
    int integer(const char *name, const char *help, int fallback) const;
    std::string text(const char *name, const char *help, const char *fallback) const;

  private:
    fi_provider *prov_;
};

}  // namespace tandem

#include "params.h"

#include <string>

namespace tandem {

// fi_param_define rejects a second definition of the same name with -FI_EALREADY, which is
// harmless: the help text is already registered.
size_t ParamReader::size(const char *name, const char *help, size_t fallback) const {
    fi_param_define(prov_, name, FI_PARAM_SIZE_T, "%s (default: %zu)", help, fallback);
    size_t value = fallback;
    return fi_param_get_size_t(prov_, name, &value) == FI_SUCCESS ? value : fallback;
}

bool ParamReader::flag(const char *name, const char *help, bool fallback) const {
    fi_param_define(prov_, name, FI_PARAM_BOOL, "%s (default: %s)", help, fallback ? "yes" : "no");
    int value = fallback;
    return fi_param_get_bool(prov_, name, &value) == FI_SUCCESS ? value != 0 : fallback;
}

int ParamReader::integer(const char *name, const char *help, int fallback) const {
    fi_param_define(prov_, name, FI_PARAM_INT, "%s (default: %d)", help, fallback);
    int value = fallback;
    return fi_param_get_int(prov_, name, &value) == FI_SUCCESS ? value : fallback;
}

std::string ParamReader::text(const char *name, const char *help, const char *fallback) const {
    fi_param_define(prov_, name, FI_PARAM_STRING, "%s (default: %s)", help, fallback);
    char *value = nullptr;
    if (fi_param_get_str(prov_, name, &value) == FI_SUCCESS && value) return value;
    return fallback;
}

}  // namespace tandem

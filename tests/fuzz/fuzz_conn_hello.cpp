// Fuzz target: the private data of a link connection request (main_prov/conn_hello.cpp), as
// a listening RDM, MSG or passive endpoint receives it from anyone who connects. Checks, on
// top of the sanitizers: an input is refused with a reason, or accepted and then exactly what
// build_conn_hello makes of the fields it yielded (nothing left over, nothing read past the
// end), and an RDM name it yields is one EndpointName takes or refuses whole.
#include "main_prov/conn_hello.h"
#include "main_prov/types.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::span<const uint8_t> in(data, size);
    std::string why;
    auto hello = tandem::parse_conn_hello(in, &why);
    if (!hello) {
        if (why.empty()) abort();  // a refusal must say why (it is logged)
        return 0;
    }
    if (hello->name.data() < data || hello->user.data() + hello->user.size() > data + size) abort();
    auto again = tandem::build_conn_hello(hello->kind, hello->auth, hello->name, hello->user);
    // The reserved word is not read: compare everything else.
    std::vector<uint8_t> expect(data, data + size);
    constexpr size_t reserved_at = offsetof(tandem::wire::ConnHello, reserved);
    if (expect.size() < sizeof(tandem::wire::ConnHello)) abort();
    std::fill_n(expect.begin() + reserved_at, sizeof(uint32_t), 0);
    if (again != expect) abort();
    tandem::EndpointName name;
    if (tandem::EndpointName::from_bytes(hello->name.data(), hello->name.size(), name) &&
        name.length() > hello->name.size())
        abort();
    return 0;
}

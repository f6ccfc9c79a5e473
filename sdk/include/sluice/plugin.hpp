#pragma once
#include <cstdint>
#include <memory>

#include "sluice/abi.hpp"
#include "sluice/operator.hpp"

namespace sluice {

/// The host's side of registration: a plugin adds its operators here.
class Registrar {
 public:
  virtual ~Registrar() = default;
  virtual void add_operator(OperatorInfo info) = 0;

  /// T provides `static OperatorInfo describe()` (without `create`) and a constructor from Params.
  template <class T> void add() {
    OperatorInfo info = T::describe();
    info.create = [](const Params& params) -> std::unique_ptr<Operator> { return std::make_unique<T>(params); };
    add_operator(std::move(info));
  }
};

/// What the entry symbol returns. Plain C layout, ABI numbers first: the host reads and checks them
/// before it touches any other field or calls any plugin code.
struct PluginDescriptor {
  std::uint32_t abi_major;
  std::uint32_t abi_minor;
  const char* name;
  const char* version;
  const char* summary;
  void (*register_operators)(Registrar& registrar);
};

}  // namespace sluice

#define SLUICE_PLUGIN_ENTRY_SYMBOL "sluice_plugin_entry"

/// Declares a plugin: SLUICE_PLUGIN("name", "1.0.0", "what it offers") { registrar.add<MyOp>(); }
#define SLUICE_PLUGIN(NAME, VERSION, SUMMARY)                                                          \
  static void sluice_register_operators_(::sluice::Registrar& registrar);                              \
  extern "C" __attribute__((visibility("default"))) const ::sluice::PluginDescriptor*                 \
  sluice_plugin_entry() {                                                                              \
    static const ::sluice::PluginDescriptor descriptor{::sluice::kAbiMajor, ::sluice::kAbiMinor, NAME, \
                                                       VERSION, SUMMARY, &sluice_register_operators_}; \
    return &descriptor;                                                                                \
  }                                                                                                    \
  static void sluice_register_operators_([[maybe_unused]] ::sluice::Registrar& registrar)

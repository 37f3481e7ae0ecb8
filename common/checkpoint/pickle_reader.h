#pragma once
// A restricted unpickler for what torch.save emits: it builds a tree of plain values and
// never calls anything. A pickle is a program for Python's pickle machine; here GLOBAL
// only names a callable from an allow-list the caller gives (anything else is refused,
// naming it), REDUCE records "this allowed callable applied to these arguments" as an
// Object for the caller to interpret (collections.OrderedDict() becomes an empty Dict), and
// BINPERSID records the persistent id (PyTorch's storage reference) as a Persistent value.
// Opcodes outside protocols 2-4 state dicts' needs are refused by name; input size, stack
// depth and memo size are bounded, so hostile input ends in an error, not a crash.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tessera {

struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kBigInt, kFloat, kString, kBytes, kTuple, kList, kDict, kGlobal, kObject, kPersistent };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  // kString (UTF-8), kBytes, kBigInt (little-endian two's complement bytes), kGlobal and
  // kObject ("module.name").
  std::string text;
  // kTuple/kList elements; kObject: the arguments; kPersistent: one element, the id.
  std::vector<const PickleValue*> items;
  std::vector<std::pair<const PickleValue*, const PickleValue*>> entries;  // kDict, in order
  const PickleValue* state = nullptr;  // BUILD's argument on a kObject or kDict (else null)

  bool is_string() const { return kind == Kind::kString; }
  bool is_int() const { return kind == Kind::kInt; }
};

const char* pickle_kind_name(PickleValue::Kind kind);

struct PickleOptions {
  std::set<std::string> allowed_globals;  // "module.name" GLOBAL/STACK_GLOBAL may name
  std::set<std::string> callable_globals;  // the subset REDUCE may apply
  size_t max_stack = 1 << 20;  // values on the stack and under open MARKs together
  size_t max_marks = 4096;     // nesting depth of MARKs
  size_t max_memo = 1 << 22;   // memo entries
};

// The values of one pickle; they live as long as the document.
class PickleDocument {
 public:
  const PickleValue* root() const { return root_; }
  size_t consumed() const { return consumed_; }  // bytes up to and including STOP

 private:
  friend class PickleMachine;
  std::vector<std::unique_ptr<PickleValue>> arena_;
  const PickleValue* root_ = nullptr;
  size_t consumed_ = 0;
};

// Runs the pickle that starts at `data` up to its STOP (bytes after STOP are left alone:
// the legacy format puts several pickles and raw storages back to back). `where` names the
// file in errors.
StatusOr<std::unique_ptr<PickleDocument>> read_pickle(const char* data, size_t size, const PickleOptions& options,
                                                      const std::string& where);

}  // namespace tessera

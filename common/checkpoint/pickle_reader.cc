#include "common/checkpoint/pickle_reader.h"

#include <cstring>
#include <unordered_map>

namespace tessera {

const char* pickle_kind_name(PickleValue::Kind kind) {
  using K = PickleValue::Kind;
  switch (kind) {
    case K::kNone: return "None";
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kBigInt: return "int";
    case K::kFloat: return "float";
    case K::kString: return "str";
    case K::kBytes: return "bytes";
    case K::kTuple: return "tuple";
    case K::kList: return "list";
    case K::kDict: return "dict";
    case K::kGlobal: return "global";
    case K::kObject: return "object";
    case K::kPersistent: return "persistent id";
  }
  return "?";
}

namespace {

// Opcodes Python's pickle defines that a state dict never needs: refused by name, so that
// the message says what the file asked for.
const char* refused_opcode_name(unsigned char op) {
  switch (op) {
    case 'I': return "INT";
    case 'L': return "LONG";
    case 'F': return "FLOAT";
    case 'S': return "STRING";
    case 'V': return "UNICODE";
    case 'P': return "PERSID";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 'g': return "GET";
    case 'p': return "PUT";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

std::string hex_byte(unsigned char b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

}  // namespace

class PickleMachine {
 public:
  PickleMachine(const char* data, size_t size, const PickleOptions& options, const std::string& where)
      : data_(data), size_(size), options_(options), where_(where), doc_(new PickleDocument()) {}

  StatusOr<std::unique_ptr<PickleDocument>> run() {
    while (true) {
      if (pos_ >= size_) return fail("ends before its STOP opcode (file truncated?)");
      op_at_ = pos_;
      const unsigned char op = static_cast<unsigned char>(data_[pos_++]);
      if (op == '.') {
        if (stack_.size() != 1 || !marks_.empty()) return fail("STOP with " + std::to_string(stack_.size()) + " values on the stack");
        doc_->root_ = stack_.back();
        doc_->consumed_ = pos_;
        return std::move(doc_);
      }
      TESSERA_RETURN_IF_ERROR(step(op));
    }
  }

 private:
  using V = PickleValue;
  using K = PickleValue::Kind;

  Status fail(const std::string& what) const {
    return data_loss(where_ + ": pickle at byte " + std::to_string(op_at_) + " " + what);
  }

  V* make(K kind) {
    doc_->arena_.push_back(std::make_unique<V>());
    doc_->arena_.back()->kind = kind;
    return doc_->arena_.back().get();
  }

  Status push(const V* v) {
    if (stack_.size() >= options_.max_stack) return fail("needs more than " + std::to_string(options_.max_stack) + " stack entries");
    stack_.push_back(v);
    return Status::ok();
  }
  StatusOr<const V*> pop() {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) return fail("pops an empty stack");
    const V* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  // The values above the last MARK, which is removed.
  // The value on top, which must lie above the last MARK (a MARK opens a fresh stack).
  StatusOr<const V*> top(const char* op) const {
    const size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() <= floor) return fail(std::string(op) + " finds nothing to work on");
    return stack_.back();
  }
  StatusOr<std::vector<const V*>> pop_mark() {
    if (marks_.empty()) return fail("expects a MARK that was never set");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<const V*> out(stack_.begin() + static_cast<ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return out;
  }

  StatusOr<const char*> take(uint64_t n) {
    if (n > size_ - pos_) return fail("needs " + std::to_string(n) + " more bytes than the data holds (file truncated?)");
    const char* p = data_ + pos_;
    pos_ += static_cast<size_t>(n);
    return p;
  }
  StatusOr<uint64_t> read_le(int n) {
    TESSERA_ASSIGN_OR_RETURN(const char* p, take(n));
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
    return v;
  }
  StatusOr<std::string> read_line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    if (nl == nullptr) return fail("has a GLOBAL without its newline (file truncated?)");
    const size_t len = static_cast<const char*>(nl) - (data_ + pos_);
    std::string s(data_ + pos_, len);
    pos_ += len + 1;
    return s;
  }

  Status push_int(int64_t v) {
    V* x = make(K::kInt);
    x->integer = v;
    return push(x);
  }
  Status push_text(K kind, uint64_t n) {
    TESSERA_ASSIGN_OR_RETURN(const char* p, take(n));
    V* x = make(kind);
    x->text.assign(p, static_cast<size_t>(n));
    return push(x);
  }
  Status push_global(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    if (options_.allowed_globals.count(full) == 0) {
      return invalid_argument(where_ + ": the pickle names the global '" + full +
                              "', which is not one a PyTorch state dict needs; it is refused (a pickle is code, and "
                              "Tessera never runs it)");
    }
    V* g = make(K::kGlobal);
    g->text = full;
    return push(g);
  }
  Status memo_put(uint64_t index) {
    TESSERA_ASSIGN_OR_RETURN(const V* v, top("a memo put"));
    if (memo_.size() >= options_.max_memo && memo_.count(index) == 0)
      return fail("memoizes more than " + std::to_string(options_.max_memo) + " values");
    memo_[index] = v;
    return Status::ok();
  }
  Status memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return fail("reads memo entry " + std::to_string(index) + ", which was never stored");
    return push(it->second);
  }
  Status make_tuple(std::vector<const V*> items) {
    V* t = make(K::kTuple);
    t->items = std::move(items);
    return push(t);
  }
  // Values on the stack are shared with the memo, so containers are mutated in place, as
  // Python's pickle does; the const is only the consumer's view.
  static V* mutable_value(const V* v) { return const_cast<V*>(v); }

  Status set_items(const V* target, const std::vector<const V*>& kv) {
    if (target->kind != K::kDict) return fail("SETITEM(S) on a " + std::string(pickle_kind_name(target->kind)) + ", not a dict");
    if (kv.size() % 2 != 0) return fail("SETITEMS with an odd number of values");
    V* d = mutable_value(target);
    for (size_t i = 0; i < kv.size(); i += 2) d->entries.emplace_back(kv[i], kv[i + 1]);
    return Status::ok();
  }
  Status append(const V* target, const std::vector<const V*>& items) {
    if (target->kind != K::kList) return fail("APPEND(S) on a " + std::string(pickle_kind_name(target->kind)) + ", not a list");
    V* l = mutable_value(target);
    l->items.insert(l->items.end(), items.begin(), items.end());
    return Status::ok();
  }

  Status step(unsigned char op) {
    switch (op) {
      case 0x80: {  // PROTO
        TESSERA_ASSIGN_OR_RETURN(uint64_t proto, read_le(1));
        if (proto < 2 || proto > 5) return fail("uses pickle protocol " + std::to_string(proto) + " (2 to 5 are read)");
        return Status::ok();
      }
      case 0x95: return take(8).status();  // FRAME: a length hint, the opcodes follow inline
      case '(':
        if (marks_.size() >= options_.max_marks) return fail("nests MARKs deeper than " + std::to_string(options_.max_marks));
        marks_.push_back(stack_.size());
        return Status::ok();
      case '}': return push(make(K::kDict));
      case ']': return push(make(K::kList));
      case ')': return push(make(K::kTuple));
      case 'N': return push(make(K::kNone));
      case 0x88:
      case 0x89: {
        V* b = make(K::kBool);
        b->boolean = op == 0x88;
        return push(b);
      }
      case 'J': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t v, read_le(4));
        return push_int(static_cast<int32_t>(static_cast<uint32_t>(v)));
      }
      case 'K': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t v, read_le(1));
        return push_int(static_cast<int64_t>(v));
      }
      case 'M': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t v, read_le(2));
        return push_int(static_cast<int64_t>(v));
      }
      case 0x8a:    // LONG1
      case 0x8b: {  // LONG4
        TESSERA_ASSIGN_OR_RETURN(uint64_t n, read_le(op == 0x8a ? 1 : 4));
        TESSERA_ASSIGN_OR_RETURN(const char* p, take(n));
        if (n > 8) {  // e.g. the legacy format's magic number; kept as bytes
          V* big = make(K::kBigInt);
          big->text.assign(p, static_cast<size_t>(n));
          return push(big);
        }
        uint64_t v = 0;
        for (uint64_t i = n; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(p[i]);
        if (n > 0 && n < 8 && (static_cast<unsigned char>(p[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        return push_int(static_cast<int64_t>(v));
      }
      case 'G': {  // BINFLOAT: big-endian double
        TESSERA_ASSIGN_OR_RETURN(const char* p, take(8));
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(p[i]);
        V* f = make(K::kFloat);
        std::memcpy(&f->real, &bits, 8);
        return push(f);
      }
      case 'X': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t n, read_le(4));
        return push_text(K::kString, n);
      }
      case 0x8c: {
        TESSERA_ASSIGN_OR_RETURN(uint64_t n, read_le(1));
        return push_text(K::kString, n);
      }
      case 0x8d: {
        TESSERA_ASSIGN_OR_RETURN(uint64_t n, read_le(8));
        return push_text(K::kString, n);
      }
      case 'U': {  // SHORT_BINSTRING (Python 2 str): as text
        TESSERA_ASSIGN_OR_RETURN(uint64_t n, read_le(1));
        return push_text(K::kString, n);
      }
      case 'T': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t n, read_le(4));
        return push_text(K::kString, n);
      }
      case 'C': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t n, read_le(1));
        return push_text(K::kBytes, n);
      }
      case 'B': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t n, read_le(4));
        return push_text(K::kBytes, n);
      }
      case 't': {
        TESSERA_ASSIGN_OR_RETURN(auto items, pop_mark());
        return make_tuple(std::move(items));
      }
      case 0x85:
      case 0x86:
      case 0x87: {
        const int n = op - 0x84;
        std::vector<const V*> items(n);
        for (int i = n - 1; i >= 0; --i) {
          TESSERA_ASSIGN_OR_RETURN(items[i], pop());
        }
        return make_tuple(std::move(items));
      }
      case 'l': {
        TESSERA_ASSIGN_OR_RETURN(auto items, pop_mark());
        V* l = make(K::kList);
        l->items = std::move(items);
        return push(l);
      }
      case 'd': {
        TESSERA_ASSIGN_OR_RETURN(auto kv, pop_mark());
        V* d = make(K::kDict);
        TESSERA_RETURN_IF_ERROR(push(d));
        return set_items(d, kv);
      }
      case 'q': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t i, read_le(1));
        return memo_put(i);
      }
      case 'r': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t i, read_le(4));
        return memo_put(i);
      }
      case 0x94: return memo_put(memo_.size());  // MEMOIZE
      case 'h': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t i, read_le(1));
        return memo_get(i);
      }
      case 'j': {
        TESSERA_ASSIGN_OR_RETURN(uint64_t i, read_le(4));
        return memo_get(i);
      }
      case 'c': {  // GLOBAL "module\nname\n"
        TESSERA_ASSIGN_OR_RETURN(std::string module, read_line());
        TESSERA_ASSIGN_OR_RETURN(std::string name, read_line());
        return push_global(module, name);
      }
      case 0x93: {  // STACK_GLOBAL
        TESSERA_ASSIGN_OR_RETURN(const V* name, pop());
        TESSERA_ASSIGN_OR_RETURN(const V* module, pop());
        if (!name->is_string() || !module->is_string()) return fail("STACK_GLOBAL needs two strings");
        return push_global(module->text, name->text);
      }
      case 'R': {  // REDUCE: callable(*args), recorded, never called
        TESSERA_ASSIGN_OR_RETURN(const V* args, pop());
        TESSERA_ASSIGN_OR_RETURN(const V* callable, pop());
        if (callable->kind != K::kGlobal) return fail("REDUCE applies a " + std::string(pickle_kind_name(callable->kind)) + ", not a global");
        if (args->kind != K::kTuple) return fail("REDUCE's arguments are a " + std::string(pickle_kind_name(args->kind)) + ", not a tuple");
        if (options_.callable_globals.count(callable->text) == 0)
          return invalid_argument(where_ + ": the pickle calls '" + callable->text + "', which a PyTorch state dict never calls; refused");
        if (callable->text == "collections.OrderedDict") {
          if (!args->items.empty()) return fail("builds an OrderedDict from arguments (torch.save passes none)");
          return push(make(K::kDict));
        }
        V* obj = make(K::kObject);
        obj->text = callable->text;
        obj->items = args->items;
        return push(obj);
      }
      case 'b': {  // BUILD: state for the object below; recorded (an OrderedDict's _metadata)
        TESSERA_ASSIGN_OR_RETURN(const V* state, pop());
        TESSERA_ASSIGN_OR_RETURN(const V* target, top("BUILD"));
        if (target->kind != K::kObject && target->kind != K::kDict)
          return fail("BUILD on a " + std::string(pickle_kind_name(target->kind)));
        mutable_value(target)->state = state;
        return Status::ok();
      }
      case 's': {
        TESSERA_ASSIGN_OR_RETURN(const V* value, pop());
        TESSERA_ASSIGN_OR_RETURN(const V* key, pop());
        TESSERA_ASSIGN_OR_RETURN(const V* dict, top("SETITEM"));
        return set_items(dict, {key, value});
      }
      case 'u': {
        TESSERA_ASSIGN_OR_RETURN(auto kv, pop_mark());
        TESSERA_ASSIGN_OR_RETURN(const V* dict, top("SETITEMS"));
        return set_items(dict, kv);
      }
      case 'a': {
        TESSERA_ASSIGN_OR_RETURN(const V* item, pop());
        TESSERA_ASSIGN_OR_RETURN(const V* list, top("APPEND"));
        return append(list, {item});
      }
      case 'e': {
        TESSERA_ASSIGN_OR_RETURN(auto items, pop_mark());
        TESSERA_ASSIGN_OR_RETURN(const V* list, top("APPENDS"));
        return append(list, items);
      }
      case 'Q': {  // BINPERSID: PyTorch's reference to a storage
        TESSERA_ASSIGN_OR_RETURN(const V* pid, pop());
        V* p = make(K::kPersistent);
        p->items = {pid};
        return push(p);
      }
      case '0': return pop().status();
      case '1': return pop_mark().status();
      case '2': {
        TESSERA_ASSIGN_OR_RETURN(const V* v, top("DUP"));
        return push(v);
      }
      default: break;
    }
    if (const char* name = refused_opcode_name(op)) {
      return invalid_argument(where_ + ": the pickle uses opcode " + name + " (" + hex_byte(op) + ") at byte " +
                              std::to_string(op_at_) + ", which torch.save of a state dict never emits; refused");
    }
    return data_loss(where_ + ": unknown pickle opcode " + hex_byte(op) + " at byte " + std::to_string(op_at_) +
                     " (not a pickle, or a damaged one)");
  }

  const char* data_;
  size_t size_;
  const PickleOptions& options_;
  const std::string& where_;
  std::unique_ptr<PickleDocument> doc_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<const V*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, const V*> memo_;
};

StatusOr<std::unique_ptr<PickleDocument>> read_pickle(const char* data, size_t size, const PickleOptions& options,
                                                      const std::string& where) {
  return PickleMachine(data, size, options, where).run();
}

}  // namespace tessera

// The pre-scan of pickle_scan.h: LibTorch's unpickler's stack machine (torch/csrc/jit/
// serialization/unpickler.cpp, readInstruction and readGlobal), run over placeholder values.
// Each opcode acts on the stack, the marks and the memo as LibTorch's does, so that what passes
// here is what LibTorch then builds; where LibTorch would read out of bounds, allocate what the
// file declares or recurse without limit, the scan refuses instead.
#include "kiln/io/pickle_scan.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <regex>
#include <set>

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include "kiln/io/input_file.h"

namespace kiln::io {

namespace {

enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kList, kDict, kTuple, kTensor };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "a bool";
    case Kind::kInt:
      return "an int";
    case Kind::kFloat:
      return "a float";
    case Kind::kStr:
      return "a string";
    case Kind::kList:
      return "a list";
    case Kind::kDict:
      return "a dict";
    case Kind::kTuple:
      return "a tuple";
    case Kind::kTensor:
      return "a tensor";
  }
  return "?";
}

// The globals a state dict needs (LibTorch's readGlobal registers these and pushes their index).
enum class Global : uint8_t { kRebuildTensor, kOrderedDict };

// A storage class of a plain dtype: torch.<Name>Storage, as LibTorch's readGlobal maps it (it
// pushes the ScalarType's value as an int; BINPERSID reads it back with toScalarType()).
struct StorageClass {
  const char* name;
  c10::ScalarType type;
};
constexpr StorageClass kStorageClasses[] = {
    {"ByteStorage", c10::ScalarType::Byte},   {"CharStorage", c10::ScalarType::Char},
    {"ShortStorage", c10::ScalarType::Short}, {"IntStorage", c10::ScalarType::Int},
    {"LongStorage", c10::ScalarType::Long},   {"HalfStorage", c10::ScalarType::Half},
    {"FloatStorage", c10::ScalarType::Float}, {"DoubleStorage", c10::ScalarType::Double},
    {"BoolStorage", c10::ScalarType::Bool},   {"BFloat16Storage", c10::ScalarType::BFloat16},
};

const StorageClass* storage_class_of_type(int64_t v) {
  for (const auto& c : kStorageClasses) {
    if (static_cast<int64_t>(c.type) == v) return &c;
  }
  return nullptr;
}

struct Node {
  Kind kind = Kind::kNone;
  int64_t i = 0;                // kInt, kBool
  std::string s;                // kStr
  std::vector<uint32_t> items;  // kList, kTuple: elements; kDict: keys and values
};

class Scanner {
 public:
  Scanner(const uint8_t* data, size_t size, const std::function<std::optional<uint64_t>(const std::string&)>& record,
          const std::string& file, const PickleLimits& limits)
      : p_(data), size_(size), record_(record), file_(file), limits_(limits) {}

  PickleScan run() {
    op_at_ = 0;
    if (size_ < 2 || p_[0] != 0x80)
      fail("the PROTO opcode (0x80) first", size_ == 0 ? "an empty pickle" : "another opcode");
    if (p_[1] != 2) fail("pickle protocol 2 (torch.save's)", fmt::format("protocol {}", p_[1]));
    pos_ = 2;
    while (true) {
      op_at_ = pos_;
      const uint8_t op = byte();
      if (op == '.') break;  // STOP
      step(op);
    }
    PickleScan out;
    out.depth = check_graph();  // (the values left on the stack included)
    op_at_ = pos_ - 1;
    if (stack_.size() != 1) fail("one value on the stack at STOP", fmt::format("{}", stack_.size()));
    out.storage_keys.assign(keys_.begin(), keys_.end());
    out.nodes = nodes_.size();
    out.containers = containers_;
    out.tensors = tensors_;
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& expected, const std::string& found) const {
    refuse(file_, fmt::format("data.pkl, byte {}", op_at_), expected, found);
  }

  // ---- input
  void need(size_t n) {
    if (n > size_ - pos_) fail(fmt::format("{} more bytes", n), fmt::format("{} left in the pickle", size_ - pos_));
  }
  uint8_t byte() {
    need(1);
    return p_[pos_++];
  }
  template <typename T>
  T little() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string line() {
    constexpr size_t kMaxName = 256;
    const void* nl = std::memchr(p_ + pos_, '\n', std::min(size_ - pos_, kMaxName + 1));
    if (nl == nullptr) fail("a name of at most 256 characters ending in a line break", "none");
    const size_t n = static_cast<const uint8_t*>(nl) - (p_ + pos_);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n + 1;
    return s;
  }

  // ---- values
  uint32_t make(Kind k) {
    if (nodes_.size() >= limits_.max_nodes) fail(fmt::format("at most {} values", limits_.max_nodes), "more");
    if (k == Kind::kList || k == Kind::kDict || k == Kind::kTuple) {
      if (++containers_ > limits_.max_containers)
        fail(fmt::format("at most {} containers", limits_.max_containers), "more");
    }
    if (k == Kind::kTensor && ++tensors_ > limits_.max_tensors)
      fail(fmt::format("at most {} tensors", limits_.max_tensors), "more");
    nodes_.push_back(Node{k, 0, {}, {}});
    return static_cast<uint32_t>(nodes_.size() - 1);
  }
  void push_new(Kind k, int64_t i = 0) {
    const uint32_t id = make(k);
    nodes_[id].i = i;
    push(id);
  }
  void push(uint32_t id) {
    if (stack_.size() >= limits_.max_nodes)
      fail(fmt::format("at most {} values on the stack", limits_.max_nodes), "more");
    stack_.push_back(id);
  }
  // The lowest stack position an opcode may pop to: its innermost MARK (LibTorch's marks index the
  // stack unchecked; Python's unpickler cannot pop below one either).
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void need_stack(size_t n) {
    if (stack_.size() < floor() + n)
      fail(fmt::format("{} values on the stack above its last MARK", n), fmt::format("{}", stack_.size() - floor()));
  }
  uint32_t pop() {
    need_stack(1);
    const uint32_t id = stack_.back();
    stack_.pop_back();
    return id;
  }
  size_t pop_mark() {
    if (marks_.empty()) fail("a MARK before this opcode", "none");
    const size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }
  Node& node(uint32_t id) { return nodes_[id]; }
  Node& expect(uint32_t id, Kind k, const char* role) {
    if (nodes_[id].kind != k) fail(fmt::format("{} as {}", kind_name(k), role), kind_name(nodes_[id].kind));
    return nodes_[id];
  }
  void check_key(uint32_t id) {
    const Kind k = nodes_[id].kind;
    if (k != Kind::kStr && k != Kind::kInt && k != Kind::kFloat && k != Kind::kBool && k != Kind::kNone)
      fail("a dict key of str, int, float, bool or None", kind_name(k));
  }
  // A new container of kind k holding the stack's items from `start` on, in their place.
  void collect(Kind k, size_t start) {
    const uint32_t id = make(k);
    nodes_[id].items.assign(stack_.begin() + static_cast<std::ptrdiff_t>(start), stack_.end());
    stack_.resize(start);
    push(id);
  }
  void add_pairs(uint32_t dict, size_t start) {
    if ((stack_.size() - start) % 2 != 0)
      fail("keys and values in pairs", fmt::format("{} items", stack_.size() - start));
    Node& d = expect(dict, Kind::kDict, "the target of SETITEMS/DICT");
    for (size_t i = start; i < stack_.size(); i += 2) {
      check_key(stack_[i]);
      d.items.push_back(stack_[i]);
      d.items.push_back(stack_[i + 1]);
    }
    stack_.resize(start);
  }

  // ---- memo
  void put(size_t id) {
    if (stack_.empty()) fail("a value to memoize", "an empty stack");
    if (id > memo_.size())
      fail(fmt::format("a memo index at most {} (the next free one)", memo_.size()), fmt::format("{}", id));
    if (id == memo_.size()) {
      if (memo_.size() >= limits_.max_nodes) fail(fmt::format("at most {} memo entries", limits_.max_nodes), "more");
      memo_.push_back(stack_.back());
    } else {
      memo_[id] = stack_.back();
    }
  }
  void get(size_t id) {
    if (id >= memo_.size()) fail(fmt::format("a memo index below {}", memo_.size()), fmt::format("{}", id));
    push(memo_[id]);
  }

  // ---- opcodes
  void step(uint8_t op) {
    switch (op) {
      case '(':  // MARK
        if (marks_.size() >= static_cast<size_t>(limits_.max_depth))
          fail(fmt::format("at most {} open MARKs", limits_.max_depth), "more");
        marks_.push_back(stack_.size());
        break;
      case ']':  // EMPTY_LIST
        push_new(Kind::kList);
        break;
      case '}':  // EMPTY_DICT
        push_new(Kind::kDict);
        break;
      case ')':  // EMPTY_TUPLE (LibTorch shares one)
        if (empty_tuple_ < 0) empty_tuple_ = make(Kind::kTuple);
        push(static_cast<uint32_t>(empty_tuple_));
        break;
      case 'N':
        push_new(Kind::kNone);
        break;
      case 0x88:  // NEWTRUE
        push_new(Kind::kBool, 1);
        break;
      case 0x89:  // NEWFALSE
        push_new(Kind::kBool, 0);
        break;
      case 'K':
        push_new(Kind::kInt, little<uint8_t>());
        break;
      case 'M':
        push_new(Kind::kInt, little<uint16_t>());
        break;
      case 'J':
        push_new(Kind::kInt, little<int32_t>());
        break;
      case 0x8a: {  // LONG1: LibTorch reads only the 8-byte form
        const uint8_t n = byte();
        if (n != 8) fail("LONG1 of 8 bytes (what LibTorch reads)", fmt::format("{} bytes", n));
        push_new(Kind::kInt, little<int64_t>());
        break;
      }
      case 'G':  // BINFLOAT
        need(8);
        pos_ += 8;
        push_new(Kind::kFloat);
        break;
      case 'X': {  // BINUNICODE
        const uint32_t n = little<uint32_t>();
        need(n);
        const uint32_t id = make(Kind::kStr);
        nodes_[id].s.assign(reinterpret_cast<const char*>(p_ + pos_), n);
        pos_ += n;
        push(id);
        break;
      }
      case 'q':
        put(little<uint8_t>());
        break;
      case 'r':
        put(little<uint32_t>());
        break;
      case 'h':
        get(little<uint8_t>());
        break;
      case 'j':
        get(little<uint32_t>());
        break;
      case 't':  // TUPLE
        collect(Kind::kTuple, pop_mark());
        break;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const size_t n = op - 0x84u;
        need_stack(n);
        collect(Kind::kTuple, stack_.size() - n);
        break;
      }
      case 'l':  // LIST
        collect(Kind::kList, pop_mark());
        break;
      case 'd': {  // DICT
        const size_t start = pop_mark();
        const uint32_t id = make(Kind::kDict);
        add_pairs(id, start);
        push(id);
        break;
      }
      case 'a': {  // APPEND
        need_stack(2);
        const uint32_t v = stack_.back();
        expect(stack_[stack_.size() - 2], Kind::kList, "the target of APPEND").items.push_back(v);
        stack_.pop_back();
        break;
      }
      case 'e': {  // APPENDS: the list sits just below the MARK
        const size_t start = pop_mark();
        if (start < 1 + floor()) fail("a list below the MARK of APPENDS", "nothing above the MARK before it");
        Node& list = expect(stack_[start - 1], Kind::kList, "the target of APPENDS");
        list.items.insert(list.items.end(), stack_.begin() + static_cast<std::ptrdiff_t>(start), stack_.end());
        stack_.resize(start);
        break;
      }
      case 's': {  // SETITEM
        need_stack(3);
        const uint32_t v = stack_[stack_.size() - 1], k = stack_[stack_.size() - 2];
        check_key(k);
        Node& d = expect(stack_[stack_.size() - 3], Kind::kDict, "the target of SETITEM");
        d.items.push_back(k);
        d.items.push_back(v);
        stack_.resize(stack_.size() - 2);
        break;
      }
      case 'u': {  // SETITEMS: the dict sits just below the MARK
        const size_t start = pop_mark();
        if (start < 1 + floor()) fail("a dict below the MARK of SETITEMS", "nothing above the MARK before it");
        add_pairs(stack_[start - 1], start);
        break;
      }
      case 'c': {  // GLOBAL: module, then name (one line each)
        const std::string module = line();
        global(module, line());
        break;
      }
      case 'R':  // REDUCE
        reduce();
        break;
      case 'Q':  // BINPERSID
        persistent_id();
        break;
      default:
        fail("an opcode of a torch.save state dict (protocol 2: containers, numbers, strings, memo, tensors)",
             fmt::format("opcode 0x{:02x}{}", op,
                         op >= 0x20 && op < 0x7f ? fmt::format(" ('{}')", static_cast<char>(op)) : std::string()));
    }
  }

  void global(const std::string& module, const std::string& name) {
    if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      globals_.push_back(Global::kRebuildTensor);
      push_new(Kind::kInt, static_cast<int64_t>(globals_.size() - 1));
      return;
    }
    if (module == "collections" && name == "OrderedDict") {
      globals_.push_back(Global::kOrderedDict);
      push_new(Kind::kInt, static_cast<int64_t>(globals_.size() - 1));
      return;
    }
    if (module == "torch") {
      for (const auto& c : kStorageClasses) {
        if (name == c.name) {
          push_new(Kind::kInt, static_cast<int64_t>(c.type));
          return;
        }
      }
    }
    fail(
        "a global of a state dict (torch._utils._rebuild_tensor_v2, collections.OrderedDict, a torch storage class "
        "of a plain dtype)",
        fmt::format("{}.{}", module, name));
  }

  void reduce() {
    need_stack(2);
    const uint32_t arg = stack_.back();
    const Node& fn = expect(stack_[stack_.size() - 2], Kind::kInt, "the callable of REDUCE (a global)");
    if (fn.i < 0 || static_cast<size_t>(fn.i) >= globals_.size())
      fail(fmt::format("a global index below {}", globals_.size()), fmt::format("{}", fn.i));
    const Global g = globals_[static_cast<size_t>(fn.i)];
    stack_.resize(stack_.size() - 2);
    if (g == Global::kOrderedDict) {  // LibTorch replaces the argument with None
      push_new(Kind::kNone);
      return;
    }
    // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
    const Node& args = expect(arg, Kind::kTuple, "the arguments of _rebuild_tensor_v2");
    if (args.items.size() != 6 && args.items.size() != 7)
      fail("6 or 7 arguments to _rebuild_tensor_v2", fmt::format("{}", args.items.size()));
    const std::vector<uint32_t> a = args.items;
    expect(a[0], Kind::kTensor, "the storage of _rebuild_tensor_v2");
    expect(a[1], Kind::kInt, "the storage offset");
    const Node& sizes = expect(a[2], Kind::kTuple, "the sizes");
    const Node& strides = expect(a[3], Kind::kTuple, "the strides");
    if (sizes.items.size() != strides.items.size() || sizes.items.size() > 64)
      fail("as many sizes as strides (at most 64)", fmt::format("{} and {}", sizes.items.size(), strides.items.size()));
    for (const uint32_t s : sizes.items) expect(s, Kind::kInt, "a size");
    for (const uint32_t s : strides.items) expect(s, Kind::kInt, "a stride");
    expect(a[4], Kind::kBool, "requires_grad");
    if (a.size() == 7 && !expect(a[6], Kind::kDict, "the tensor's metadata").items.empty())
      fail("no tensor metadata (conjugate or negative bits)", "some");
    push_new(Kind::kTensor);
  }

  void persistent_id() {
    const uint32_t id = pop();
    const Node& t = expect(id, Kind::kTuple, "the persistent id of a storage");
    if (t.items.size() != 5) fail("('storage', class, key, location, numel)", fmt::format("{} items", t.items.size()));
    const std::vector<uint32_t> a = t.items;
    if (expect(a[0], Kind::kStr, "the persistent id's kind").s != "storage")
      fail("the persistent id 'storage'", fmt::format("'{}'", nodes_[a[0]].s.substr(0, 40)));
    const StorageClass* cls = storage_class_of_type(expect(a[1], Kind::kInt, "the storage class").i);
    if (cls == nullptr) fail("a storage class of a plain dtype", fmt::format("scalar type {}", nodes_[a[1]].i));
    const std::string key = expect(a[2], Kind::kStr, "the storage key").s;
    static const std::regex location("cpu|cuda(:[0-9]{1,3})?");
    const std::string& loc = expect(a[3], Kind::kStr, "the storage location").s;
    if (!std::regex_match(loc, location))
      fail("the location 'cpu' or 'cuda[:N]'", fmt::format("'{}'", loc.substr(0, 40)));
    const int64_t numel = expect(a[4], Kind::kInt, "the storage's element count").i;
    const std::optional<uint64_t> bytes = key.size() <= 64 ? record_(key) : std::nullopt;
    if (!bytes) fail(fmt::format("a record data/{} in the archive", key.substr(0, 64)), "none");
    const uint64_t item = c10::elementSize(cls->type);
    if (numel < 0 || static_cast<uint64_t>(numel) > *bytes / item) {
      fail(fmt::format("a storage within its record data/{} ({} bytes)", key, *bytes),
           fmt::format("{} elements of {} bytes", numel, item));
    }
    keys_.insert(key);
    push_new(Kind::kTensor);
  }

  // Every value's nesting height, by a depth-first walk over the whole graph (memo and unreachable
  // values included: LibTorch frees them too, recursively); a cycle is refused (LibTorch's
  // reference counts would never free it).
  int check_graph() {
    enum : uint8_t { kNew, kOpen, kDone };
    std::vector<uint8_t> state(nodes_.size(), kNew);
    std::vector<int> height(nodes_.size(), 0);
    struct Frame {
      uint32_t id;
      size_t next;
    };
    std::vector<Frame> walk;
    int deepest = 0;
    for (uint32_t root = 0; root < nodes_.size(); ++root) {
      if (state[root] != kNew) continue;
      walk.push_back({root, 0});
      state[root] = kOpen;
      while (!walk.empty()) {
        Frame& f = walk.back();
        const std::vector<uint32_t>& items = nodes_[f.id].items;
        if (f.next < items.size()) {
          const uint32_t c = items[f.next++];
          if (state[c] == kOpen) {
            op_at_ = size_;
            fail("values that do not contain themselves",
                 fmt::format("{} that contains itself", kind_name(nodes_[c].kind)));
          }
          if (state[c] == kNew) {
            state[c] = kOpen;
            walk.push_back({c, 0});
          }
          continue;
        }
        int h = 0;
        for (const uint32_t c : items) h = std::max(h, height[c] + 1);
        height[f.id] = h;
        state[f.id] = kDone;
        deepest = std::max(deepest, h);
        if (h > limits_.max_depth) {
          op_at_ = size_;
          fail(fmt::format("values nested at most {} deep", limits_.max_depth), fmt::format("at least {} levels", h));
        }
        walk.pop_back();
      }
    }
    return deepest;
  }

  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0, op_at_ = 0;
  const std::function<std::optional<uint64_t>(const std::string&)>& record_;
  const std::string& file_;
  const PickleLimits& limits_;
  std::vector<Node> nodes_;
  std::vector<uint32_t> stack_, memo_;
  std::vector<size_t> marks_;
  std::vector<Global> globals_;
  std::set<std::string> keys_;
  int64_t empty_tuple_ = -1;
  size_t containers_ = 0, tensors_ = 0;
};

}  // namespace

PickleScan scan_torch_pickle(const uint8_t* data, size_t size,
                             const std::function<std::optional<uint64_t>(const std::string&)>& record_bytes,
                             const std::string& file, const PickleLimits& limits) {
  return Scanner(data, size, record_bytes, file, limits).run();
}

}  // namespace kiln::io

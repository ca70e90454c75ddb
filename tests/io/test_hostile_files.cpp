// Files that someone else wrote, as an attacker would write them (docs/formats.md, "Hostile
// files"): the pickle pre-scan (io/pickle_scan.h) on pickles assembled opcode by opcode from the
// pickle protocol's definition (Python's pickletools lists the same opcodes), torch.save archives
// assembled with LibTorch's own PyTorchStreamWriter around such pickles, and the bounded file
// and JSON readers (io/input_file.h). Each refusal is one io::InputError line naming the file
// and what was expected and found; the reproducers of issue #49 are here by name.
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/io/input_file.h"
#include "kiln/io/pickle_scan.h"
#include "kiln/io/torch_pickle.h"
#include "support.h"

namespace fs = std::filesystem;
using kiln::test::error_of;

namespace {

// A pickle, opcode by opcode.
struct Pickle {
  std::string b = "\x80\x02";  // PROTO 2
  Pickle& op(char c) {
    b += c;
    return *this;
  }
  Pickle& raw(const std::string& s) {
    b += s;
    return *this;
  }
  Pickle& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  Pickle& str(const std::string& s) { return op('X').u32(static_cast<uint32_t>(s.size())).raw(s); }
  Pickle& int1(uint8_t v) { return op('K').raw(std::string(1, static_cast<char>(v))); }
  Pickle& int4(int32_t v) { return op('J').u32(static_cast<uint32_t>(v)); }
  Pickle& global(const std::string& module, const std::string& name) {
    return op('c').raw(module + "\n" + name + "\n");
  }
  Pickle& put(uint8_t id) { return op('q').raw(std::string(1, static_cast<char>(id))); }
  Pickle& get(uint8_t id) { return op('h').raw(std::string(1, static_cast<char>(id))); }
  // torch._utils._rebuild_tensor_v2(<storage "0" of `numel` floats>, offset, (n,), (1,), False, OrderedDict())
  Pickle& tensor(int32_t offset, int32_t n, int32_t numel = 4, const std::string& key = "0") {
    global("torch._utils", "_rebuild_tensor_v2").op('(');
    op('(').str("storage").global("torch", "FloatStorage").str(key).str("cpu").int4(numel).op('t').op('Q');
    int4(offset).int4(n).op('\x85').int1(1).op('\x85').op('\x89');
    global("collections", "OrderedDict").op(')').op('R');
    return op('t').op('R');
  }
  std::string stop() const { return b + "."; }
};

std::optional<uint64_t> records(const std::string& key) {
  if (key == "0") return 16;  // 4 floats
  if (key == "empty") return 0;
  return std::nullopt;
}

std::string scan_error(const std::string& pickle) {
  return error_of([&] {
    kiln::io::scan_torch_pickle(reinterpret_cast<const uint8_t*>(pickle.data()), pickle.size(), records, "x.pt");
  });
}

// A torch.save archive around `pickle`, with a record data/0 of `bytes` bytes (floats 0, 1, 2, ...).
fs::path archive(const std::string& name, const std::string& pickle, size_t bytes = 16) {
  const fs::path path = kiln::test::scratch_dir("hostile_" + name) / (name + ".pt");
  std::ofstream out(path, std::ios::binary);
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) -> size_t {
    out.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  std::vector<float> data(bytes / 4 + 1);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  writer.writeRecord("data/0", data.data(), bytes);
  writer.writeEndOfFile();
  return path;
}

}  // namespace

TEST_CASE("the pickle pre-scan passes a state dict and counts it", "[io][hostile]") {
  // {"a": 1, "b": [2.5, None, True], "c": (x, x)} with x memoized: a DAG, not a cycle.
  Pickle p;
  p.op('}').put(0).op('(').str("a").int1(1).str("b").op(']').put(1).op('(').op('G').raw(std::string(8, '\0'));
  p.op('N').op('\x88').op('e').str("c").op('(').op(')').put(2).get(2).op('t').op('u');
  const std::string pickle = p.stop();
  const kiln::io::PickleScan s =
      kiln::io::scan_torch_pickle(reinterpret_cast<const uint8_t*>(pickle.data()), pickle.size(), records, "x.pt");
  CHECK(s.depth == 2);  // dict -> list -> float
  CHECK(s.storage_keys.empty());
  CHECK(s.containers == 4);  // the dict, the list, the empty tuple (shared) and the 2-tuple
}

TEST_CASE("the pickle pre-scan refuses what would exhaust memory, overflow the stack or leak", "[io][hostile]") {
  using Catch::Matchers::Contains;
  // Issue #49: a 10-byte data.pkl whose LONG_BINPUT 0x12000000 made LibTorch size its memo at 5 GB.
  CHECK_THAT(scan_error(Pickle().op('N').op('r').u32(0x12000000).stop()),
             Contains("x.pt: data.pkl, byte 3: expected a memo index at most 0") && Contains("found 301989888"));
  // A BINUNICODE declaring 4 GB (LibTorch allocated 4.5 GB before reading it).
  CHECK_THAT(scan_error(Pickle().op('X').u32(0xffffffffu).raw("abc").stop()),
             Contains("expected 4294967295 more bytes"));
  // 10^6 nested lists (the stack overflowed in ListImpl's destructor): refused at once.
  {
    Pickle deep;
    for (int i = 0; i < 1000000; ++i) deep.op(']');
    for (int i = 0; i < 999999; ++i) deep.op('a');
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THAT(scan_error(deep.stop()), Contains("values nested at most 32 deep"));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  }
  // Nesting built through the memo with a shallow stack.
  {
    Pickle memo;
    memo.op(']').put(0);
    for (int i = 0; i < 40; ++i) memo.op(']').get(0).op('a').put(0);
    CHECK_THAT(scan_error(memo.stop()), Contains("nested at most 32 deep"));
  }
  // A list that contains itself: reference counts never free it.
  CHECK_THAT(scan_error(Pickle().op(']').put(0).get(0).op('a').stop()), Contains("a list that contains itself"));
  // Pops below a MARK (LibTorch indexes its stack from the MARK unchecked).
  CHECK_THAT(scan_error(Pickle().op(']').op('(').op('N').op('a').stop()), Contains("above its last MARK"));
  CHECK_THAT(scan_error(Pickle().op('}').op('(').int1(1).op('u').stop()), Contains("keys and values in pairs"));
  CHECK_THAT(scan_error(Pickle().op('}').op(']').int1(1).op('s').stop()), Contains("a dict key of str"));
  CHECK_THAT(scan_error(Pickle().op('N').op('N').stop()), Contains("one value on the stack at STOP"));
  CHECK_THAT(scan_error(Pickle().raw("\x80\x04").stop().substr(2)), Contains("pickle protocol 2"));
}

TEST_CASE("the pickle pre-scan refuses code and the globals a state dict does not hold", "[io][hostile]") {
  using Catch::Matchers::Contains;
  CHECK_THAT(scan_error(Pickle().global("os", "system").str("id").op('\x85').op('R').stop()),
             Contains("found os.system"));
  CHECK_THAT(scan_error(Pickle().global("torch._utils", "_rebuild_sparse_tensor").stop()),
             Contains("found torch._utils._rebuild_sparse_tensor"));
  CHECK_THAT(scan_error(Pickle().global("builtins", "eval").stop()), Contains("builtins.eval"));
  // An int used as a global's index: LibTorch would call globals_[5].
  CHECK_THAT(scan_error(Pickle().int1(5).op(')').op('R').stop()), Contains("a global index below 0"));
  // BUILD, NEWOBJ, INST, protocol-4 opcodes.
  for (const char op : {'b', '\x81', 'i', '\x93', '\x95'}) {
    CAPTURE(static_cast<int>(static_cast<uint8_t>(op)));
    CHECK_THAT(scan_error(Pickle().op('N').op(op).stop()), Contains("an opcode of a torch.save state dict"));
  }
}

TEST_CASE("the pickle pre-scan holds every storage to its record", "[io][hostile]") {
  using Catch::Matchers::Contains;
  CHECK(scan_error(Pickle().tensor(0, 4).stop()).empty());
  // Issue #49: numel 2^40 over a record of 16 bytes; a record cut to 0 bytes; a missing record.
  Pickle big;
  big.global("torch._utils", "_rebuild_tensor_v2").op('(').op('(').str("storage").global("torch", "FloatStorage");
  big.str("0")
      .str("cpu")
      .op('\x8a')
      .raw(std::string(1, '\x08'))
      .raw(std::string("\x00\x00\x00\x00\x00\x01\x00\x00", 8));
  CHECK_THAT(scan_error(big.op('t').op('Q').stop()),
             Contains("expected a storage within its record data/0 (16 bytes), found 1099511627776 elements"));
  CHECK_THAT(scan_error(Pickle().tensor(0, 4, 4, "empty").stop()), Contains("found 4 elements of 4 bytes"));
  CHECK_THAT(scan_error(Pickle().tensor(0, 4, 4, "7").stop()), Contains("expected a record data/7 in the archive"));
}

TEST_CASE("a torch.save file's tensors must lie within their records", "[io][hostile]") {
  using Catch::Matchers::Contains;
  // The whole record: loads, with the record's values.
  const c10::IValue ok = kiln::io::load_torch_pickle(archive("ok", Pickle().tensor(0, 4).stop()).string());
  CHECK(at::equal(ok.toTensor(), at::arange(4, at::kFloat)));
  CHECK(at::equal(kiln::io::load_torch_pickle(archive("view", Pickle().tensor(1, 3).stop()).string()).toTensor(),
                  at::arange(1, 4, at::kFloat)));
  // Issue #49: offsets -1 and -40960 loaded with exit 0 and heap bytes in exp_avg; a view past the end.
  for (const int32_t offset : {-1, -40960}) {
    CAPTURE(offset);
    const fs::path f = archive("offset", Pickle().tensor(offset, 4).stop());
    CHECK_THAT(error_of([&] { kiln::io::load_torch_pickle(f.string()); }),
               Contains(f.string() + ": (the top level): expected a storage offset >= 0"));
  }
  const fs::path past = archive("past", Pickle().tensor(2, 4).stop());
  CHECK_THAT(error_of([&] { kiln::io::load_torch_pickle(past.string()); }),
             Contains("expected a view within its storage of 16 bytes"));
  // A record cut short (8 of the 16 bytes the pickle declares): refused before LibTorch reads it.
  const fs::path cut = archive("cut", Pickle().tensor(0, 4).stop(), 8);
  CHECK_THAT(error_of([&] { kiln::io::load_torch_pickle(cut.string()); }),
             Contains("expected a storage within its record data/0 (8 bytes)"));
  // The path of a bad tensor inside a dict names it.
  Pickle in_dict;
  in_dict.op('}').str("state").op('}').int1(3).op('}').str("exp_avg");
  in_dict.tensor(-1, 4).op('s').op('s').op('s');
  const fs::path nested = archive("nested", in_dict.stop());
  CHECK_THAT(error_of([&] { kiln::io::load_torch_pickle(nested.string()); }),
             Contains(": state[3].exp_avg: expected a storage offset >= 0, found -1"));
}

TEST_CASE("input files: regular files only, bounded, never a blocking open", "[io][hostile]") {
  using Catch::Matchers::Contains;
  const fs::path dir = kiln::test::scratch_dir("hostile_files");
  // Issue #49: a FIFO in place of a checkpoint file blocked in open() forever.
  const fs::path fifo = dir / "trainer_state.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THAT(error_of([&] { kiln::io::read_json_file(fifo.string()); }),
             Contains(fifo.string() + ": expected a regular file, found a FIFO"));
  CHECK_THAT(error_of([&] { kiln::io::load_torch_pickle(fifo.string()); }), Contains("found a FIFO"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  // trainer_state.json linked to /dev/zero read until bad_alloc.
  fs::create_symlink("/dev/zero", dir / "zero.json");
  CHECK_THAT(error_of([&] { kiln::io::read_json_file((dir / "zero.json").string()); }),
             Contains("found a character device"));
  CHECK_THAT(error_of([&] { kiln::io::read_json_file(dir.string()); }), Contains("found a directory"));
  std::ofstream(dir / "big.json") << std::string(100, ' ');
  CHECK_THAT(error_of([&] { kiln::io::read_input_file((dir / "big.json").string(), 99); }),
             Contains("expected at most 99 bytes, found 100"));
  CHECK_THAT(error_of([&] { kiln::io::read_json_file((dir / "missing.json").string()); }),
             Contains("missing.json: expected a readable file, found No such file or directory"));
}

TEST_CASE("JSON: nesting limited, integers exact, one message shape", "[io][hostile]") {
  using Catch::Matchers::Contains;
  using nlohmann::json;
  // Issue #49: a 10^6-deep log_history overflowed the stack in the JSON copy.
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  CHECK_THAT(error_of([&] { kiln::io::parse_json(deep, "t.json"); }),
             Contains("t.json: expected JSON nested at most 64 levels deep"));
  CHECK(kiln::io::parse_json(std::string(60, '[') + std::string(60, ']'), "t.json").is_array());
  CHECK_THAT(error_of([&] { kiln::io::parse_json("{\"a\": ", "t.json"); }),
             Contains("t.json: expected valid JSON, found"));
  const auto integer = [](const std::string& text) {
    return error_of([&] { kiln::io::json_integer(json::parse(text), "t.json", "global_step", 0, int64_t{1} << 53); });
  };
  CHECK(integer("4").empty());
  CHECK_THAT(integer("4.5"),
             Contains("t.json: global_step: expected an integer in [0, 9007199254740992], found the number 4.5"));
  CHECK_THAT(integer("4.0"), Contains("found the number 4.0"));
  CHECK_THAT(integer("18446744073709551616"), Contains("found the number"));  // 2^64
  CHECK_THAT(integer("18446744073709551615"), Contains("found the number 18446744073709551615"));
  CHECK_THAT(integer("-1"), Contains("found the number -1"));
  CHECK_THAT(integer("\"4\""), Contains("found the string \"4\""));
  CHECK_THAT(error_of([&] {
               kiln::io::json_number(json(std::numeric_limits<double>::infinity()), "t.json", "total_flos", 0, 1e300);
             }),
             Contains("expected a finite number"));
  CHECK_THAT(error_of([&] { kiln::io::json_field(json::parse("[]"), "global_step", "t.json"); }),
             Contains("t.json: expected a JSON object, found an array of 0"));
  CHECK_THAT(error_of([&] { kiln::io::json_field(json::parse("{}"), "global_step", "t.json"); }),
             Contains("t.json: global_step: expected a value, found no such key"));
}

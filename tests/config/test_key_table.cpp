// The key-table mechanism every program's settings go through (config/key_table.h): a table read
// from YAML and from command-line overrides alike, with one rule for unknown, repeated and
// contradictory keys. Reference: the rules as key_table.h states them, on a small struct.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/config/key_table.h"
#include "support.h"

using Catch::Matchers::Contains;
using kiln::config::ConfigReader;
using kiln::config::parse_overrides;
using kiln::test::error_of;
using Pairs = std::vector<std::pair<std::string, std::string>>;

namespace {

struct Settings {
  std::string name = "x";
  int64_t steps = 3;
  double rate = 0.5;
  bool fast = false;
  std::vector<int64_t> sizes{1};
  std::vector<std::string> formats{"md"};
};

const kiln::config::KeyTable<Settings>& table() {
  static const kiln::config::KeyTable<Settings> t = {
      {"name", &Settings::name, "a name"},  {"steps", &Settings::steps}, {"rate", &Settings::rate},
      {"fast", &Settings::fast, "go fast"}, {"sizes", &Settings::sizes}, {"format", &Settings::formats},
  };
  return t;
}

Settings read(ConfigReader r) {
  Settings s;
  kiln::config::read_keys(r, s, table());
  r.finish("see --help");
  return s;
}

Settings from_yaml(const std::string& text) {
  return read(ConfigReader::from_string(text, "f.yaml"));
}

Settings from_cli(const std::vector<std::string>& args, const kiln::config::Spelling& spelling = {}) {
  return read(kiln::config::overrides_reader(parse_overrides(args, spelling)));
}

}  // namespace

TEST_CASE("a table reads the same values from a YAML file and from the command line", "[config]") {
  const Settings f = from_yaml("name: run\nsteps: 1e3\nrate: 2.5\nfast: true\nsizes: [16, 64]\nformat: md,csv\n");
  const Settings c = from_cli(
      {"--name", "run", "--steps=1_000", "--rate", "2.5", "--fast", "true", "--sizes", "16,64", "--format", "md,csv"});
  for (const Settings& s : {f, c}) {
    CHECK(s.name == "run");
    CHECK(s.steps == 1000);
    CHECK(s.rate == 2.5);
    CHECK(s.fast);
    CHECK(s.sizes == std::vector<int64_t>{16, 64});
    CHECK(s.formats == std::vector<std::string>{"md", "csv"});
  }
  // A list written as one scalar in YAML reads as one item; an absent key keeps its default.
  CHECK(from_yaml("sizes: 128\n").sizes == std::vector<int64_t>{128});
  CHECK(from_yaml("sizes: []\n").sizes.empty());
  CHECK(from_yaml("name: y\n").sizes == std::vector<int64_t>{1});
}

TEST_CASE("unknown, repeated and bad keys: one rule, naming the source and the key", "[config]") {
  // Unknown: in the file and on the command line, with the caller's hint.
  CHECK_THAT(error_of([] { from_yaml("nmae: y\n"); }),
             Contains("f.yaml: key 'nmae': unknown key") && Contains("; see --help"));
  CHECK_THAT(error_of([] {
               from_cli({"--nmae", "y"});
             }),
             Contains("command line: key 'nmae': unknown key") && Contains("; see --help"));
  // Repeated: an error in a file; on the command line the last wins (argparse's rule).
  CHECK_THAT(error_of([] { from_yaml("steps: 1\nsteps: 2\n"); }),
             Contains("f.yaml: key 'steps'") && Contains("more than once"));
  CHECK(from_cli({"--steps", "1", "--name", "a", "--steps=2"}).steps == 2);
  // A bad value: the same words from either source.
  CHECK_THAT(error_of([] { from_yaml("sizes: [16, abc]\n"); }),
             Contains("f.yaml: key 'sizes': expected a list of integers") && Contains("'abc'"));
  CHECK_THAT(error_of([] {
               from_cli({"--sizes", "64,abc"});
             }),
             Contains("command line: key 'sizes': expected a list of integers") && Contains("'abc' in '64,abc'"));
  CHECK_THAT(error_of([] { from_cli({"--sizes", "64,"}); }), Contains("got '' in '64,'"));
  CHECK_THAT(error_of([] { from_yaml("sizes: [[1]]\n"); }), Contains("key 'sizes'") && Contains("nested"));
  CHECK_THAT(error_of([] {
               from_cli({"--fast", "sometimes"});
             }),
             Contains("command line: key 'fast': expected true or false, got 'sometimes'"));
  // The command line's own mistakes.
  CHECK_THAT(error_of([] { parse_overrides({"--steps"}); }), Contains("key 'steps': missing value"));
  CHECK_THAT(error_of([] { parse_overrides({"--steps", "1", "stray"}); }), Contains("unexpected argument 'stray'"));
}

TEST_CASE("a program's spelling: kebab case, aliases, switches", "[config]") {
  kiln::config::Spelling spelling;
  spelling.kebab_case = true;
  spelling.aliases = {{"n", "name", std::nullopt}, {"slow", "fast", "false"}};
  spelling.switches = kiln::config::boolean_keys(table());
  CHECK(spelling.switches == std::vector<std::string>{"fast"});
  CHECK(parse_overrides({"--n", "a", "--fast", "--sizes", "2"}, spelling) ==
        Pairs{{"name", "a"}, {"fast", "true"}, {"sizes", "2"}});
  CHECK(parse_overrides({"--fast", "false", "--slow"}, spelling) == Pairs{{"fast", "false"}, {"fast", "false"}});
  CHECK(parse_overrides({"--steps", "1", "--fast"}, spelling) == Pairs{{"steps", "1"}, {"fast", "true"}});
  CHECK(parse_overrides({"--some-key=1"}, spelling) == Pairs{{"some_key", "1"}});
  CHECK_THAT(error_of([&] { parse_overrides({"--slow=true"}, spelling); }), Contains("--slow takes no value"));
  // Without the spelling (kiln-pretrain's): a key is taken as written and always takes a value.
  CHECK(parse_overrides({"--some-key", "1", "--fast", "--x"}) == Pairs{{"some-key", "1"}, {"fast", "--x"}});
  // --help's list: each key with its kind of value and its line.
  const std::string help = kiln::config::keys_help(kiln::config::key_docs(table()));
  CHECK_THAT(help, Contains("--name TEXT") && Contains("a name") && Contains("--fast [true|false]") &&
                       Contains("go fast") && Contains("--sizes N,N,...") && Contains("--format A,B,..."));
}

TEST_CASE("select_keys takes another table's keys by name and refuses a missing one", "[config]") {
  const auto some = kiln::config::select_keys(table(), {"rate", "name"});
  REQUIRE(some.size() == 2);
  CHECK(some[0].name == "rate");
  CHECK(some[1].name == "name");
  CHECK_THROWS_AS(kiln::config::select_keys(table(), {"nope"}), std::logic_error);
}

TEST_CASE("a program's command line: --config FILE, --help, accumulating lists, key sources", "[config]") {
  kiln::config::Spelling spelling;
  spelling.accumulate = {"sizes"};
  const auto line = kiln::config::parse_command_line(
      {"--config", "a.yaml", "--sizes", "1", "--steps", "2", "--sizes", "2,3", "--config=b.yaml", "--steps", "4"},
      spelling);
  CHECK(line.config_path == "b.yaml");  // given twice: the last
  CHECK(!line.help);
  CHECK(line.overrides == Pairs{{"sizes", "1,2,3"}, {"steps", "2"}, {"steps", "4"}});
  CHECK(from_cli({"--sizes", "1", "--steps", "2", "--sizes", "2,3", "--steps", "4"}, spelling).sizes ==
        std::vector<int64_t>{1, 2, 3});
  CHECK(from_cli({"--sizes", "1", "--sizes", "2"}).sizes == std::vector<int64_t>{2});  // not accumulating: the last
  // --help anywhere wins over whatever else the line holds.
  CHECK(kiln::config::parse_command_line({"--steps", "--nonsense", "stray", "-h"}).help);
  CHECK_THAT(error_of([] { kiln::config::parse_command_line({"--config"}); }), Contains("key 'config': missing value"));
  // With the table's keys known, an unknown one takes no following key as its value, so the
  // reader names it as unknown; without them, it takes the next argument.
  kiln::config::Spelling known;
  known.keys = {"steps", "fast"};
  CHECK(kiln::config::parse_command_line({"--stepz", "--steps", "2"}, known).overrides ==
        Pairs{{"stepz", "true"}, {"steps", "2"}});
  CHECK(kiln::config::parse_command_line({"--stepz", "5"}, known).overrides == Pairs{{"stepz", "5"}});
  CHECK_THAT(error_of([&] { from_cli({"--stepz"}, known); }), Contains("command line: key 'stepz': unknown key"));
  CHECK_THAT(error_of([] { from_cli({"--stepz"}); }), Contains("key 'stepz': missing value"));
  // Where each key came from, and a later check naming it.
  Settings s;
  const auto sources = kiln::config::read_settings(s, table(), "", Pairs{{"steps", "9"}}, "see --help");
  CHECK(s.steps == 9);
  CHECK(sources.given("steps"));
  CHECK(!sources.given("rate"));
  CHECK(sources.keys() == std::vector<std::string>{"steps"});
  CHECK_THAT(error_of([&] { kiln::config::check_keys_apply(sources, {"name"}, "mode x", "see --help"); }),
             Contains("command line: key 'steps': does not apply to mode x (see --help)"));
  CHECK_NOTHROW(kiln::config::check_keys_apply(sources, {"steps"}, "mode x", ""));
}

// Checkpoint folders (train/checkpoint_dir.h). Reference: the invariant that a folder named
// checkpoint-N is always complete, checked on the folder contents after each operation and after
// the states a kill can leave between two of its steps.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "kiln/train/checkpoint_dir.h"
#include "support.h"

namespace fs = std::filesystem;
using namespace kiln::train;

namespace {

void make_checkpoint(const fs::path& dir, const std::string& content) {
  fs::create_directories(dir);
  std::ofstream(dir / "model.safetensors") << content;
  std::ofstream(dir / "optimizer.safetensors") << content;
}

std::string content_of(const fs::path& dir) {
  std::ifstream in(dir / "model.safetensors");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("checkpoint names and listing order", "[train]") {
  const fs::path out = kiln::test::scratch_dir("ckdir_list");
  for (int n : {10, 2, 100}) make_checkpoint(out / ("checkpoint-" + std::to_string(n)), "x");
  fs::create_directories(out / ".checkpoint-200.tmp");
  fs::create_directories(out / "checkpoint-abc");
  std::ofstream(out / "checkpoint-300") << "a file, not a folder";
  CHECK(checkpoint_step("checkpoint-42") == 42);
  CHECK(checkpoint_step(".checkpoint-42.tmp") == -1);
  CHECK(checkpoint_step("checkpoint-99999999999999999999") == -1);  // no overflow
  const auto all = list_checkpoints(out);
  REQUIRE(all.size() == 3);
  CHECK(all[0].filename() == "checkpoint-2");
  CHECK(all[2].filename() == "checkpoint-100");
}

TEST_CASE("replace_folder_atomically replaces a checkpoint in one step", "[train]") {
  const fs::path out = kiln::test::scratch_dir("ckdir_replace");
  make_checkpoint(out / "checkpoint-5", "old");
  struct stat before {};
  ::stat((out / "checkpoint-5").c_str(), &before);
  make_checkpoint(out / ".checkpoint-5.tmp", "new");
  replace_folder_atomically(out / ".checkpoint-5.tmp", out / "checkpoint-5");
  CHECK(content_of(out / "checkpoint-5") == "new");
  CHECK(names_in(out) == std::vector<std::string>{"checkpoint-5"});
  // The new folder took the name (the old inode is gone), not a copy into the old one.
  struct stat after {};
  ::stat((out / "checkpoint-5").c_str(), &after);
  CHECK(after.st_ino != before.st_ino);
  // To a new name it is a plain rename.
  make_checkpoint(out / ".checkpoint-6.tmp", "six");
  replace_folder_atomically(out / ".checkpoint-6.tmp", out / "checkpoint-6");
  CHECK(content_of(out / "checkpoint-6") == "six");
}

TEST_CASE("a checkpoint saved over another keeps the files kiln does not write", "[train]") {
  // Issue #49: a save at an existing step deleted a transformers checkpoint's rng_state.pth and
  // training_args.bin. Reference: the old folder's listing, less kiln's families, plus the new one's.
  const fs::path out = kiln::test::scratch_dir("ckdir_foreign");
  for (const bool exchange : {true, false}) {
    CAPTURE(exchange);
    testing::hooks().no_exchange = !exchange;
    const fs::path target = out / "checkpoint-5", staged = out / ".checkpoint-5.tmp";
    fs::remove_all(target);
    make_checkpoint(target, "old");
    std::ofstream(target / "rng_state.pth") << "transformers' random state";
    std::ofstream(target / "training_args.bin") << "pickled TrainingArguments";
    fs::create_directories(target / "global_step5" / "zero");
    std::ofstream(target / "global_step5" / "zero" / "shard.pt") << "deepspeed";
    std::ofstream(target / "model-00001-of-00002.safetensors") << "a stale shard of another layout";
    std::ofstream(target / "model.safetensors.index.json") << "{}";
    make_checkpoint(staged, "new");
    replace_folder_atomically(staged, target, written_by_checkpoint_save);
    CHECK(content_of(target) == "new");
    CHECK(names_in(target) == std::vector<std::string>{"global_step5", "model.safetensors", "optimizer.safetensors",
                                                       "rng_state.pth", "training_args.bin"});
    std::ifstream in(target / "global_step5" / "zero" / "shard.pt");
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "deepspeed");
    CHECK(names_in(out) == std::vector<std::string>{"checkpoint-5"});
  }
  testing::hooks().no_exchange = false;
  CHECK(written_by_checkpoint_save("optimizer.rank-00001-of-00004.safetensors"));
  CHECK(written_by_checkpoint_save("rng_state_3.safetensors"));
  CHECK_FALSE(written_by_checkpoint_save("rng_state_3.pth"));
  CHECK_FALSE(written_by_checkpoint_save("training_args.bin"));
}

TEST_CASE("what a kill leaves is recovered at the next start", "[train]") {
  const fs::path out = kiln::test::scratch_dir("ckdir_clean");
  make_checkpoint(out / "checkpoint-1", "one");
  make_checkpoint(out / ".checkpoint-2.tmp", "partial save");       // killed while saving
  make_checkpoint(out / ".checkpoint-1.deleting", "half deleted");  // killed while rotating
  make_checkpoint(out / ".checkpoint-3.old", "three");              // killed between the two renames
  make_checkpoint(out / ".checkpoint-1.old", "superseded");         // ... after the second rename
  std::ofstream(out / "metrics.jsonl") << "{}\n";
  const auto done = clean_incomplete_checkpoints(out);
  CHECK(done.size() == 4);
  CHECK(names_in(out) == std::vector<std::string>{"checkpoint-1", "checkpoint-3", "metrics.jsonl"});
  CHECK(content_of(out / "checkpoint-1") == "one");
  CHECK(content_of(out / "checkpoint-3") == "three");
  CHECK(clean_incomplete_checkpoints(out).empty());
  CHECK(clean_incomplete_checkpoints(out / "absent").empty());
}

TEST_CASE("remove_checkpoint leaves no partial folder under the checkpoint's name", "[train]") {
  const fs::path out = kiln::test::scratch_dir("ckdir_remove");
  make_checkpoint(out / "checkpoint-7", "seven");
  remove_checkpoint(out / "checkpoint-7");
  CHECK(fs::is_empty(out));
}

namespace {

// A checkpoint of `files` files that all hold `tag`; complete_as() tells whether a folder is
// such a checkpoint, whole (every file there, every one with the same tag).
constexpr int kFiles = 150;

void make_big_checkpoint(const fs::path& dir, const std::string& tag) {
  fs::create_directories(dir);
  for (int i = 0; i < kFiles; ++i) std::ofstream(dir / ("part-" + std::to_string(i))) << tag;
}

std::string complete_as(const fs::path& dir) {
  std::string tag;
  for (int i = 0; i < kFiles; ++i) {
    std::ifstream in(dir / ("part-" + std::to_string(i)));
    if (!in) return "partial";
    const std::string t(std::istreambuf_iterator<char>(in), {});
    if (i > 0 && t != tag) return "mixed";
    tag = t;
  }
  return tag;
}

struct Fault : std::runtime_error {
  Fault() : std::runtime_error("killed here") {}
};
testing::FaultPoint g_fault_at;
int g_faults = 0;
void throw_at(testing::FaultPoint p) {
  if (p != g_fault_at) return;
  ++g_faults;
  throw Fault();
}

struct HookGuard {
  explicit HookGuard(bool no_exchange) { testing::hooks() = {.at = throw_at, .no_exchange = no_exchange}; }
  ~HookGuard() { testing::hooks() = {}; }
};

}  // namespace

TEST_CASE("a kill between any two steps of a re-save or a deletion is recovered whole", "[train]") {
  using testing::FaultPoint;
  // (exchange available?, where the kill comes)
  const std::vector<std::pair<bool, FaultPoint>> cases = {{true, FaultPoint::kReplaceExchanged},
                                                          {false, FaultPoint::kReplaceOldMoved},
                                                          {false, FaultPoint::kReplaceNewPlaced},
                                                          {true, FaultPoint::kRemoveRenamed}};
  for (const auto& [can_exchange, point] : cases) {
    CAPTURE(can_exchange, static_cast<int>(point));
    const fs::path out = kiln::test::scratch_dir("ckdir_fault");
    make_big_checkpoint(out / "checkpoint-5", "old");
    make_big_checkpoint(out / ".checkpoint-5.tmp", "new");
    make_big_checkpoint(out / "checkpoint-3", "three");
    g_fault_at = point;
    g_faults = 0;
    {
      const HookGuard guard(!can_exchange);
      if (point == FaultPoint::kRemoveRenamed) {
        CHECK_THROWS_AS(remove_checkpoint(out / "checkpoint-3"), Fault);
      } else {
        CHECK_THROWS_AS(replace_folder_atomically(out / ".checkpoint-5.tmp", out / "checkpoint-5"), Fault);
      }
    }
    REQUIRE(g_faults == 1);
    // What the kill left: a folder under a checkpoint name is whole, never partial.
    for (const fs::path& p : list_checkpoints(out)) CHECK(complete_as(p) != "partial");
    if (can_exchange) CHECK(fs::exists(out / "checkpoint-5"));  // the exchange never leaves a gap
    // The next start: checkpoint-5 is there, old or new but whole; checkpoint-3 is whole or gone.
    clean_incomplete_checkpoints(out);
    const std::string five = complete_as(out / "checkpoint-5");
    CHECK((five == "old" || five == "new"));
    if (point == FaultPoint::kReplaceNewPlaced || point == FaultPoint::kReplaceExchanged) CHECK(five == "new");
    if (point == FaultPoint::kRemoveRenamed) {
      CHECK_FALSE(fs::exists(out / "checkpoint-3"));
    } else {
      CHECK(complete_as(out / "checkpoint-3") == "three");
    }
    for (const auto& e : fs::directory_iterator(out)) CHECK(e.path().filename().string()[0] != '.');
  }
}

TEST_CASE("kill -9 at random moments of a re-save and a rotation never leaves a partial checkpoint", "[train]") {
  // The same property as above without fault points: a child process re-saves checkpoint-5 and
  // deletes checkpoint-3 (150 files each) and is killed at a random moment of that work.
  std::mt19937 rng(7);
  for (const bool no_exchange : {false, true}) {
    CAPTURE(no_exchange);
    const auto run_child = [&](const fs::path& out) {
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        testing::hooks().no_exchange = no_exchange;
        try {
          replace_folder_atomically(out / ".checkpoint-5.tmp", out / "checkpoint-5");
          remove_checkpoint(out / "checkpoint-3");
        } catch (...) {
          ::_exit(3);
        }
        ::_exit(0);
      }
      return pid;
    };
    const auto prepare = [](const fs::path& out) {
      make_big_checkpoint(out / "checkpoint-5", "old");
      make_big_checkpoint(out / ".checkpoint-5.tmp", "new");
      make_big_checkpoint(out / "checkpoint-3", "three");
    };
    // How long the work takes here, uninterrupted (the fastest of three runs): the kills land
    // uniformly over its first 80% (on a loaded machine a run can be much faster than that).
    std::chrono::microseconds took = std::chrono::hours(1);
    for (int k = 0; k < 3; ++k) {
      const fs::path timing = kiln::test::scratch_dir("ckdir_kill_timing");
      prepare(timing);
      const auto t0 = std::chrono::steady_clock::now();
      int status = 0;
      ::waitpid(run_child(timing), &status, 0);
      took =
          std::min(took, std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0));
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
      REQUIRE(complete_as(timing / "checkpoint-5") == "new");
    }
    // Until 8 kills have cut the work short (a kill after the child's end proves nothing). A child
    // that finished before its kill shows the work can be that fast here (file-system speed varies
    // from run to run): the window shrinks to 80% of that sleep, so later kills land inside it.
    int cut = 0;
    int64_t window_us = took.count() * 4 / 5;
    for (int trial = 0; trial < 200 && cut < 8; ++trial) {
      const fs::path out = kiln::test::scratch_dir("ckdir_kill");
      prepare(out);
      const pid_t pid = run_child(out);
      const int64_t sleep_us = std::uniform_int_distribution<int64_t>(0, window_us)(rng);
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      if (WIFSIGNALED(status)) {
        ++cut;
      } else {
        window_us = std::max<int64_t>(1, std::min(window_us, sleep_us * 4 / 5));
      }
      clean_incomplete_checkpoints(out);
      const std::string five = complete_as(out / "checkpoint-5");
      CHECK((five == "old" || five == "new"));
      CHECK((!fs::exists(out / "checkpoint-3") || complete_as(out / "checkpoint-3") == "three"));
      for (const auto& e : fs::directory_iterator(out)) CHECK(e.path().filename().string()[0] != '.');
    }
    CAPTURE(window_us, took.count());
    CHECK(cut == 8);
  }
}

TEST_CASE("rotation deletes the oldest but never a kept checkpoint", "[train]") {
  const fs::path out = kiln::test::scratch_dir("ckdir_rotate");
  for (int n : {30, 33, 36, 40}) make_checkpoint(out / ("checkpoint-" + std::to_string(n)), "x");
  // Keep the resumed-from 30 and the just-written 36: with limit 1, 33 and 40 go.
  const auto removed = rotate_checkpoints(out, 1, {out / "checkpoint-36", out / "checkpoint-30"});
  CHECK(removed.size() == 2);
  CHECK(names_in(out) == std::vector<std::string>{"checkpoint-30", "checkpoint-36"});
  CHECK(rotate_checkpoints(out, 0, {}).empty());  // 0 = keep all
  CHECK(rotate_checkpoints(out, 1, {}).size() == 1);
  CHECK(names_in(out) == std::vector<std::string>{"checkpoint-36"});
}

TEST_CASE("an abandoned run's later checkpoints are set aside whole, or deleted", "[train]") {
  const fs::path out = kiln::test::scratch_dir("ckdir_aside");
  for (int n : {10, 20, 30, 40}) make_checkpoint(out / ("checkpoint-" + std::to_string(n)), std::to_string(n));
  const SetAside a = set_aside_later_checkpoints(out, 20, out / "checkpoint-20", false);
  REQUIRE(a.folder);
  CHECK(a.checkpoints.size() == 2);
  CHECK(names_in(out).size() == 3);  // checkpoint-10, -20 and the abandoned-* folder
  CHECK(content_of(*a.folder / "checkpoint-40") == "40");
  CHECK(content_of(*a.folder / "checkpoint-30") == "30");
  // Twice in the same second: a second folder, nothing overwritten.
  make_checkpoint(out / "checkpoint-50", "50");
  const SetAside b = set_aside_later_checkpoints(out, 20, out / "checkpoint-20", false);
  REQUIRE(b.folder);
  CHECK(*b.folder != *a.folder);
  make_checkpoint(out / "checkpoint-60", "60");
  const SetAside c = set_aside_later_checkpoints(out, 10, out / "checkpoint-10", true);
  CHECK_FALSE(c.folder);
  CHECK(c.checkpoints.size() == 2);  // 20 and 60
  CHECK(list_checkpoints(out).size() == 1);
}

// Checkpoint folders (train/checkpoint_dir.h). Reference: the invariant that a folder named
// checkpoint-N is always complete, checked on the folder contents after each operation and after
// the states a kill can leave between two of its steps.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>

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

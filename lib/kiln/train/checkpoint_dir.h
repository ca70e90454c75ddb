// The checkpoint-N folders of an output directory: naming, atomic replacement, rotation and
// recovery after a kill. docs/training.md ("Checkpoints on disk") states the rules.
//
// Invariant: a folder named checkpoint-N is always complete. A checkpoint is written as
// .checkpoint-N.tmp and renamed into place only when whole; an existing checkpoint-N is replaced
// by an atomic exchange (renameat2 RENAME_EXCHANGE); a checkpoint is deleted by renaming it to
// .checkpoint-N.deleting first. Names starting with '.' are never taken for checkpoints, and
// what a kill leaves of them is cleaned up by clean_incomplete_checkpoints() at the next start.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kiln::train {

// N of a folder named checkpoint-N (N decimal), or -1.
int64_t checkpoint_step(const std::filesystem::path& path);

// The checkpoint-N folders of `output_dir`, by increasing N (empty when the folder is absent).
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& output_dir);

// Moves the complete folder `staged` to `target` atomically: when `target` exists the two are
// exchanged in one step and the old content (now at `staged`) is deleted; at no moment is
// `target` missing or partial. Where the file system cannot exchange, `target` is first renamed
// to .<name>.old, which clean_incomplete_checkpoints() restores if a kill comes in between.
// Nothing of the old folder is lost: what it holds that `staged` does not (files another program
// wrote beside a checkpoint: transformers' rng_state.pth, training_args.bin, ...) is carried into
// `staged` first (hard links, copies across file systems), so the new folder has both; except the
// entries `superseded` names (the families of files the new content replaces as a whole, such as
// weight shards of another layout that would otherwise be read beside the new ones).
void replace_folder_atomically(const std::filesystem::path& staged, const std::filesystem::path& target,
                               const std::function<bool(const std::string& name)>& superseded = nullptr);

// The files a kiln checkpoint save writes as families (weights and their index, optimizer and
// random-state shards, scaler.pt, kiln's own state files, the tokenizer files): what
// replace_folder_atomically does not carry over from an older checkpoint-N.
bool written_by_checkpoint_save(const std::string& name);

// Deletes a checkpoint so that no partial folder keeps its name: rename to .<name>.deleting,
// then remove.
void remove_checkpoint(const std::filesystem::path& checkpoint);

// What a kill or a full disk left in `output_dir`: removes .checkpoint-N.tmp and .deleting
// folders, and restores .checkpoint-N.old where checkpoint-N is missing (else removes it).
// Returns one human-readable entry per folder handled (empty when there was nothing).
std::vector<std::string> clean_incomplete_checkpoints(const std::filesystem::path& output_dir);

// save_total_limit: deletes the oldest checkpoints until at most `limit` remain (0 = keep all),
// never one of `keep` (the checkpoint just written and the one the run resumed from). Returns the
// deleted folders.
std::vector<std::filesystem::path> rotate_checkpoints(const std::filesystem::path& output_dir, int64_t limit,
                                                      const std::vector<std::filesystem::path>& keep);

// Checkpoints of `output_dir` that a run starting at `start_step` would otherwise mix with its
// own (checkpoint-N with N > start_step, other than `resumed_from`): they belong to an abandoned
// run. `remove` deletes them; otherwise they are moved into a new folder
// output_dir/abandoned-<YYYYmmdd-HHMMSS>/, whose path is returned (nullopt when nothing moved).
struct SetAside {
  std::vector<std::filesystem::path> checkpoints;  // as they were named before
  std::optional<std::filesystem::path> folder;     // where they went (unset when removed)
};
SetAside set_aside_later_checkpoints(const std::filesystem::path& output_dir, int64_t start_step,
                                     const std::filesystem::path& resumed_from, bool remove);

// Crash testing: the moments between two steps of the operations above where a kill leaves a
// state that the next start must recover from. Tests install a hook that throws at one of them
// (the operation then stops there, as a killed process would) and check the folder; the hook can
// also disable the atomic exchange, so the fallback path is exercised on any file system.
namespace testing {
enum class FaultPoint {
  kReplaceExchanged,  // replace: exchanged, the old content not yet deleted
  kReplaceOldMoved,   // replace (fallback): target renamed to .old, staged not yet renamed
  kReplaceNewPlaced,  // replace (fallback): staged renamed into place, .old not yet deleted
  kRemoveRenamed,     // remove: renamed to .deleting, not yet deleted
};
struct Hooks {
  void (*at)(FaultPoint) = nullptr;
  bool no_exchange = false;  // behave as a file system without renameat2(RENAME_EXCHANGE)
};
Hooks& hooks();
}  // namespace testing

}  // namespace kiln::train

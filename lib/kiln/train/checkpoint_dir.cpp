// Checkpoint folders: see checkpoint_dir.h for the invariant.
#include "kiln/train/checkpoint_dir.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <regex>
#include <stdexcept>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

namespace kiln::train {

namespace fs = std::filesystem;

namespace {

const std::regex& checkpoint_name() {
  static const std::regex re("checkpoint-([0-9]{1,18})");
  return re;
}

// Flushes a directory's entries (the renames in it) to disk; best effort.
void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

fs::path sibling(const fs::path& p, const std::string& suffix) {
  return p.parent_path() / ("." + p.filename().string() + suffix);
}

void fault(testing::FaultPoint point) {
  if (testing::hooks().at) testing::hooks().at(point);
}

// renameat2(RENAME_EXCHANGE): false when the file system or kernel cannot do it.
bool exchange(const fs::path& a, const fs::path& b) {
  if (testing::hooks().no_exchange) return false;
  constexpr unsigned kRenameExchange = 2;  // RENAME_EXCHANGE in <linux/fs.h>
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP || errno == EOPNOTSUPP) return false;
  throw std::runtime_error(
      fmt::format("cannot exchange '{}' and '{}': {}", a.string(), b.string(), std::strerror(errno)));
}

// What `from` holds that `into` does not, linked (or copied) into `into`; folders merged the same
// way. `from` is left as it is.
void carry_over(const fs::path& from, const fs::path& into, const std::function<bool(const std::string&)>& superseded) {
  for (const auto& e : fs::directory_iterator(from)) {
    if (superseded && superseded(e.path().filename().string())) continue;
    const fs::path dst = into / e.path().filename();
    std::error_code ec;
    const fs::file_status there = fs::symlink_status(dst, ec);
    if (e.is_directory() && !e.is_symlink()) {
      if (!fs::exists(there)) fs::create_directory(dst);
      if (fs::is_directory(there) || !fs::exists(there)) carry_over(e.path(), dst, nullptr);
      continue;
    }
    if (fs::exists(there) || fs::is_symlink(there)) continue;  // the new save wrote it
    if (e.is_symlink()) {
      fs::copy_symlink(e.path(), dst);
    } else {
      fs::create_hard_link(e.path(), dst, ec);
      if (ec) fs::copy_file(e.path(), dst);
    }
  }
}

}  // namespace

testing::Hooks& testing::hooks() {
  static Hooks h;
  return h;
}

int64_t checkpoint_step(const fs::path& path) {
  std::smatch m;
  const std::string name = path.filename().string();
  return std::regex_match(name, m, checkpoint_name()) ? std::stoll(m[1]) : -1;
}

std::vector<fs::path> list_checkpoints(const fs::path& output_dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    if (e.is_directory() && checkpoint_step(e.path()) >= 0) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return checkpoint_step(a) < checkpoint_step(b); });
  return out;
}

bool written_by_checkpoint_save(const std::string& name) {
  static const std::regex owned(
      R"(model(-[0-9]+-of-[0-9]+)?\.safetensors|model\.safetensors\.index\.json|optimizer(\..*)?\.safetensors|)"
      R"(rng_state(_[0-9]+)?\.safetensors|(optimizer|scheduler|scaler)\.pt|(trainer|kiln|loader)_state\.json|)"
      R"(kiln_data\.json|training_args\.json|(generation_)?config\.json|tokenizer.*|special_tokens_map\.json|)"
      R"(chat_template\.jinja)");
  return std::regex_match(name, owned);
}

void replace_folder_atomically(const fs::path& staged, const fs::path& target,
                               const std::function<bool(const std::string&)>& superseded) {
  if (!fs::exists(target)) {
    fs::rename(staged, target);
    sync_dir(target.parent_path());
    return;
  }
  if (fs::is_directory(target)) carry_over(target, staged, superseded);
  if (exchange(staged, target)) {
    sync_dir(target.parent_path());
    fault(testing::FaultPoint::kReplaceExchanged);
    fs::remove_all(staged);  // the old content
    return;
  }
  const fs::path old = sibling(target, ".old");
  fs::remove_all(old);
  fs::rename(target, old);
  fault(testing::FaultPoint::kReplaceOldMoved);
  fs::rename(staged, target);
  sync_dir(target.parent_path());
  fault(testing::FaultPoint::kReplaceNewPlaced);
  fs::remove_all(old);
}

void remove_checkpoint(const fs::path& checkpoint) {
  const fs::path doomed = sibling(checkpoint, ".deleting");
  fs::remove_all(doomed);
  fs::rename(checkpoint, doomed);
  sync_dir(checkpoint.parent_path());
  fault(testing::FaultPoint::kRemoveRenamed);
  fs::remove_all(doomed);
}

std::vector<std::string> clean_incomplete_checkpoints(const fs::path& output_dir) {
  static const std::regex leftover(R"(\.(checkpoint-[0-9]{1,18})\.(tmp|deleting|old))");
  std::vector<std::string> done;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return done;
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(output_dir)) found.push_back(e.path());
  std::sort(found.begin(), found.end());
  for (const fs::path& p : found) {
    std::smatch m;
    const std::string name = p.filename().string();
    if (!std::regex_match(name, m, leftover)) continue;
    const fs::path target = output_dir / m[1].str();
    if (m[2] == "old" && !fs::exists(target)) {
      fs::rename(p, target);  // a replacement was cut between its two renames: keep the old one
      done.push_back(fmt::format("{} restored as {}", name, target.filename().string()));
    } else {
      fs::remove_all(p);
      done.push_back(fmt::format("{} removed", name));
    }
  }
  if (!done.empty()) sync_dir(output_dir);
  return done;
}

std::vector<fs::path> rotate_checkpoints(const fs::path& output_dir, int64_t limit, const std::vector<fs::path>& keep) {
  std::vector<fs::path> removed;
  if (limit <= 0) return removed;
  const auto kept = [&](const fs::path& p) {
    return std::any_of(keep.begin(), keep.end(), [&](const fs::path& k) {
      std::error_code ec;
      return !k.empty() && fs::equivalent(k, p, ec);
    });
  };
  auto all = list_checkpoints(output_dir);
  auto count = static_cast<int64_t>(all.size());
  for (const fs::path& p : all) {
    if (count <= limit) break;
    if (kept(p)) continue;
    remove_checkpoint(p);
    removed.push_back(p);
    --count;
  }
  return removed;
}

SetAside set_aside_later_checkpoints(const fs::path& output_dir, int64_t start_step, const fs::path& resumed_from,
                                     bool remove) {
  SetAside out;
  for (const fs::path& p : list_checkpoints(output_dir)) {
    std::error_code ec;
    if (checkpoint_step(p) <= start_step) continue;
    if (!resumed_from.empty() && fs::equivalent(p, resumed_from, ec)) continue;
    out.checkpoints.push_back(p);
  }
  if (out.checkpoints.empty()) return out;
  if (remove) {
    for (const fs::path& p : out.checkpoints) remove_checkpoint(p);
    return out;
  }
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  fs::path folder = output_dir / fmt::format("abandoned-{}", stamp);
  for (int k = 2; fs::exists(folder); ++k) folder = output_dir / fmt::format("abandoned-{}-{}", stamp, k);
  fs::create_directory(folder);
  for (const fs::path& p : out.checkpoints) fs::rename(p, folder / p.filename());
  sync_dir(output_dir);
  out.folder = folder;
  return out;
}

}  // namespace kiln::train

#include "kiln/train/progress.h"

#include <cmath>

#include <fmt/format.h>
#include <unistd.h>

namespace kiln::train {

std::string format_rate(double it_s) {
  if (!(it_s > 0)) return "?it/s";
  return it_s >= 1.0 ? fmt::format("{:.2f}it/s", it_s) : fmt::format("{:.2f}s/it", 1.0 / it_s);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{:02d}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{:02d}:{:02d}", s / 60, s % 60);
}

ProgressBar::ProgressBar(int64_t total, int64_t start, std::FILE* out)
    : total_(total), start_(start), done_(start), out_(out), tty_(out != nullptr && isatty(fileno(out)) != 0) {
  begin_ = last_draw_ = std::chrono::steady_clock::now();
}

std::string ProgressBar::line() const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done_ - start_) / elapsed : 0.0;
  const double remaining = rate > 0 ? static_cast<double>(total_ - done_) / rate : NAN;
  const double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar;
  for (int i = 0; i < kWidth; ++i) bar += i < filled ? "\u2588" : " ";
  return fmt::format("{:3.0f}%|{}| {}/{} [{}<{}, {}]", frac * 100, bar, done_, total_, format_duration(elapsed),
                     format_duration(remaining), format_rate(rate));
}

void ProgressBar::update(int64_t done) {
  done_ = done;
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  fmt::print(out_, "\r{}", line());
  std::fflush(out_);
}

void ProgressBar::print_line() {
  if (tty_ || !out_) return;
  fmt::print(out_, "{}\n", line());
}

void ProgressBar::clear() {
  if (tty_) fmt::print(out_, "\r\033[2K");
}

void ProgressBar::finish() {
  if (tty_) fmt::print(out_, "\r{}\n", line());
  if (out_) std::fflush(out_);
}

}  // namespace kiln::train

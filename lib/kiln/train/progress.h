// A tqdm-style progress line for the training loop ("45%|####      | 45/100 [00:10<00:12,
// 4.41it/s]", s/it below 1 it/s as HF prints it). Redrawn in place on a terminal; elsewhere (logs,
// CI) printed as whole lines only when asked, so log files are not flooded.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kiln::train {

// "12.3it/s" or "1.52s/it", as HF/tqdm print speeds.
std::string format_rate(double iterations_per_second);
// "01:02:03" or "02:03".
std::string format_duration(double seconds);

class ProgressBar {
 public:
  // out = nullptr: prints nothing (the ranks other than 0 of a data-parallel job).
  ProgressBar(int64_t total, int64_t start, std::FILE* out = stderr);
  // Call after each step; redraws on a terminal at most ~10 times a second.
  void update(int64_t done);
  // Prints the current line as a whole line (used at logging steps when not on a terminal).
  void print_line();
  // Erases the in-place line on a terminal so that a log line can be printed cleanly.
  void clear();
  void finish();
  std::string line() const;

 private:
  int64_t total_, start_, done_;
  std::FILE* out_;
  bool tty_;
  std::chrono::steady_clock::time_point begin_, last_draw_;
};

}  // namespace kiln::train

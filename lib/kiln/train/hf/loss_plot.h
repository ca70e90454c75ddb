// plot_loss: true — LLaMA-Factory's loss figures (extras/ploting.py plot_loss), drawn with Cairo.
//
// For each key ("loss", and "eval_loss" when there is evaluation data) the values of the
// log_history entries that hold it, against their "step": a 640x480 PNG (matplotlib's default
// figure at dpi 100) with the values ("original", the line color at alpha 0.4), their smoothed
// curve ("smoothed"), the title "training <key> of <output_dir>", the x label "step", the y label
// <key> and a legend, saved as output_dir/training_<key>.png. kiln draws matplotlib's default
// layout (axes at 12.5%..90% x 11%..88% of the figure, "nice" ticks, 5% data margins) with
// Cairo's API; built without Cairo (Debian libcairo2-dev) there is no figure and plot_loss
// says so.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::train {

// LLaMA-Factory's smooth(): an EMA whose weight grows with the number of points,
// 1.8 * (1 / (1 + exp(-0.05 * n)) - 0.5), starting from the first value.
std::vector<double> smooth_losses(const std::vector<double>& values);

// True when kiln was built with Cairo.
bool loss_plots_available();

// Tick positions of matplotlib's AutoLocator (MaxNLocator, steps 1, 2, 2.5, 5, 10) for the view
// [lo, hi] with at most `max_bins` intervals; only the ticks inside the view.
std::vector<double> nice_ticks(double lo, double hi, int max_bins);

// One figure as LLaMA-Factory's plot_loss draws it, written atomically to `png_path`. Throws
// std::runtime_error when kiln was built without Cairo or the file cannot be written.
void draw_loss_figure(const std::string& png_path, const std::string& title, const std::string& ylabel,
                      const std::vector<double>& steps, const std::vector<double>& values);

// LLaMA-Factory's plot_loss(output_dir, keys): a figure per key that the log history holds;
// returns the files written. A key without values gets one warning ("No metric eval_loss to
// plot."), as there; without Cairo one warning and nothing is written.
std::vector<std::string> plot_loss(const std::string& output_dir, const nlohmann::json& log_history,
                                   const std::vector<std::string>& keys);

}  // namespace kiln::train

// plot_loss figures: see loss_plot.h. Sizes follow matplotlib's defaults at dpi 100 (a point is
// 100/72 pixels): 10 pt labels, 12 pt title, 0.8 pt spines and ticks 3.5 pt long, 1.5 pt lines.
#include "kiln/train/hf/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/common/logger.h"
#include "kiln/io/safetensors.h"

#ifdef KILN_WITH_CAIRO
#include <cairo.h>
#endif

namespace kiln::train {

std::vector<double> smooth_losses(const std::vector<double>& values) {
  std::vector<double> out;
  if (values.empty()) return out;
  const double n = static_cast<double>(values.size());
  const double weight = 1.8 * (1.0 / (1.0 + std::exp(-0.05 * n)) - 0.5);
  double last = values.front();
  for (double v : values) {
    last = last * weight + (1 - weight) * v;
    out.push_back(last);
  }
  return out;
}

bool loss_plots_available() {
#ifdef KILN_WITH_CAIRO
  return true;
#else
  return false;
#endif
}

std::vector<double> nice_ticks(double lo, double hi, int max_bins) {
  std::vector<double> ticks;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return ticks;
  max_bins = std::max(max_bins, 1);
  const double raw = (hi - lo) / max_bins;
  const double scale = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 20 * scale, first = std::floor(lo / step) * step;  // 20: when even 10 has one bin too many
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    const double s = m * scale;
    const double start = std::floor(lo / s) * s;
    if (std::ceil((hi - start) / s - 1e-9) <= max_bins) {
      step = s;
      first = start;
      break;
    }
  }
  const double eps = step * 1e-9;
  for (int i = 0; i < 1000; ++i) {
    const double t = first + i * step;
    if (t > hi + eps) break;
    if (t >= lo - eps) ticks.push_back(std::abs(t) < eps ? 0.0 : t);
  }
  return ticks;
}

namespace {

#ifdef KILN_WITH_CAIRO

// The fewest decimals that write every tick exactly (matplotlib's ScalarFormatter, without its
// offset and scientific notation).
std::vector<std::string> tick_labels(const std::vector<double>& ticks) {
  int decimals = 0;
  for (; decimals < 8; ++decimals) {
    const double f = std::pow(10.0, decimals);
    if (std::all_of(ticks.begin(), ticks.end(), [&](double t) {
          return std::abs(std::round(t * f) - t * f) < 1e-6 * std::max(1.0, std::abs(t * f));
        }))
      break;
  }
  std::vector<std::string> out;
  for (double t : ticks) {
    std::string s = fmt::format("{:.{}f}", t, decimals);
    if (s.rfind("-", 0) == 0) s = "\u2212" + s.substr(1);  // matplotlib's minus sign
    out.push_back(s);
  }
  return out;
}

// [lo, hi] of the values with matplotlib's 5% margins; a single value gets +-5% of itself.
std::pair<double, double> view_limits(const std::vector<double>& v) {
  double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
  if (hi - lo <= 1e-12 * std::max(std::abs(lo), std::abs(hi))) {
    const double pad = lo == 0 ? 0.05 : 0.05 * std::abs(lo);
    return {lo - pad, hi + pad};
  }
  const double margin = 0.05 * (hi - lo);
  return {lo - margin, hi + margin};
}

constexpr double kWidth = 640, kHeight = 480;
constexpr double kPt = 100.0 / 72.0;  // pixels per point at dpi 100
constexpr double kFont = 10 * kPt, kTitleFont = 12 * kPt;
// Axes box: matplotlib's subplot parameters left 0.125, right 0.9, bottom 0.11, top 0.88.
constexpr double kLeft = 0.125 * kWidth, kRight = 0.9 * kWidth;
constexpr double kTop = (1 - 0.88) * kHeight, kBottom = (1 - 0.11) * kHeight;
constexpr double kBlue[3] = {0x1f / 255.0, 0x77 / 255.0, 0xb4 / 255.0};

struct Canvas {
  cairo_surface_t* surface =
      cairo_image_surface_create(CAIRO_FORMAT_ARGB32, static_cast<int>(kWidth), static_cast<int>(kHeight));
  cairo_t* cr = cairo_create(surface);
  ~Canvas() {
    cairo_destroy(cr);
    cairo_surface_destroy(surface);
  }
  void font(double size) {
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
  }
  double text_width(const std::string& s) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.c_str(), &e);
    return e.x_advance;
  }
  // Draws `s` with its anchor at (x, y): ha 0 = left, 0.5 = center, 1 = right; the baseline at y.
  void text(const std::string& s, double x, double y, double ha) {
    cairo_move_to(cr, x - ha * text_width(s), y);
    cairo_show_text(cr, s.c_str());
  }
};

cairo_status_t append_png(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

#endif

}  // namespace

void draw_loss_figure(const std::string& png_path, const std::string& title, const std::string& ylabel,
                      const std::vector<double>& steps, const std::vector<double>& values) {
#ifndef KILN_WITH_CAIRO
  (void)title, (void)ylabel, (void)steps, (void)values;
  throw std::runtime_error(fmt::format("{}: kiln was built without Cairo (Debian libcairo2-dev): no figure", png_path));
#else
  if (steps.empty() || steps.size() != values.size()) throw std::invalid_argument("draw_loss_figure: no points");
  const std::vector<double> smoothed = smooth_losses(values);
  std::vector<double> all_y = values;
  all_y.insert(all_y.end(), smoothed.begin(), smoothed.end());
  const auto [x0, x1] = view_limits(steps);
  const auto [y0, y1] = view_limits(all_y);
  const auto px = [&, x0 = x0, x1 = x1](double x) { return kLeft + (x - x0) / (x1 - x0) * (kRight - kLeft); };
  const auto py = [&, y0 = y0, y1 = y1](double y) { return kBottom - (y - y0) / (y1 - y0) * (kBottom - kTop); };

  Canvas c;
  cairo_t* cr = c.cr;
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);

  // The two curves, clipped to the axes.
  cairo_save(cr);
  cairo_rectangle(cr, kLeft, kTop, kRight - kLeft, kBottom - kTop);
  cairo_clip(cr);
  cairo_set_line_width(cr, 1.5 * kPt);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_SQUARE);
  const auto polyline = [&](const std::vector<double>& ys, double alpha) {
    for (size_t i = 0; i < ys.size(); ++i) cairo_line_to(cr, px(steps[i]), py(ys[i]));
    cairo_set_source_rgba(cr, kBlue[0], kBlue[1], kBlue[2], alpha);
    cairo_stroke(cr);
  };
  polyline(values, 0.4);
  polyline(smoothed, 1.0);
  cairo_restore(cr);

  // Spines, ticks and tick labels.
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_set_line_width(cr, 0.8 * kPt);
  cairo_rectangle(cr, kLeft, kTop, kRight - kLeft, kBottom - kTop);
  cairo_stroke(cr);
  const double tick_len = 3.5 * kPt, pad = 3.5 * kPt;
  c.font(kFont);
  cairo_font_extents_t fe;
  cairo_font_extents(cr, &fe);
  const std::vector<double> xt = nice_ticks(x0, x1, 9), yt = nice_ticks(y0, y1, 9);
  const auto xl = tick_labels(xt), yl = tick_labels(yt);
  for (size_t i = 0; i < xt.size(); ++i) {
    const double x = std::round(px(xt[i])) + 0.5;
    cairo_move_to(cr, x, kBottom);
    cairo_line_to(cr, x, kBottom + tick_len);
    cairo_stroke(cr);
    c.text(xl[i], x, kBottom + tick_len + pad + fe.ascent, 0.5);
  }
  double widest = 0;
  for (size_t i = 0; i < yt.size(); ++i) {
    const double y = std::round(py(yt[i])) + 0.5;
    cairo_move_to(cr, kLeft, y);
    cairo_line_to(cr, kLeft - tick_len, y);
    cairo_stroke(cr);
    c.text(yl[i], kLeft - tick_len - pad, y + (fe.ascent - fe.descent) / 2, 1.0);
    widest = std::max(widest, c.text_width(yl[i]));
  }

  // Axis labels and title.
  const double label_pad = 4 * kPt;
  c.text("step", (kLeft + kRight) / 2, kBottom + tick_len + pad + fe.height + label_pad + fe.ascent, 0.5);
  cairo_save(cr);
  cairo_translate(cr, kLeft - tick_len - pad - widest - label_pad - fe.descent, (kTop + kBottom) / 2);
  cairo_rotate(cr, -M_PI / 2);
  c.text(ylabel, 0, 0, 0.5);
  cairo_restore(cr);
  c.font(kTitleFont);
  c.text(title, (kLeft + kRight) / 2, kTop - 6 * kPt, 0.5);

  // Legend at matplotlib's "best" place: the first of its candidate places covering the fewest points.
  c.font(kFont);
  const char* labels[] = {"original", "smoothed"};
  const double handle = 2.0 * kFont, handle_pad = 0.8 * kFont, spacing = 0.5 * kFont, border = 0.4 * kFont;
  const double row = fe.ascent + fe.descent;
  const double box_w = 2 * border + handle + handle_pad + std::max(c.text_width(labels[0]), c.text_width(labels[1]));
  const double box_h = 2 * border + 2 * row + spacing;
  const double gap = 0.5 * kFont;
  const double lx[3] = {kRight - gap - box_w, kLeft + gap, (kLeft + kRight - box_w) / 2};
  const double ly[3] = {kTop + gap, kBottom - gap - box_h, (kTop + kBottom - box_h) / 2};
  // upper right, upper left, lower left, lower right, center right, center left, lower center,
  // upper center, center (matplotlib's order, "right" folded into center right).
  const std::pair<int, int> places[] = {{0, 0}, {1, 0}, {1, 1}, {0, 1}, {0, 2}, {1, 2}, {2, 1}, {2, 0}, {2, 2}};
  double bx = lx[0], by = ly[0];
  size_t fewest = std::numeric_limits<size_t>::max();
  for (const auto& [i, j] : places) {
    size_t covered = 0;
    for (const auto* ys : {&values, &smoothed}) {
      for (size_t k = 0; k < ys->size(); ++k) {
        const double x = px(steps[k]), y = py((*ys)[k]);
        covered += x >= lx[i] && x <= lx[i] + box_w && y >= ly[j] && y <= ly[j] + box_h;
      }
    }
    if (covered < fewest) {
      fewest = covered;
      bx = lx[i];
      by = ly[j];
    }
  }
  const double r = 0.2 * kFont;
  cairo_new_sub_path(cr);
  cairo_arc(cr, bx + box_w - r, by + r, r, -M_PI / 2, 0);
  cairo_arc(cr, bx + box_w - r, by + box_h - r, r, 0, M_PI / 2);
  cairo_arc(cr, bx + r, by + box_h - r, r, M_PI / 2, M_PI);
  cairo_arc(cr, bx + r, by + r, r, M_PI, 1.5 * M_PI);
  cairo_close_path(cr);
  cairo_set_source_rgba(cr, 1, 1, 1, 0.8);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.8, 0.8, 0.8);
  cairo_set_line_width(cr, 1.0 * kPt);
  cairo_stroke(cr);
  for (int k = 0; k < 2; ++k) {
    const double top = by + border + k * (row + spacing);
    const double mid = top + row / 2;
    cairo_set_source_rgba(cr, kBlue[0], kBlue[1], kBlue[2], k == 0 ? 0.4 : 1.0);
    cairo_set_line_width(cr, 1.5 * kPt);
    cairo_move_to(cr, bx + border, mid);
    cairo_line_to(cr, bx + border + handle, mid);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    c.text(labels[k], bx + border + handle + handle_pad, top + fe.ascent, 0);
  }

  cairo_surface_flush(c.surface);
  std::string png;
  const cairo_status_t status = cairo_surface_write_to_png_stream(c.surface, append_png, &png);
  if (status != CAIRO_STATUS_SUCCESS) {
    throw std::runtime_error(fmt::format("{}: cannot encode the PNG: {}", png_path, cairo_status_to_string(status)));
  }
  io::write_file_atomic(png_path, png);
#endif
}

std::vector<std::string> plot_loss(const std::string& output_dir, const nlohmann::json& log_history,
                                   const std::vector<std::string>& keys) {
  std::vector<std::string> written;
  if (!loss_plots_available()) {
    logger()->warn(
        "kiln-pretrain: warning: plot_loss: true but kiln was built without Cairo (Debian libcairo2-dev; "
        "scripts/setup.sh installs it): no training_loss.png was written");
    return written;
  }
  for (const std::string& key : keys) {
    std::vector<double> steps, values;
    for (const auto& entry : log_history) {
      if (!entry.is_object() || !entry.contains(key) || !entry.contains("step")) continue;
      if (!entry[key].is_number() || !entry["step"].is_number()) continue;  // a non-finite loss is null
      steps.push_back(entry["step"].get<double>());
      values.push_back(entry[key].get<double>());
    }
    if (values.empty()) {
      logger()->warn("kiln-pretrain: warning: plot_loss: no metric {} to plot", key);
      continue;
    }
    std::string name = key;
    std::replace(name.begin(), name.end(), '/', '_');
    const std::string path = (std::filesystem::path(output_dir) / fmt::format("training_{}.png", name)).string();
    draw_loss_figure(path, fmt::format("training {} of {}", key, output_dir), key, steps, values);
    logger()->info("kiln-pretrain: figure saved at {}", path);
    written.push_back(path);
  }
  return written;
}

}  // namespace kiln::train

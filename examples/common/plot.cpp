#include "examples/common/plot.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.hpp"

#ifdef HG_WITH_CAIRO
#include <cairo-svg.h>
#include <cairo.h>
#endif

namespace hg::cli {

#ifndef HG_WITH_CAIRO
bool plots_available() { return false; }
std::string plots_unavailable_reason() {
  return "this build has no plotting: cairo was not found at configure time (apt-get install libcairo2-dev, "
         "then re-run cmake)";
}
void write_plot(const std::string& path, const PlotSpec&) {
  fail("write_plot", path, ": ", plots_unavailable_reason());
}
#else

bool plots_available() { return true; }
std::string plots_unavailable_reason() { return ""; }

namespace {

constexpr double kWidth = 800, kHeight = 500;
constexpr double kLeft = 80, kRight = 20, kTop = 40, kBottom = 60;

// matplotlib's "tab10" colours: distinct, and familiar from the Python plots.
constexpr std::array<std::array<double, 3>, 10> kColours = {{{0.12, 0.47, 0.71},
                                                             {1.00, 0.50, 0.05},
                                                             {0.17, 0.63, 0.17},
                                                             {0.84, 0.15, 0.16},
                                                             {0.58, 0.40, 0.74},
                                                             {0.55, 0.34, 0.29},
                                                             {0.89, 0.47, 0.76},
                                                             {0.50, 0.50, 0.50},
                                                             {0.74, 0.74, 0.13},
                                                             {0.09, 0.75, 0.81}}};

// One axis: data range -> pixels, with ticks.
struct Axis {
  bool log = false;
  double lo = 0, hi = 1;    // in data units (log: positive)
  double from = 0, to = 1;  // pixel positions of lo and hi

  double t(double v) const { return log ? std::log10(v) : v; }
  double px(double v) const { return from + (t(v) - t(lo)) / (t(hi) - t(lo)) * (to - from); }

  // Ticks: linear axes at 1, 2, 5 x 10^k; log axes at decades when the range
  // spans two or more, else at 1, 2, 5 x 10^k, else at every 1..9 x 10^k,
  // else (a narrow range) as on a linear axis.
  std::vector<double> ticks() const {
    if (log) {
      const int first = int(std::floor(std::log10(lo))), last = int(std::ceil(std::log10(hi)));
      for (const std::vector<double>& mantissas :
           {std::vector<double>{1}, std::vector<double>{1, 2, 5}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
        std::vector<double> out;
        for (int e = first; e <= last; ++e)
          for (double m : mantissas) {
            const double v = m * std::pow(10.0, e);
            if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
          }
        if (out.size() >= 3) return out;
      }
    }
    std::vector<double> out;
    const double raw = (hi - lo) / 6;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (raw <= m * mag) {
        step = m * mag;
        break;
      }
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
      out.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }
};

std::string tick_label(double v) {
  char buf[32];
  const double a = std::abs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-3)) std::snprintf(buf, sizeof buf, "%.0e", v);
  else std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Data range of the finite (and, on a log axis, positive) values, padded.
void fit(Axis& axis, const std::vector<double>& values) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values)
    if (std::isfinite(v) && (!axis.log || v > 0)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(lo <= hi)) lo = axis.log ? 1 : 0, hi = axis.log ? 10 : 1;
  if (axis.log) {
    if (hi / lo < 1.5) lo /= 1.25, hi *= 1.25;
    lo /= std::pow(hi / lo, 0.03), hi *= std::pow(hi / lo, 0.03);
  } else {
    const double pad = hi > lo ? 0.04 * (hi - lo) : std::max(1.0, std::abs(hi)) * 0.1;
    lo -= pad, hi += pad;
  }
  axis.lo = lo, axis.hi = hi;
}

void text(cairo_t* cr, const std::string& s, double x, double y, double align_x, double align_y, double size,
          bool vertical = false) {
  cairo_set_font_size(cr, size);
  cairo_text_extents_t ext;
  cairo_text_extents(cr, s.c_str(), &ext);
  cairo_save(cr);
  cairo_translate(cr, x, y);
  if (vertical) cairo_rotate(cr, -M_PI / 2);
  cairo_move_to(cr, -ext.width * align_x - ext.x_bearing, ext.height * align_y);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

void draw(cairo_t* cr, const PlotSpec& spec) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

  Axis xa, ya;
  xa.log = spec.log_x, ya.log = spec.log_y;
  std::vector<double> xs, ys;
  for (const PlotSeries& s : spec.series)
    xs.insert(xs.end(), s.x.begin(), s.x.end()), ys.insert(ys.end(), s.y.begin(), s.y.end());
  fit(xa, xs);
  fit(ya, ys);
  xa.from = kLeft, xa.to = kWidth - kRight;
  ya.from = kHeight - kBottom, ya.to = kTop;

  // Grid and ticks.
  cairo_set_line_width(cr, 1);
  for (double v : xa.ticks()) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, xa.px(v), ya.from), cairo_line_to(cr, xa.px(v), ya.to), cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, tick_label(v), xa.px(v), ya.from + 6, 0.5, 1.0, 12);
  }
  for (double v : ya.ticks()) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, xa.from, ya.px(v)), cairo_line_to(cr, xa.to, ya.px(v)), cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, tick_label(v), xa.from - 6, ya.px(v), 1.0, 0.5, 12);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, xa.from, ya.to, xa.to - xa.from, ya.from - ya.to);
  cairo_stroke(cr);

  // Titles.
  text(cr, spec.title, kWidth / 2, kTop / 2, 0.5, 0.5, 15);
  text(cr, spec.x_label + (spec.log_x ? " (log scale)" : ""), (xa.from + xa.to) / 2, kHeight - 14, 0.5, 0.0, 13);
  text(cr, spec.y_label + (spec.log_y ? " (log scale)" : ""), 18, (ya.from + ya.to) / 2, 0.5, 0.5, 13, true);

  // Series, clipped to the plot area.
  cairo_save(cr);
  cairo_rectangle(cr, xa.from, ya.to, xa.to - xa.from, ya.from - ya.to);
  cairo_clip(cr);
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const PlotSeries& s = spec.series[i];
    const auto& c = kColours[i % kColours.size()];
    cairo_set_source_rgb(cr, c[0], c[1], c[2]);
    cairo_set_line_width(cr, 1.8);
    bool pen_down = false;
    for (size_t k = 0; k < std::min(s.x.size(), s.y.size()); ++k) {
      const bool ok =
          std::isfinite(s.x[k]) && std::isfinite(s.y[k]) && (!xa.log || s.x[k] > 0) && (!ya.log || s.y[k] > 0);
      if (!ok) {
        pen_down = false;
        continue;
      }
      if (pen_down) cairo_line_to(cr, xa.px(s.x[k]), ya.px(s.y[k]));
      else cairo_move_to(cr, xa.px(s.x[k]), ya.px(s.y[k]));
      pen_down = true;
    }
    cairo_stroke(cr);
    if (s.markers)
      for (size_t k = 0; k < std::min(s.x.size(), s.y.size()); ++k)
        if (std::isfinite(s.x[k]) && std::isfinite(s.y[k]) && (!xa.log || s.x[k] > 0) && (!ya.log || s.y[k] > 0)) {
          cairo_arc(cr, xa.px(s.x[k]), ya.px(s.y[k]), 3, 0, 2 * M_PI);
          cairo_fill(cr);
        }
  }
  cairo_restore(cr);

  // Legend, top right inside the plot area.
  cairo_set_font_size(cr, 12);
  double legend_w = 0;
  for (const PlotSeries& s : spec.series) {
    cairo_text_extents_t ext;
    cairo_text_extents(cr, s.name.c_str(), &ext);
    legend_w = std::max(legend_w, ext.x_advance);
  }
  const double row = 17, lx = xa.to - legend_w - 44, ly = ya.to + 8;
  cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
  cairo_rectangle(cr, lx, ly, legend_w + 36, row * double(spec.series.size()) + 6);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const auto& c = kColours[i % kColours.size()];
    const double y = ly + 3 + row * (double(i) + 0.5);
    cairo_set_source_rgb(cr, c[0], c[1], c[2]);
    cairo_set_line_width(cr, 2.5);
    cairo_move_to(cr, lx + 5, y), cairo_line_to(cr, lx + 25, y), cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, spec.series[i].name, lx + 30, y, 0.0, 0.5, 12);
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void write_plot(const std::string& path, const PlotSpec& spec) {
  const bool svg = ends_with(path, ".svg");
  HG_CHECK(svg || ends_with(path, ".png"), "write_plot", path,
           ": unknown plot format (the name must end in .png or .svg)");
  cairo_surface_t* surface = svg ? cairo_svg_surface_create(path.c_str(), kWidth, kHeight)
                                 : cairo_image_surface_create(CAIRO_FORMAT_RGB24, int(kWidth), int(kHeight));
  cairo_t* cr = cairo_create(surface);
  draw(cr, spec);
  cairo_destroy(cr);
  cairo_status_t status = cairo_surface_status(surface);
  if (status == CAIRO_STATUS_SUCCESS && !svg) status = cairo_surface_write_to_png(surface, path.c_str());
  cairo_surface_finish(surface);  // an SVG is written out here
  if (status == CAIRO_STATUS_SUCCESS) status = cairo_surface_status(surface);
  cairo_surface_destroy(surface);
  // Drop cairo's font caches: a plot is written once or twice per run, and a
  // leak checker (ASan) then sees no cached fonts left at exit.
  cairo_debug_reset_static_data();
  HG_CHECK(status == CAIRO_STATUS_SUCCESS, "write_plot", "cannot write ", path, ": ", cairo_status_to_string(status));
}

#endif  // HG_WITH_CAIRO

}  // namespace hg::cli

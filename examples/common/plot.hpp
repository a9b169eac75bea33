#pragma once
// Line plots through cairo: PNG or SVG (by the file's extension), with a
// title, axis titles, tick labels, a legend and optional log axes. Built only
// when CMake finds cairo (HG_WITH_CAIRO); without it plots_available() is
// false and the programs say that no plot can be written.
#include <string>
#include <vector>

namespace hg::cli {

struct PlotSeries {
  std::string name;          // legend entry
  std::vector<double> x, y;  // points in order; non-finite points are skipped
  bool markers = false;      // draw a dot at every point (sparse series)
};

struct PlotSpec {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  std::vector<PlotSeries> series;
};

bool plots_available();

// Writes `spec` to `path` (.png or .svg). Throws hg::Error when the plot
// cannot be written (no cairo, unknown extension, I/O failure).
void write_plot(const std::string& path, const PlotSpec& spec);

// Why plots are unavailable, for messages ("" when they are available).
std::string plots_unavailable_reason();

}  // namespace hg::cli

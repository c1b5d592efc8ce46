// A small SVG writer for the eval report: heatmap panels (rows x columns of values in
// [0, 1], a red-to-green scale, the value printed in each cell) and line charts with
// error bars (x categorical, evenly spaced; y in [0, 1]). Plain SVG 1.1, no scripts, no
// external fonts, so any browser or rsvg-convert renders it.
#pragma once

#include <string>
#include <vector>

namespace snap::eval {

struct HeatmapPanel {
  std::string title;
  std::vector<std::string> columns;        // x labels
  std::vector<std::string> rows;           // y labels, top to bottom
  std::vector<std::vector<double>> value;  // [row][column] in [0, 1]; NaN = no data
};

// Panels side by side (wrapping after `per_row`), one shared colour scale.
std::string svg_heatmaps(const std::string& title, const std::string& x_label, const std::string& y_label,
                         const std::vector<HeatmapPanel>& panels, int per_row = 3);

struct LineSeries {
  std::string name;
  std::vector<double> y, lo, hi;  // per x position; NaN = no point
};

std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<std::string>& x, const std::vector<LineSeries>& series);

// Escapes & < > " for SVG text.
std::string svg_escape(const std::string& s);

}  // namespace snap::eval

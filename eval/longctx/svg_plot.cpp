// SVG heatmaps and line charts (see svg_plot.h). Coordinates are in pixels; text uses the
// generic sans-serif family so every renderer has a font for it.
#include "eval/longctx/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace snap::eval {

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

namespace {

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

std::string text(double x, double y, const std::string& s, int size, const char* anchor = "middle",
                 const char* extra = "") {
  return "<text x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y) + "\" font-size=\"" + std::to_string(size) +
         "\" text-anchor=\"" + anchor + "\" " + extra + ">" + svg_escape(s) + "</text>\n";
}

// 0 -> red (215,48,39), 0.5 -> yellow (254,224,139), 1 -> green (26,152,80).
std::string colour(double v) {
  if (std::isnan(v)) return "#dddddd";
  v = std::clamp(v, 0.0, 1.0);
  const double a[3] = {215, 48, 39}, m[3] = {254, 224, 139}, b[3] = {26, 152, 80};
  int c[3];
  for (int i = 0; i < 3; ++i) {
    c[i] = static_cast<int>(std::lround(v < 0.5 ? a[i] + (m[i] - a[i]) * v * 2 : m[i] + (b[i] - m[i]) * (v - 0.5) * 2));
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c[0], c[1], c[2]);
  return buf;
}

const char* const k_palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string header(double w, double h) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
         fmt("%.0f", w) + "\" height=\"" + fmt("%.0f", h) + "\" viewBox=\"0 0 " + fmt("%.0f", w) + " " + fmt("%.0f", h) +
         "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
}

}  // namespace

std::string svg_heatmaps(const std::string& title, const std::string& x_label, const std::string& y_label,
                         const std::vector<HeatmapPanel>& panels, int per_row) {
  const double cell_w = 56, cell_h = 26, margin_l = 70, margin_t = 60, gap = 40, title_h = 34;
  size_t max_cols = 1, max_rows = 1;
  for (const auto& p : panels) {
    max_cols = std::max(max_cols, p.columns.size());
    max_rows = std::max(max_rows, p.rows.size());
  }
  // A panel is as wide as its grid or its title (about 7 px per character at 12 px).
  double pw = margin_l + cell_w * max_cols;
  for (const auto& p : panels) pw = std::max(pw, 7.0 * p.title.size() + 10);
  const double ph = title_h + cell_h * max_rows + 40;
  const int cols = std::max(1, std::min<int>(per_row, static_cast<int>(panels.size())));
  const int rows = static_cast<int>((panels.size() + cols - 1) / cols);
  const double w = cols * pw + (cols - 1) * gap + 40, h = margin_t + rows * (ph + gap) + 40;
  std::string s = header(w, h);
  s += text(w / 2, 28, title, 18, "middle", "font-weight=\"bold\"");
  for (size_t i = 0; i < panels.size(); ++i) {
    const HeatmapPanel& p = panels[i];
    const double ox = 20 + (i % cols) * (pw + gap), oy = margin_t + (i / cols) * (ph + gap);
    s += text(ox + pw / 2, oy + 14, p.title, 12, "middle", "font-weight=\"bold\"");
    const double gy = oy + title_h;
    for (size_t r = 0; r < p.rows.size(); ++r) {
      s += text(ox + margin_l - 6, gy + cell_h * r + cell_h * 0.65, p.rows[r], 11, "end");
      for (size_t c = 0; c < p.columns.size(); ++c) {
        const double v = r < p.value.size() && c < p.value[r].size() ? p.value[r][c] : NAN;
        const double x = ox + margin_l + cell_w * c, y = gy + cell_h * r;
        s += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.1f", y) + "\" width=\"" + fmt("%.1f", cell_w) +
             "\" height=\"" + fmt("%.1f", cell_h) + "\" fill=\"" + colour(v) + "\" stroke=\"white\"/>\n";
        s += text(x + cell_w / 2, y + cell_h * 0.65, std::isnan(v) ? "-" : fmt("%.0f", 100 * v), 11);
      }
    }
    for (size_t c = 0; c < p.columns.size(); ++c) {
      s += text(ox + margin_l + cell_w * (c + 0.5), gy + cell_h * p.rows.size() + 14, p.columns[c], 11);
    }
    s += text(ox + margin_l + cell_w * p.columns.size() / 2, gy + cell_h * p.rows.size() + 30, x_label, 11);
    s += text(ox + 12, gy + cell_h * p.rows.size() / 2, y_label, 11, "middle",
              ("transform=\"rotate(-90 " + fmt("%.1f", ox + 12) + " " + fmt("%.1f", gy + cell_h * p.rows.size() / 2) + ")\"")
                  .c_str());
  }
  s += "</svg>\n";
  return s;
}

std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<std::string>& x, const std::vector<LineSeries>& series) {
  const double pw = 520, ph = 300, ml = 70, mt = 50, legend_w = 380;
  double legend = legend_w;
  for (const auto& L : series) legend = std::max(legend, 6.5 * L.name.size() + 40);
  const double w = std::max(ml + pw + 30 + legend, 9.5 * title.size() + 20), h = std::max(mt + ph + 70, mt + 22.0 * series.size() + 40);
  std::string s = header(w, h);
  s += text(10, 26, title, 16, "start", "font-weight=\"bold\"");
  auto px = [&](size_t i) { return ml + (x.size() <= 1 ? pw / 2 : pw * static_cast<double>(i) / (x.size() - 1)); };
  auto py = [&](double v) { return mt + ph * (1 - std::clamp(v, 0.0, 1.0)); };
  for (int t = 0; t <= 4; ++t) {  // y grid at 0, 25, ..., 100 %
    const double y = py(t / 4.0);
    s += "<line x1=\"" + fmt("%.1f", ml) + "\" y1=\"" + fmt("%.1f", y) + "\" x2=\"" + fmt("%.1f", ml + pw) + "\" y2=\"" +
         fmt("%.1f", y) + "\" stroke=\"#e0e0e0\"/>\n";
    s += text(ml - 8, y + 4, fmt("%.0f%%", 25.0 * t), 11, "end");
  }
  s += "<rect x=\"" + fmt("%.1f", ml) + "\" y=\"" + fmt("%.1f", mt) + "\" width=\"" + fmt("%.1f", pw) + "\" height=\"" +
       fmt("%.1f", ph) + "\" fill=\"none\" stroke=\"#333\"/>\n";
  for (size_t i = 0; i < x.size(); ++i) s += text(px(i), mt + ph + 18, x[i], 11);
  s += text(ml + pw / 2, mt + ph + 40, x_label, 12);
  s += text(18, mt + ph / 2, y_label, 12, "middle",
            ("transform=\"rotate(-90 18 " + fmt("%.1f", mt + ph / 2) + ")\"").c_str());
  for (size_t k = 0; k < series.size(); ++k) {
    const LineSeries& L = series[k];
    const char* col = k_palette[k % std::size(k_palette)];
    const double dx = (static_cast<double>(k) - (series.size() - 1) / 2.0) * 3;  // spread the error bars
    std::string path;
    for (size_t i = 0; i < x.size() && i < L.y.size(); ++i) {
      if (std::isnan(L.y[i])) continue;
      path += (path.empty() ? "M" : " L") + fmt("%.1f", px(i) + dx) + " " + fmt("%.1f", py(L.y[i]));
      if (i < L.lo.size() && i < L.hi.size() && !std::isnan(L.lo[i])) {
        s += "<line x1=\"" + fmt("%.1f", px(i) + dx) + "\" y1=\"" + fmt("%.1f", py(L.lo[i])) + "\" x2=\"" +
             fmt("%.1f", px(i) + dx) + "\" y2=\"" + fmt("%.1f", py(L.hi[i])) + "\" stroke=\"" + col +
             "\" stroke-opacity=\"0.5\"/>\n";
      }
      s += "<circle cx=\"" + fmt("%.1f", px(i) + dx) + "\" cy=\"" + fmt("%.1f", py(L.y[i])) + "\" r=\"3.5\" fill=\"" +
           col + "\"/>\n";
    }
    if (!path.empty()) s += "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + col + "\" stroke-width=\"2\"/>\n";
    const double ly = mt + 8 + 22.0 * k;
    s += "<line x1=\"" + fmt("%.1f", ml + pw + 30) + "\" y1=\"" + fmt("%.1f", ly) + "\" x2=\"" +
         fmt("%.1f", ml + pw + 54) + "\" y2=\"" + fmt("%.1f", ly) + "\" stroke=\"" + col + "\" stroke-width=\"3\"/>\n";
    s += text(ml + pw + 60, ly + 4, L.name, 11, "start");
  }
  s += "</svg>\n";
  return s;
}

}  // namespace snap::eval

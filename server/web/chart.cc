#include "server/web/chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/web/html.h"

namespace stoker::web {
namespace {

// About five "nice" tick values (1, 2 or 5 times a power of ten) covering [low, high].
std::vector<double> Ticks(double low, double high) {
  const double span = high - low;
  if (!(span > 0)) return {low};
  const double raw = span / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(low / step) * step; t <= high + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

std::string Coordinate(double v) { return absl::StrFormat("%.2f", v); }

// An axis label: 3 significant digits, thousands and millions as k and M.
std::string TickLabel(double v) {
  const double a = std::abs(v);
  if (a >= 1e6) return absl::StrCat(Number(v / 1e6, 3), "M");
  if (a >= 1e4) return absl::StrCat(Number(v / 1e3, 3), "k");
  return Number(v, 4);
}

}  // namespace

std::string SeriesColor(int i) {
  static constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                             "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return kPalette[i % 10];
}

std::string RenderChart(const Chart& chart) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  int points = 0;
  for (const Series& s : chart.series) {
    for (const ChartPoint& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      x0 = std::min(x0, p.x);
      x1 = std::max(x1, p.x);
      y0 = std::min(y0, p.y);
      y1 = std::max(y1, p.y);
      ++points;
    }
  }
  std::string out = absl::StrCat("<figure><figcaption>", Escape(chart.title), "</figcaption>");
  if (points == 0) {
    absl::StrAppend(&out, "<p class=\"note\">no points yet</p></figure>");
    return out;
  }
  if (chart.y_from_zero) {
    y0 = std::min(y0, 0.0);
    y1 = std::max(y1, 0.0);
  }
  // A flat range gets some room, so that the line sits in the middle.
  if (x1 == x0) {
    x0 -= 1;
    x1 += 1;
  }
  if (y1 == y0) {
    const double pad = y0 == 0 ? 1 : std::abs(y0) * 0.05;
    y0 -= pad;
    y1 += pad;
  }
  const double left = 56, top = 10, right = 12, bottom = 36;
  const double w = chart.width - left - right, h = chart.height - top - bottom;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * w; };
  auto py = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * h; };
  absl::StrAppendFormat(
      &out,
      "<svg class=\"chart\" id=\"%s\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "data-x0=\"%.17g\" data-x1=\"%.17g\" data-y0=\"%.17g\" data-y1=\"%.17g\" "
      "data-box=\"%g %g %g %g\" role=\"img\" aria-label=\"%s\">",
      Escape(chart.id), chart.width, chart.height, chart.width, chart.height, x0, x1, y0, y1, left,
      top, w, h, Escape(chart.title));
  for (const double t : Ticks(y0, y1)) {
    absl::StrAppend(&out, "<line class=\"grid\" x1=\"", Coordinate(left), "\" x2=\"",
                    Coordinate(left + w), "\" y1=\"", Coordinate(py(t)), "\" y2=\"",
                    Coordinate(py(t)), "\"/><text x=\"", Coordinate(left - 4), "\" y=\"",
                    Coordinate(py(t) + 4), "\" text-anchor=\"end\">", TickLabel(t), "</text>");
  }
  for (const double t : Ticks(x0, x1)) {
    absl::StrAppend(&out, "<line class=\"grid\" y1=\"", Coordinate(top), "\" y2=\"",
                    Coordinate(top + h), "\" x1=\"", Coordinate(px(t)), "\" x2=\"",
                    Coordinate(px(t)), "\"/><text y=\"", Coordinate(top + h + 14), "\" x=\"",
                    Coordinate(px(t)), "\" text-anchor=\"middle\">", TickLabel(t), "</text>");
  }
  absl::StrAppend(&out, "<line class=\"axis\" x1=\"", Coordinate(left), "\" x2=\"",
                  Coordinate(left), "\" y1=\"", Coordinate(top), "\" y2=\"", Coordinate(top + h),
                  "\"/><line class=\"axis\" x1=\"", Coordinate(left), "\" x2=\"",
                  Coordinate(left + w), "\" y1=\"", Coordinate(top + h), "\" y2=\"",
                  Coordinate(top + h), "\"/>");
  absl::StrAppend(&out, "<text x=\"", Coordinate(left + w / 2), "\" y=\"",
                  Coordinate(chart.height - 4), "\" text-anchor=\"middle\">", Escape(chart.x_label),
                  "</text><text transform=\"translate(12 ", Coordinate(top + h / 2),
                  ") rotate(-90)\" text-anchor=\"middle\">", Escape(chart.y_label), "</text>");
  for (const Series& s : chart.series) {
    std::string line;
    std::string markers;
    for (const ChartPoint& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      absl::StrAppend(&line, line.empty() ? "" : " ", Coordinate(px(p.x)), ",",
                      Coordinate(py(p.y)));
      if (s.markers) {
        absl::StrAppend(
            &markers, "<circle cx=\"", Coordinate(px(p.x)), "\" cy=\"", Coordinate(py(p.y)),
            "\" r=\"3\" fill=\"", Escape(s.color), "\"><title>", Escape(s.name), ": ",
            Escape(p.label.empty() ? absl::StrCat(Number(p.x, 6), ", ", Number(p.y, 6)) : p.label),
            "</title></circle>");
      }
    }
    if (line.empty()) continue;
    absl::StrAppend(&out, "<g class=\"series\" data-name=\"", Escape(s.name),
                    "\"><polyline fill=\"none\" stroke-width=\"1.6\" stroke=\"", Escape(s.color),
                    "\" points=\"", line, "\"/>", markers, "</g>");
  }
  absl::StrAppend(&out, "</svg><div class=\"legend\">");
  for (const Series& s : chart.series) {
    if (s.points.empty()) continue;
    absl::StrAppend(&out,
                    "<span><svg width=\"14\" height=\"6\"><rect width=\"14\" height=\"4\" "
                    "y=\"1\" fill=\"",
                    Escape(s.color), "\"/></svg> ", Escape(s.name), "</span>");
  }
  absl::StrAppend(&out, "</div></figure>");
  return out;
}

}  // namespace stoker::web

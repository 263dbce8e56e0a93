// Line charts as inline SVG, drawn on the server: no script runs in the page. Each series is a
// <polyline> whose `points` are the plotted pixel positions; the chart carries its mapping
// (data-x0, data-x1, data-y0, data-y1: the data range of the plot area, whose pixel box is
// data-box "left top width height") so that a test can read every plotted point back as data.
// Each point also has a marker with a <title> (its values) when a series has few points.
#ifndef STOKER_SERVER_WEB_CHART_H_
#define STOKER_SERVER_WEB_CHART_H_

#include <string>
#include <vector>

namespace stoker::web {

struct ChartPoint {
  double x = 0;
  double y = 0;
  std::string label = {};  // the marker's tooltip (escaped here); "" = "x, y"
};

struct Series {
  std::string name = {};   // legend (escaped here)
  std::string color = {};  // "#rrggbb"
  std::vector<ChartPoint> points = {};
  bool markers = false;  // draw a marker (with its tooltip) on each point
};

struct Chart {
  std::string id = {};       // the <svg>'s id (letters, digits and '-')
  std::string title = {};    // caption (escaped here)
  std::string x_label = {};  // axis names (escaped here)
  std::string y_label = {};
  std::vector<Series> series = {};
  bool y_from_zero = false;  // the y range includes 0
  int width = 600;
  int height = 260;
};

// The chart as <figure> with a caption, the SVG and a legend; a note in place of the plot when
// no series has a point. Non-finite values are left out.
std::string RenderChart(const Chart& chart);

// A colour for the i-th series of an overlay (cycled).
std::string SeriesColor(int i);

}  // namespace stoker::web

#endif  // STOKER_SERVER_WEB_CHART_H_

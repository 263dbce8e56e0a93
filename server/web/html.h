// Building blocks of the web page's server-rendered HTML: escaping (every text that comes from a
// job, a user or an error goes through Escape), number and time formats, and the page frame.
#ifndef STOKER_SERVER_WEB_HTML_H_
#define STOKER_SERVER_WEB_HTML_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace stoker::web {

// `text` safe inside an element or a double-quoted attribute: & < > " ' escaped, and bytes that
// are not valid UTF-8 or are control characters (other than tab and line breaks) replaced by
// U+FFFD.
std::string Escape(absl::string_view text);

// `text` as a URL path segment or query value (percent-encoded, unreserved characters kept).
std::string UrlEncode(absl::string_view text);

// Milliseconds since the Unix epoch as "2026-12-05 08:12:03 UTC"; "-" for 0.
std::string Clock(int64_t unix_ms);
// A duration in seconds as "1h 02m", "3m 05s", "12s".
std::string Span(double seconds);
// A number with `digits` significant digits ("%.4g"); "-" for a negative (absent) value when
// `absent_below_zero`.
std::string Number(double value, int digits = 4, bool absent_below_zero = false);

struct Frame {
  std::string title = {};   // escaped here
  std::string user = {};    // signed-in user, escaped here ("" = none)
  bool show_nav = true;     // the Jobs / Experiments / Workers links and sign-out
  std::string active = {};  // "jobs", "experiments" or "workers"
};
// A whole page: the head (style sheet /static/style.css, no script), the navigation and `body`
// (HTML, already escaped by its maker).
std::string Page(const Frame& frame, absl::string_view body);

// The style sheet served at /static/style.css.
absl::string_view StyleSheet();

}  // namespace stoker::web

#endif  // STOKER_SERVER_WEB_HTML_H_

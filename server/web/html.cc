#include "server/web/html.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace stoker::web {

std::string Escape(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&quot;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            out += "\xEF\xBF\xBD";
          } else if (c == 0x7f) {
            out += "\xEF\xBF\xBD";
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes; overlong forms,
    // surrogates and values past U+10FFFF are invalid.
    size_t length = 0;
    uint32_t code = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
      code = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      code = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      code = c & 0x07;
    }
    bool valid = length > 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0) == 0x80;
      code = (code << 6) | (next & 0x3F);
    }
    if (valid) {
      valid = !(length == 3 && (code < 0x800 || (code >= 0xD800 && code <= 0xDFFF))) &&
              !(length == 4 && (code < 0x10000 || code > 0x10FFFF));
    }
    if (valid) {
      out.append(text.data() + i, length);
      i += length;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

std::string UrlEncode(absl::string_view text) {
  std::string out;
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += ch;
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

std::string Clock(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string Span(double seconds) {
  if (!(seconds >= 0)) return "-";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%dh %02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm %02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string Number(double value, int digits, bool absent_below_zero) {
  if ((absent_below_zero && value < 0) || !std::isfinite(value)) return "-";
  return absl::StrFormat("%.*g", digits, value);
}

std::string Page(const Frame& frame, absl::string_view body) {
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>",
      Escape(frame.title),
      " - Stoker</title><link rel=\"stylesheet\" href=\"/static/style.css\"></head><body>");
  if (frame.show_nav) {
    absl::StrAppend(&out, "<nav><span class=\"brand\">Stoker</span>");
    for (const auto& [key, label] : {std::pair<const char*, const char*>{"jobs", "Jobs"},
                                     {"experiments", "Experiments"},
                                     {"workers", "Workers"}}) {
      absl::StrAppend(&out, "<a href=\"/", key, "\"", frame.active == key ? " class=\"on\"" : "",
                      ">", label, "</a>");
    }
    if (!frame.user.empty()) {
      absl::StrAppend(&out, "<form class=\"signout\" method=\"post\" action=\"/logout\">",
                      "<span class=\"user\">", Escape(frame.user),
                      "</span><button type=\"submit\">Sign out</button></form>");
    }
    absl::StrAppend(&out, "</nav>");
  }
  absl::StrAppend(&out, "<main>", body, "</main></body></html>\n");
  return out;
}

absl::string_view StyleSheet() {
  return R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
nav { display: flex; gap: 18px; align-items: center; padding: 10px 20px; background: #1d2330; }
nav a { color: #c9d1e0; text-decoration: none; }
nav a.on, nav a:hover { color: #fff; }
nav .brand { color: #ffb74d; font-weight: 700; margin-right: 10px; }
nav .signout { margin-left: auto; display: flex; gap: 10px; align-items: center; }
nav .user { color: #c9d1e0; }
main { padding: 16px 20px; max-width: 1280px; }
h1 { font-size: 20px; margin: 4px 0 12px; }
h2 { font-size: 16px; margin: 20px 0 8px; }
table { border-collapse: collapse; background: #fff; width: 100%; }
th, td { padding: 5px 8px; border-bottom: 1px solid #e3e6eb; text-align: left; vertical-align: top; }
th { background: #eef0f4; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
a { color: #1f5fbf; }
.state { font-weight: 600; }
.state-running { color: #1f7a3a; } .state-failed { color: #b3261e; }
.state-queued { color: #8a6d00; } .state-cancelled, .state-stopped { color: #666; }
.bar { display: inline-block; width: 80px; height: 8px; background: #e3e6eb; margin-right: 6px; }
.bar span { display: block; height: 8px; background: #3f7fd8; }
.bar .w0 { width: 0 } .bar .w1 { width: 10% } .bar .w2 { width: 20% } .bar .w3 { width: 30% }
.bar .w4 { width: 40% } .bar .w5 { width: 50% } .bar .w6 { width: 60% } .bar .w7 { width: 70% }
.bar .w8 { width: 80% } .bar .w9 { width: 90% } .bar .w10 { width: 100% }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: 4px 16px; margin: 0; }
dl.facts dt { color: #5b6475; } dl.facts dd { margin: 0; }
.error { background: #fdecea; border: 1px solid #f3b8b3; padding: 8px 12px; margin-bottom: 12px;
         white-space: pre-wrap; word-break: break-word; }
.note { color: #5b6475; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; background: #fff; border: 1px solid #e3e6eb; padding: 8px; }
figcaption { font-weight: 600; margin-bottom: 4px; }
svg.chart text { font-size: 11px; fill: #5b6475; }
svg.chart .grid { stroke: #eceef2; }
svg.chart .axis { stroke: #9aa3b2; }
.legend { display: flex; flex-wrap: wrap; gap: 10px; font-size: 12px; margin-top: 4px; }
.legend i { display: inline-block; width: 12px; height: 3px; margin-right: 4px; vertical-align: middle; }
.pager { margin: 10px 0; display: flex; gap: 16px; }
td.time { white-space: nowrap; }
.events td.msg { white-space: pre-wrap; word-break: break-word; }
form.login { background: #fff; border: 1px solid #e3e6eb; padding: 20px; max-width: 520px; }
form.login input[type=password] { width: 100%; padding: 6px; margin: 6px 0 12px; font-family: monospace; }
.filters { margin-bottom: 8px; display: flex; gap: 12px; align-items: center; }
)css";
}

}  // namespace stoker::web

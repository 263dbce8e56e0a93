#include "server/web/web_server.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "httplib.h"
#include "server/access/token_secret.h"
#include "server/web/html.h"
#include "server/web/pages.h"
#include "spec/job_spec.h"

namespace stoker::web {
namespace {

constexpr char kCookie[] = "stoker_session";
constexpr size_t kMaxSessions = 10000;
constexpr size_t kMaxFormBytes = 8192;
// Trials whose curves an experiment page draws (the table lists them all).
constexpr int kMaxTrialCurves = 100;

// A page's answer before it is written out.
struct Answer {
  int status = 200;
  std::string content_type = "text/html; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers = {};
};

Answer Redirect(const std::string& location) {
  Answer r;
  r.status = 303;
  r.headers.push_back({"Location", location});
  return r;
}

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    default:
      return 500;
  }
}

// A query or form variable ("" when absent).
std::string Param(const httplib::Params& params, const char* name) {
  const auto it = params.find(name);
  return it == params.end() ? std::string() : it->second;
}

// The session id from the Cookie header ("" = none).
std::string SessionCookie(const httplib::Request& request) {
  for (absl::string_view part : absl::StrSplit(request.get_header_value("Cookie"), ';')) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::ConsumePrefix(&part, kCookie) && absl::ConsumePrefix(&part, "=")) {
      return std::string(part);
    }
  }
  return "";
}

// A POST from another site (its Origin is not this host) is refused: with the SameSite cookie,
// a second guard against cross-site requests.
bool SameOrigin(const httplib::Request& request) {
  const std::string origin = request.get_header_value("Origin");
  if (origin.empty()) return true;
  const size_t scheme = origin.find("://");
  return scheme != std::string::npos &&
         origin.substr(scheme + 3) == request.get_header_value("Host");
}

bool ParseJobState(const std::string& name, v1::JobState* state) {
  for (int s = v1::JOB_STATE_QUEUED; s <= v1::JOB_STATE_STOPPED; ++s) {
    if (JobStateName(static_cast<v1::JobState>(s)) == name) {
      *state = static_cast<v1::JobState>(s);
      return true;
    }
  }
  return false;
}

// HOST:PORT -> host (without brackets) and port; nothing for anything else.
std::optional<std::pair<std::string, int>> SplitHostPort(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return std::nullopt;
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(const WebOptions& options,
                                                            JobQueries* queries,
                                                            Authenticator* auth) {
  const std::optional<std::pair<std::string, int>> address = SplitHostPort(options.listen);
  if (!address.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("web: '", options.listen, "' is not HOST:PORT (e.g. 127.0.0.1:8080)"));
  }
  std::unique_ptr<WebServer> server(new WebServer(options, queries, auth));
  if (options.tls_cert.empty()) {
    server->http_ = std::make_unique<httplib::Server>();
  } else {
    auto https =
        std::make_unique<httplib::SSLServer>(options.tls_cert.c_str(), options.tls_key.c_str());
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "web: cannot load the TLS certificate ", options.tls_cert, " and key ", options.tls_key));
    }
    server->http_ = std::move(https);
  }
  httplib::Server& http = *server->http_;
  const int threads = options.threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(kMaxFormBytes);
  // Headers and body leave in separate writes: without this, Nagle's algorithm holds the body
  // until the client's delayed ACK, 40 ms later, on every page.
  http.set_tcp_nodelay(true);
  http.set_read_timeout(15, 0);
  http.set_write_timeout(15, 0);
  // Every request goes through Handle, whatever its method and path (after cpp-httplib has read
  // its body: a pre-routing handler would run before).
  WebServer* self = server.get();
  const auto handle = [self](const httplib::Request& request, httplib::Response& response) {
    self->Handle(request, response);
  };
  http.Get(".*", handle);
  http.Post(".*", handle);
  http.Put(".*", handle);
  http.Patch(".*", handle);
  http.Delete(".*", handle);
  http.Options(".*", handle);
  const int port =
      address->second == 0
          ? http.bind_to_any_port(address->first)
          : (http.bind_to_port(address->first, address->second) ? address->second : -1);
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("web: cannot listen on ", options.listen,
                     " (is the port in use, or the address not one of this machine's?)"));
  }
  server->port_ = port;
  server->serving_ = std::thread([self] { self->http_->listen_after_bind(); });
  return server;
}

WebServer::WebServer(const WebOptions& options, JobQueries* queries, Authenticator* auth)
    : options_(options), queries_(queries), auth_(auth) {}

WebServer::~WebServer() {
  if (http_ != nullptr) http_->stop();
  if (serving_.joinable()) serving_.join();
}

absl::StatusOr<std::string> WebServer::NewSession(const std::string& token) {
  absl::StatusOr<std::string> id = NewTokenSecret("stks_");
  if (!id.ok()) return id.status();
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  std::erase_if(sessions_, [&](const auto& entry) { return entry.second.expires <= now; });
  while (sessions_.size() >= kMaxSessions) {
    sessions_.erase(std::min_element(
        sessions_.begin(), sessions_.end(),
        [](const auto& a, const auto& b) { return a.second.expires < b.second.expires; }));
  }
  sessions_[HashSecret(*id)] = {token, now + options_.session_lifetime};
  return id;
}

std::optional<WebServer::Session> WebServer::FindSession(const std::string& id) {
  if (id.empty()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  const auto it = sessions_.find(HashSecret(id));
  if (it == sessions_.end()) return std::nullopt;
  if (it->second.expires <= absl::Now()) {
    sessions_.erase(it);
    return std::nullopt;
  }
  return it->second;
}

void WebServer::EndSession(const std::string& id) {
  if (id.empty()) return;
  absl::MutexLock lock(&mu_);
  sessions_.erase(HashSecret(id));
}

void WebServer::Handle(const httplib::Request& request, httplib::Response& response) {
  const std::string& method = request.method;
  const std::string& path = request.path;
  const bool tls = !options_.tls_cert.empty();
  const std::pair<std::string, std::string> clear_cookie = {
      "Set-Cookie", absl::StrCat(kCookie, "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
                                 tls ? "; Secure" : "")};
  auto respond = [&](Answer page) {
    response.status = page.status;
    response.set_header("Cache-Control", "no-store");
    response.set_header("X-Content-Type-Options", "nosniff");
    response.set_header("Referrer-Policy", "same-origin");
    response.set_header("X-Frame-Options", "DENY");
    response.set_header("Content-Security-Policy",
                        "default-src 'none'; style-src 'self'; img-src 'self'; "
                        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'");
    for (const auto& [name, value] : page.headers) response.set_header(name.c_str(), value);
    response.set_content(page.body, page.content_type.c_str());
  };
  if (method != "GET" && method != "POST") {
    return respond({.status = 405,
                    .content_type = "text/plain; charset=utf-8",
                    .body = "only GET and POST\n",
                    .headers = {{"Allow", "GET, POST"}}});
  }
  if (path == "/static/style.css" && method == "GET") {
    return respond({.content_type = "text/css; charset=utf-8", .body = std::string(StyleSheet())});
  }
  if (method == "POST" && !SameOrigin(request)) {
    return respond({.status = 403,
                    .content_type = "text/plain; charset=utf-8",
                    .body = "cross-site form refused\n"});
  }
  if (path == "/login") {
    if (!auth_->required()) return respond(Redirect("/jobs"));
    if (method == "GET") return respond({.body = LoginPage("")});
    // cpp-httplib has parsed the form into the request's parameters, with the URL's query: a
    // token there is refused, as URLs end up in histories and logs.
    httplib::Params query;
    if (const size_t mark = request.target.find('?'); mark != std::string::npos) {
      httplib::detail::parse_query_text(request.target.substr(mark + 1), query);
    }
    if (query.count("token") > 0) {
      return respond(
          {.status = 400, .body = LoginPage("A token never goes in a URL: enter it in the form.")});
    }
    httplib::Params form;
    httplib::detail::parse_query_text(request.body, form);
    const std::string token(absl::StripAsciiWhitespace(
        form.count("token") > 0 ? Param(form, "token") : Param(request.params, "token")));
    absl::StatusOr<Principal> who = token.empty() ? absl::UnauthenticatedError("enter a token")
                                                  : auth_->AuthenticateToken(token, true);
    if (who.ok() && !Authorize(*who, Action::kListJobs, {}).ok()) {
      who = absl::PermissionDeniedError(
          "this is a worker's token, which cannot sign in; use a user token (stoker token create)");
    }
    if (!who.ok()) {
      return respond({.status = 401, .body = LoginPage(std::string(who.status().message()))});
    }
    absl::StatusOr<std::string> session = NewSession(token);
    if (!session.ok()) {
      return respond({.status = 500, .body = LoginPage("cannot make a session; try again")});
    }
    Answer r = Redirect("/jobs");
    r.headers.push_back(
        {"Set-Cookie",
         absl::StrCat(kCookie, "=", *session, "; Path=/; HttpOnly; SameSite=Strict; Max-Age=",
                      absl::ToInt64Seconds(options_.session_lifetime), tls ? "; Secure" : "")});
    return respond(std::move(r));
  }
  if (path == "/logout") {
    if (method != "POST") return respond(Redirect("/jobs"));
    EndSession(SessionCookie(request));
    Answer r = Redirect(auth_->required() ? "/login" : "/jobs");
    r.headers.push_back(clear_cookie);
    return respond(std::move(r));
  }
  if (method != "GET") {
    return respond({.status = 405,
                    .content_type = "text/plain; charset=utf-8",
                    .body = "only GET here\n",
                    .headers = {{"Allow", "GET"}}});
  }

  // Every page below needs the caller.
  absl::StatusOr<Principal> who = Principal{};
  Frame frame;
  if (auth_->required()) {
    const std::string cookie = SessionCookie(request);
    const std::optional<Session> session = FindSession(cookie);
    if (!session.has_value()) {
      Answer r = Redirect("/login");
      if (!cookie.empty()) r.headers.push_back(clear_cookie);
      return respond(std::move(r));
    }
    who = auth_->AuthenticateToken(session->token, true);
    if (!who.ok()) {
      EndSession(cookie);
      Answer r{.status = 401,
               .body = LoginPage(absl::StrCat("Signed out: ", who.status().message()))};
      r.headers.push_back(clear_cookie);
      return respond(std::move(r));
    }
    frame.user = who->Name();
    if (frame.user.empty()) frame.user = "legacy token";
  }
  auto fail = [&](const absl::Status& status) {
    frame.title = "Error";
    const int code = HttpStatusOf(status);
    return respond({.status = code, .body = ErrorPage(frame, code, std::string(status.message()))});
  };

  if (path == "/" || path.empty()) return respond(Redirect("/jobs"));
  if (path == "/jobs") {
    frame.title = "Jobs";
    frame.active = "jobs";
    JobListQuery q{.state = Param(request.params, "state"),
                   .before_id = Param(request.params, "before"),
                   .all = Param(request.params, "all") == "1",
                   .may_list_all = who->IsClusterAdmin() && who->kind != Principal::Kind::kOpen};
    v1::ListJobsRequest list;
    list.set_limit(50);
    list.set_before_id(q.before_id);
    list.set_all(q.all);
    if (!q.state.empty()) {
      v1::JobState state;
      if (!ParseJobState(q.state, &state)) {
        return fail(absl::InvalidArgumentError(absl::StrCat("no job state '", q.state, "'")));
      }
      list.add_states(state);
    }
    absl::StatusOr<v1::ListJobsResponse> jobs = queries_->ListJobs(*who, list);
    if (!jobs.ok()) return fail(jobs.status());
    return respond({.body = JobListPage(frame, q, *jobs)});
  }
  if (absl::StartsWith(path, "/jobs/")) {
    const std::string id = path.substr(6);
    frame.title = absl::StrCat("Job ", id);
    frame.active = "jobs";
    absl::StatusOr<v1::Job> job = queries_->AuthorizedJob(*who, Action::kViewJob, id);
    if (!job.ok()) return fail(job.status());
    History history;
    std::vector<v1::JobEvent> events;
    // Curves and events are as readable as the job's logs.
    v1::GetMetricsRequest metrics;
    metrics.set_job_id(id);
    metrics.set_limit(10000);
    while (true) {
      absl::StatusOr<v1::GetMetricsResponse> page = queries_->Metrics(*who, metrics);
      if (!page.ok()) {
        if (!absl::IsPermissionDenied(page.status())) return fail(page.status());
        history.readable = false;
        break;
      }
      history.epochs.insert(history.epochs.end(), page->epochs().begin(), page->epochs().end());
      history.steps.insert(history.steps.end(), page->steps().begin(), page->steps().end());
      if (!page->more()) break;
      int64_t last = metrics.after_step();
      if (!page->epochs().empty()) last = std::max(last, page->epochs().rbegin()->step());
      if (!page->steps().empty()) last = std::max(last, page->steps().rbegin()->step());
      if (last == metrics.after_step()) break;
      metrics.set_after_step(last);
    }
    if (absl::StatusOr<std::vector<v1::JobEvent>> recent = queries_->RecentEvents(*who, id, 100);
        recent.ok()) {
      events = std::move(*recent);
    }
    return respond({.body = JobPage(frame, *job, history, events)});
  }
  if (path == "/experiments") {
    frame.title = "Experiments";
    frame.active = "experiments";
    v1::ListExperimentsRequest list;
    list.set_limit(200);
    absl::StatusOr<v1::ListExperimentsResponse> experiments = queries_->ListExperiments(*who, list);
    if (!experiments.ok()) return fail(experiments.status());
    return respond({.body = ExperimentListPage(frame, *experiments)});
  }
  if (absl::StartsWith(path, "/experiments/")) {
    const std::string id = path.substr(13);
    frame.title = absl::StrCat("Experiment ", id);
    frame.active = "experiments";
    absl::StatusOr<v1::Experiment> experiment =
        queries_->AuthorizedExperiment(*who, Action::kViewJob, id);
    if (!experiment.ok()) return fail(experiment.status());
    v1::ListJobsRequest list;
    list.set_experiment(id);
    list.set_limit(10000);
    absl::StatusOr<v1::ListJobsResponse> jobs = queries_->ListJobs(*who, list);
    if (!jobs.ok()) return fail(jobs.status());
    std::map<std::string, v1::Job> by_id;
    for (const v1::Job& job : jobs->jobs()) by_id[job.id()] = job;
    std::vector<TrialRow> rows;
    std::map<std::string, History> histories;
    for (const v1::ExperimentTrial& trial : experiment->trials()) {
      TrialRow& row = rows.emplace_back();
      row.trial = trial;
      const auto job = by_id.find(trial.job_id());
      if (job == by_id.end()) continue;
      row.job = job->second;
      v1::GetMetricsRequest metrics;
      metrics.set_job_id(trial.job_id());
      metrics.set_limit(10000);
      absl::StatusOr<v1::GetMetricsResponse> page = queries_->Metrics(*who, metrics);
      if (!page.ok()) continue;
      SetTrialMetric(*experiment, {page->epochs().begin(), page->epochs().end()}, &row);
      if (static_cast<int>(histories.size()) < kMaxTrialCurves) {
        History& h = histories[trial.job_id()];
        h.epochs.assign(page->epochs().begin(), page->epochs().end());
        h.steps.assign(page->steps().begin(), page->steps().end());
      }
    }
    return respond({.body = ExperimentPage(frame, *experiment, rows, histories)});
  }
  if (path == "/workers") {
    frame.title = "Workers";
    frame.active = "workers";
    absl::StatusOr<v1::ListWorkersResponse> workers = queries_->ListWorkers(*who);
    if (!workers.ok()) return fail(workers.status());
    return respond({.body = WorkersPage(frame, *workers)});
  }
  frame.title = "Not found";
  return respond({.status = 404, .body = ErrorPage(frame, 404, absl::StrCat("no page ", path))});
}

}  // namespace stoker::web

#include "server/web/web_server.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "civetweb.h"
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

struct Response {
  int status = 200;
  std::string content_type = "text/html; charset=utf-8";
  std::string body;
  std::vector<std::string> headers;  // "Name: value"
};

Response Redirect(const std::string& location) {
  Response r;
  r.status = 303;
  r.headers.push_back(absl::StrCat("Location: ", location));
  return r;
}

const char* StatusText(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 303:
      return "See Other";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    default:
      return "Internal Server Error";
  }
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

void Send(mg_connection* connection, const Response& r) {
  std::string head =
      absl::StrCat("HTTP/1.1 ", r.status, " ", StatusText(r.status),
                   "\r\nContent-Type: ", r.content_type, "\r\nContent-Length: ", r.body.size(),
                   "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                   "Referrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\n"
                   "Content-Security-Policy: default-src 'none'; style-src 'self'; img-src 'self'; "
                   "form-action 'self'; frame-ancestors 'none'; base-uri 'none'\r\n"
                   "Connection: close\r\n");
  for (const std::string& header : r.headers) absl::StrAppend(&head, header, "\r\n");
  absl::StrAppend(&head, "\r\n");
  mg_write(connection, head.data(), head.size());
  if (!r.body.empty()) mg_write(connection, r.body.data(), r.body.size());
}

// A form or query variable ("" when absent or too long).
std::string Var(const std::string& data, const char* name) {
  std::vector<char> value(std::max<size_t>(data.size() + 1, 16));
  const int n = mg_get_var(data.data(), data.size(), name, value.data(), value.size());
  return n > 0 ? std::string(value.data(), n) : std::string();
}

std::string Header(mg_connection* connection, const char* name) {
  const char* value = mg_get_header(connection, name);
  return value == nullptr ? std::string() : std::string(value);
}

// The session id from the Cookie header ("" = none).
std::string SessionCookie(mg_connection* connection) {
  const std::string cookies = Header(connection, "Cookie");
  if (cookies.empty()) return "";
  char value[256];
  const int n = mg_get_cookie(cookies.c_str(), kCookie, value, sizeof(value));
  return n > 0 ? std::string(value, n) : std::string();
}

// A POST from another site (its Origin is not this host) is refused: with the SameSite cookie,
// a second guard against cross-site requests.
bool SameOrigin(mg_connection* connection) {
  const std::string origin = Header(connection, "Origin");
  if (origin.empty() || origin == "null") return origin.empty();
  const std::string host = Header(connection, "Host");
  const size_t scheme = origin.find("://");
  return scheme != std::string::npos && origin.substr(scheme + 3) == host;
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

int HandleRequest(mg_connection* connection, void* server) {
  return static_cast<WebServer*>(server)->Handle(connection);
}

int InitSsl(void* ssl_context, void* user_data) {
  return static_cast<WebServer*>(user_data)->InitTls(ssl_context);
}

int LogMessage(const mg_connection*, const char* message) {
  // civetweb's own complaints (a bad request line, a TLS handshake that failed) are not ours to
  // print on every occurrence; errors that stop the server are returned by Start.
  (void)message;
  return 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(const WebOptions& options,
                                                            JobQueries* queries,
                                                            Authenticator* auth) {
  std::unique_ptr<WebServer> server(new WebServer(options, queries, auth));
  const bool tls = !options.tls_cert.empty();
  const std::string ports = absl::StrCat(options.listen, tls ? "s" : "");
  const std::string threads = absl::StrCat(options.threads);
  const char* config[] = {"listening_ports",
                          ports.c_str(),
                          "num_threads",
                          threads.c_str(),
                          "request_timeout_ms",
                          "15000",
                          "enable_directory_listing",
                          "no",
                          nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = LogMessage;
  if (tls) callbacks.init_ssl = InitSsl;
  mg_init_library(tls ? MG_FEATURES_TLS : 0);
  server->context_ = mg_start(&callbacks, server.get(), config);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "web: cannot serve on ", options.listen,
        server->tls_error_.empty() ? " (is the port in use, or the address not this machine's?)"
                                   : absl::StrCat(": ", server->tls_error_)));
  }
  mg_set_request_handler(server->context_, "/", HandleRequest, server.get());
  mg_server_port bound[4];
  const int n = mg_get_server_ports(server->context_, 4, bound);
  if (n > 0) server->port_ = bound[0].port;
  return server;
}

WebServer::~WebServer() {
  if (context_ != nullptr) mg_stop(context_);
}

int WebServer::InitTls(void* ssl_context) {
  SSL_CTX* context = static_cast<SSL_CTX*>(ssl_context);
  if (SSL_CTX_use_certificate_chain_file(context, options_.tls_cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(context, options_.tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(context) != 1) {
    char error[256];
    ERR_error_string_n(ERR_get_error(), error, sizeof(error));
    tls_error_ =
        absl::StrCat("cannot load ", options_.tls_cert, " and ", options_.tls_key, ": ", error);
    return -1;
  }
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  return 1;  // configured here; civetweb needs no certificate option
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

int WebServer::Handle(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  const std::string method = request->request_method ? request->request_method : "";
  const std::string path = request->local_uri ? request->local_uri : "/";
  const std::string query = request->query_string ? request->query_string : "";
  const bool tls = !options_.tls_cert.empty();
  const std::string clear_cookie =
      absl::StrCat("Set-Cookie: ", kCookie, "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
                   tls ? "; Secure" : "");
  auto respond = [&](Response r) {
    Send(connection, r);
    return r.status;
  };
  if (method != "GET" && method != "POST") {
    return respond({.status = 405,
                    .content_type = "text/plain; charset=utf-8",
                    .body = "only GET and POST\n",
                    .headers = {"Allow: GET, POST"}});
  }
  if (path == "/static/style.css" && method == "GET") {
    return respond({.content_type = "text/css; charset=utf-8", .body = std::string(StyleSheet())});
  }
  if (method == "POST" && !SameOrigin(connection)) {
    return respond({.status = 403,
                    .content_type = "text/plain; charset=utf-8",
                    .body = "cross-site form refused\n"});
  }
  if (path == "/login") {
    if (!auth_->required()) return respond(Redirect("/jobs"));
    if (method == "GET") return respond({.body = LoginPage("")});
    std::string form(std::min<long long>(
                         request->content_length < 0 ? kMaxFormBytes + 1 : request->content_length,
                         kMaxFormBytes + 1),
                     '\0');
    if (form.size() > kMaxFormBytes) {
      return respond({.status = 413, .body = LoginPage("The form is too large.")});
    }
    size_t got = 0;
    while (got < form.size()) {
      const int n = mg_read(connection, form.data() + got, form.size() - got);
      if (n <= 0) break;
      got += n;
    }
    form.resize(got);
    const std::string token = Var(form, "token");
    absl::StatusOr<Principal> who =
        token.empty()
            ? absl::UnauthenticatedError("enter a token")
            : auth_->AuthenticateToken(std::string(absl::StripAsciiWhitespace(token)), true);
    if (who.ok() && !Authorize(*who, Action::kListJobs, {}).ok()) {
      who = absl::PermissionDeniedError(
          "this is a worker's token, which cannot sign in; use a user token (stoker token create)");
    }
    if (!who.ok()) {
      return respond({.status = 401, .body = LoginPage(std::string(who.status().message()))});
    }
    absl::StatusOr<std::string> session =
        NewSession(std::string(absl::StripAsciiWhitespace(token)));
    if (!session.ok()) {
      return respond({.status = 500, .body = LoginPage("cannot make a session; try again")});
    }
    Response r = Redirect("/jobs");
    r.headers.push_back(absl::StrCat(
        "Set-Cookie: ", kCookie, "=", *session, "; Path=/; HttpOnly; SameSite=Strict; Max-Age=",
        absl::ToInt64Seconds(options_.session_lifetime), tls ? "; Secure" : ""));
    return respond(std::move(r));
  }
  if (path == "/logout") {
    if (method != "POST") return respond(Redirect("/jobs"));
    EndSession(SessionCookie(connection));
    Response r = Redirect(auth_->required() ? "/login" : "/jobs");
    r.headers.push_back(clear_cookie);
    return respond(std::move(r));
  }
  if (method != "GET") {
    return respond({.status = 405,
                    .content_type = "text/plain; charset=utf-8",
                    .body = "only GET here\n",
                    .headers = {"Allow: GET"}});
  }

  // Every page below needs the caller.
  absl::StatusOr<Principal> who = Principal{};
  Frame frame;
  if (auth_->required()) {
    const std::string cookie = SessionCookie(connection);
    const std::optional<Session> session = FindSession(cookie);
    if (!session.has_value()) {
      Response r = Redirect("/login");
      if (!cookie.empty()) r.headers.push_back(clear_cookie);
      return respond(std::move(r));
    }
    who = auth_->AuthenticateToken(session->token, true);
    if (!who.ok()) {
      EndSession(cookie);
      Response r{.status = 401,
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
    JobListQuery q{.state = Var(query, "state"),
                   .before_id = Var(query, "before"),
                   .all = Var(query, "all") == "1",
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
        if (absl::IsPermissionDenied(page.status())) break;
        return fail(page.status());
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

// The web page (stoker-server --web-listen, issue 33) on a real cluster: sign-in with a token
// over the gRPC port's TLS certificate, the session cookie's flags, cross-site forms, another
// team's job, a disabled user's session (curl, below); then the pages in a real Chromium driven
// over WebDriver by tests/web/browser_check.py: the plotted points of a job's curves and of an
// experiment's overlaid trials against the stored metric history, HTML in job fields shown as
// text, screenshots saved for a person to look at. Skipped without chromium and chromedriver,
// which the README's test command installs.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

struct Http {
  int status = 0;
  std::string headers;
  std::string body;
  // The first header `name` ("" = none), case-insensitively.
  std::string Header(const std::string& name) const {
    std::istringstream lines(headers);
    for (std::string line; std::getline(lines, line);) {
      if (line.size() > name.size() && line[name.size()] == ':' &&
          absl::EqualsIgnoreCase(line.substr(0, name.size()), name)) {
        return std::string(absl::StripAsciiWhitespace(line.substr(name.size() + 1)));
      }
    }
    return "";
  }
};

// curl with `args`; the response's status, headers and body.
Http Curl(const std::string& args) {
  CommandResult r = RunCommand("curl -sS -i --max-time 20 " + args + " 2>&1");
  Http http;
  const size_t end = r.output.find("\r\n\r\n");
  if (r.exit_code != 0 || end == std::string::npos || !absl::StartsWith(r.output, "HTTP/")) {
    http.body = r.output;
    return http;
  }
  http.headers = r.output.substr(0, end);
  http.body = r.output.substr(end + 4);
  http.status = std::atoi(http.headers.c_str() + http.headers.find(' ') + 1);
  return http;
}

// A cluster with users: root (cluster admin), alice in team vision, dave in team nlp, each with
// a token file DIR/USER.token.
class WebCluster {
 public:
  // Flags of every CLI call (e.g. --tls-ca).
  void set_cli_flags(std::string flags) { cli_flags_ = std::move(flags); }

  void Start(const std::vector<std::string>& flags) {
    cluster.StartServer(flags);
    CommandResult boot =
        RunCommand(absl::StrCat("(", STOKER_SERVER_PATH_FOR_TEST, " bootstrap-admin --state-dir ",
                                cluster.dir(), "/server --user root 2>/dev/null)"));
    ASSERT_EQ(boot.exit_code, 0) << boot.output;
    WriteFile(cluster.dir() + "/root.token", boot.output);
    for (const char* team : {"vision", "nlp"}) {
      ASSERT_EQ(As("root", absl::StrCat("team create ", team)).exit_code, 0);
    }
    for (const auto& [user, team] :
         {std::pair<const char*, const char*>{"alice", "vision"}, {"dave", "nlp"}}) {
      CommandResult added = As("root", absl::StrCat("user add ", user, " --team ", team,
                                                    " --token-out ", TokenFile(user)));
      ASSERT_EQ(added.exit_code, 0) << added.output;
    }
  }
  std::string TokenFile(const std::string& user) const {
    return cluster.dir() + "/" + user + ".token";
  }
  std::string Token(const std::string& user) const {
    return std::string(absl::StripAsciiWhitespace(ReadAll(TokenFile(user))));
  }
  CommandResult As(const std::string& user, const std::string& args) {
    return cluster.Cli(absl::StrCat(cli_flags_, " --token-file ", TokenFile(user), " ", args));
  }
  // Submits a job file as `user`; the id it printed ("j-..." or "e-...").
  std::string Submit(const std::string& user, const std::string& name, const std::string& yaml) {
    const std::string path = WriteFile(cluster.dir() + "/" + name + ".yaml", yaml);
    CommandResult submitted = As(user, "submit " + path);
    EXPECT_EQ(submitted.exit_code, 0) << submitted.output;
    const size_t at = submitted.output.find("submitted ");
    if (at == std::string::npos) return "";
    std::string rest = submitted.output.substr(at + 10);
    if (absl::StartsWith(rest, "experiment ")) rest = rest.substr(11);
    return rest.substr(0, 8);
  }

  TestCluster cluster;

 private:
  std::string cli_flags_;
};

std::string JobYaml(const std::string& name, const std::string& data, const std::string& model,
                    const std::string& train, const std::string& extra = "") {
  return absl::StrCat("name: ", name, "\ndataset:\n  format: idx\n", data,
                      "  classes: 10\nmodel: ", model, "\nresources: {cpus: 1}\ntrain: ", train,
                      "\n", extra);
}

// Fashion-MNIST under the default data root, and under the short names of a test's data root.
constexpr char kFmnistDefaultRoot[] = R"(  train_images: fashion-mnist/train-images-idx3-ubyte.gz
  train_labels: fashion-mnist/train-labels-idx1-ubyte.gz
  test_images: fashion-mnist/t10k-images-idx3-ubyte.gz
  test_labels: fashion-mnist/t10k-labels-idx1-ubyte.gz
)";
constexpr char kFmnist[] = R"(  train_images: train-images.gz
  train_labels: train-labels.gz
  test_images: test-images.gz
  test_labels: test-labels.gz
)";

// Sign-in over HTTPS with the gRPC port's certificate and the same tokens: only a session cookie
// (HttpOnly, Secure, SameSite=Strict) reaches the browser, a wrong or worker token is refused, a
// cross-site form is refused, another team's job is not found, a disabled user's session ends at
// once, signing out ends it too, and no secret lands in the server's log.
TEST(WebTest, SignInOverTlsKeepsOnlyASessionCookieAndTheRulesOfTheApi) {
  WebCluster web;
  const std::string d = web.cluster.dir();
  CommandResult made = RunCommand(absl::StrCat(
      "(cd ", d, " && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=stoker-test-ca ",
      "-keyout ca.key -out ca.pem && openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 ",
      "-keyout server.key -out server.csr && printf 'subjectAltName=IP:127.0.0.1' > san.ext && ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 ",
      "-extfile san.ext -out server.pem) 2>&1"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  web.set_cli_flags(absl::StrCat("--tls-ca ", d, "/ca.pem"));
  ASSERT_NO_FATAL_FAILURE(web.Start({"--tls-cert", d + "/server.pem", "--tls-key",
                                     d + "/server.key", "--web-listen", "127.0.0.1:0"}));
  const int port = web.cluster.ServerWebPort();
  ASSERT_GT(port, 0) << ReadAll(d + "/server.log");
  EXPECT_TRUE(absl::StrContains(ReadAll(d + "/server.log"), "(https)"));
  const std::string base = absl::StrCat("https://127.0.0.1:", port);
  // curl checks the certificate against the test CA: the page serves the gRPC port's certificate.
  const std::string tls = absl::StrCat("--cacert ", d, "/ca.pem ");
  const std::string job = JobYaml("alices-job", kFmnistDefaultRoot, "{type: mlp, hidden: [8]}",
                                  "{epochs: 1, batch_size: 50}");
  const std::string alices = web.Submit("alice", "alice", job);
  const std::string daves =
      web.Submit("dave", "dave", absl::StrReplaceAll(job, {{"alices", "daves"}}));
  ASSERT_TRUE(absl::StartsWith(alices, "j-")) << alices;
  // A job named with HTML and script is refused at the door, with the reason.
  const std::string named =
      WriteFile(d + "/named.yaml",
                absl::StrReplaceAll(job, {{"alices-job", "\"<script>alert(1)</script>\""}}));
  CommandResult refused = web.As("alice", "submit " + named);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(absl::StrContains(refused.output, "name")) << refused.output;

  // Plain HTTP gets no page from an HTTPS port.
  EXPECT_EQ(Curl(absl::StrCat("http://127.0.0.1:", port, "/jobs")).status, 0);
  Http page = Curl(tls + base + "/jobs");
  EXPECT_EQ(page.status, 303) << page.headers << page.body;
  EXPECT_EQ(page.Header("Location"), "/login");
  page = Curl(tls + base + "/login");
  EXPECT_EQ(page.status, 200);
  EXPECT_TRUE(absl::StrContains(page.Header("Content-Security-Policy"), "default-src 'none'"));
  EXPECT_TRUE(absl::StrContains(page.body, "type=\"password\""));

  const std::string wrong = WriteFile(d + "/wrong.token", "stku_" + std::string(64, '0'));
  page = Curl(absl::StrCat(tls, "--data-urlencode token@", wrong, " ", base, "/login"));
  EXPECT_EQ(page.status, 401);
  EXPECT_TRUE(absl::StrContains(page.body, "invalid bearer token")) << page.body;
  EXPECT_EQ(page.Header("Set-Cookie"), "");
  ASSERT_EQ(web.As("root", "worker join-token --token-out " + d + "/join.token").exit_code, 0);
  page = Curl(absl::StrCat(tls, "--data-urlencode token@", d, "/join.token ", base, "/login"));
  EXPECT_EQ(page.status, 401) << page.body;
  EXPECT_EQ(page.Header("Set-Cookie"), "") << "a worker credential cannot sign in";
  // A form posted from another site.
  page = Curl(absl::StrCat(tls, "-H 'Origin: https://evil.example' --data-urlencode token@",
                           web.TokenFile("alice"), " ", base, "/login"));
  EXPECT_EQ(page.status, 403);
  EXPECT_EQ(page.Header("Set-Cookie"), "");

  page = Curl(absl::StrCat(tls, "-H 'Origin: ", base, "' --data-urlencode token@",
                           web.TokenFile("alice"), " ", base, "/login"));
  ASSERT_EQ(page.status, 303) << page.body;
  EXPECT_EQ(page.Header("Location"), "/jobs");
  const std::string cookie = page.Header("Set-Cookie");
  EXPECT_TRUE(absl::StartsWith(cookie, "stoker_session=stks_")) << cookie;
  for (const char* flag : {"HttpOnly", "Secure", "SameSite=Strict", "Path=/"}) {
    EXPECT_TRUE(absl::StrContains(cookie, flag)) << flag << " missing: " << cookie;
  }
  EXPECT_FALSE(absl::StrContains(page.headers + page.body, web.Token("alice").substr(5)));
  const std::string session = cookie.substr(0, cookie.find(';'));
  const std::string as_alice = absl::StrCat(tls, "-H 'Cookie: ", session, "' ");

  page = Curl(as_alice + base + "/jobs");
  EXPECT_EQ(page.status, 200);
  EXPECT_TRUE(absl::StrContains(page.body, alices)) << page.body;
  EXPECT_FALSE(absl::StrContains(page.body, daves)) << "another team's job is listed";
  EXPECT_TRUE(absl::StrContains(page.body, "alice")) << "the signed-in user is shown";
  page = Curl(as_alice + base + "/jobs/" + daves);
  EXPECT_EQ(page.status, 404);
  EXPECT_FALSE(absl::StrContains(page.body, "daves-job"));
  page = Curl(as_alice + base + "/jobs/" + alices);
  EXPECT_EQ(page.status, 200);
  EXPECT_TRUE(absl::StrContains(page.body, "alices-job"));
  EXPECT_EQ(Curl(as_alice + base + "/jobs?all=1").status, 403) << "--all is for cluster admins";
  EXPECT_EQ(Curl(as_alice + base + "/jobs?before=j-999999").status, 400);
  EXPECT_EQ(Curl(as_alice + base + "/jobs?state=exploded").status, 400);
  EXPECT_EQ(Curl(as_alice + base + "/workers").status, 200);
  EXPECT_EQ(Curl(as_alice + base + "/experiments").status, 200);
  EXPECT_EQ(Curl(as_alice + base + "/nothing-here").status, 404);
  EXPECT_EQ(Curl(as_alice + "-X DELETE " + base + "/jobs").status, 405);
  // A made-up session is no session.
  page = Curl(absl::StrCat(tls, "-H 'Cookie: stoker_session=stks_", std::string(64, 'a'), "' ",
                           base, "/jobs"));
  EXPECT_EQ(page.status, 303);

  // A viewer of alice's team sees her job but not its curves and events, and is told why.
  ASSERT_EQ(web.As("root", "user add carol --team vision --role viewer --token-out " +
                               web.TokenFile("carol"))
                .exit_code,
            0);
  page = Curl(
      absl::StrCat(tls, "--data-urlencode token@", web.TokenFile("carol"), " ", base, "/login"));
  ASSERT_EQ(page.status, 303);
  const std::string as_carol = absl::StrCat(
      tls, "-H 'Cookie: ", page.Header("Set-Cookie").substr(0, page.Header("Set-Cookie").find(';')),
      "' ");
  page = Curl(as_carol + base + "/jobs/" + alices);
  EXPECT_EQ(page.status, 200);
  EXPECT_TRUE(absl::StrContains(page.body, "id=\"not-readable\"")) << page.body;
  EXPECT_FALSE(absl::StrContains(page.body, "id=\"chart-loss\""));

  // Disabling the user ends its session at the next request.
  ASSERT_EQ(web.As("root", "user disable alice").exit_code, 0);
  page = Curl(as_alice + base + "/jobs");
  EXPECT_EQ(page.status, 401) << page.body;
  EXPECT_TRUE(absl::StrContains(page.Header("Set-Cookie"), "Max-Age=0"));
  EXPECT_EQ(Curl(as_alice + base + "/jobs").status, 303) << "the session is gone";

  // Signing out ends a session.
  page = Curl(
      absl::StrCat(tls, "--data-urlencode token@", web.TokenFile("dave"), " ", base, "/login"));
  ASSERT_EQ(page.status, 303);
  const std::string daves_session =
      page.Header("Set-Cookie").substr(0, page.Header("Set-Cookie").find(';'));
  const std::string as_dave = absl::StrCat(tls, "-H 'Cookie: ", daves_session, "' ");
  EXPECT_EQ(Curl(as_dave + base + "/jobs").status, 200);
  page = Curl(as_dave + "-d '' " + base + "/logout");
  EXPECT_EQ(page.status, 303);
  EXPECT_EQ(page.Header("Location"), "/login");
  EXPECT_EQ(Curl(as_dave + base + "/jobs").status, 303);

  const std::string log = ReadAll(d + "/server.log");
  for (const char* user : {"alice", "dave"}) {
    EXPECT_FALSE(absl::StrContains(log, web.Token(user).substr(5))) << "a token in the log";
  }
  EXPECT_FALSE(absl::StrContains(log, session.substr(15))) << "a session id in the log";
}

// The page on a non-loopback address needs TLS (or --insecure), as the gRPC port does.
TEST(WebTest, APlaintextPageOffLoopbackIsRefused) {
  CommandResult refused = RunCommand(absl::StrCat(
      STOKER_SERVER_PATH_FOR_TEST, " --state-dir /tmp/stoker-web-refused-$$ --web-listen ",
      "0.0.0.0:0 2>&1; echo exit=$?"));
  EXPECT_TRUE(absl::StrContains(refused.output, "refusing to serve 0.0.0.0:0 without TLS"))
      << refused.output;
  EXPECT_TRUE(absl::StrContains(refused.output, "exit=2")) << refused.output;
}

// A job's metric history as JSON arrays (see tests/web/browser_check.py).
std::string HistoryJson(const std::string& address, const std::string& token,
                        const std::string& job_id, bool accuracy_only) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto jobs = v1::JobService::NewStub(channel);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + token);
  v1::GetMetricsRequest request;
  request.set_job_id(job_id);
  request.set_limit(10000);
  v1::GetMetricsResponse metrics;
  const grpc::Status status = jobs->GetMetrics(&context, request, &metrics);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(metrics.epochs().empty()) << job_id << " has no epoch points";
  std::vector<std::string> epochs, steps;
  for (const v1::MetricPoint& p : metrics.epochs()) {
    epochs.push_back(accuracy_only
                         ? absl::StrFormat("[%d, %.17g]", p.epoch(), p.test_accuracy())
                         : absl::StrFormat("[%d, %d, %.17g, %.17g, %.17g, %.17g, %.17g, %d]",
                                           p.epoch(), p.step(), p.train_loss(), p.test_loss(),
                                           p.test_accuracy(), p.samples_per_second(),
                                           p.data_stall_ratio(), p.time_unix_ms()));
  }
  if (accuracy_only) return absl::StrCat("[", absl::StrJoin(epochs, ", "), "]");
  for (const v1::MetricPoint& p : metrics.steps()) {
    steps.push_back(absl::StrFormat("[%d, %.17g, %.17g, %.17g, %d]", p.step(), p.train_loss(),
                                    p.samples_per_second(), p.data_stall_ratio(),
                                    p.time_unix_ms()));
  }
  return absl::StrCat("{\"id\": \"", job_id, "\", \"epochs\": [", absl::StrJoin(epochs, ", "),
                      "], \"steps\": [", absl::StrJoin(steps, ", "), "]}");
}

// Polls (as root) until every one of `ids` is final.
void WaitFinal(WebCluster& web, const std::vector<std::string>& ids, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (const std::string& id : ids) {
    while (true) {
      CommandResult status = web.As("root", "status " + id);
      if (absl::StrContains(status.output, "state:          succeeded") ||
          absl::StrContains(status.output, "state:          failed") ||
          absl::StrContains(status.output, "state:          cancelled") ||
          absl::StrContains(status.output, "state:          stopped")) {
        break;
      }
      ASSERT_LT(absl::Now(), deadline) << id << " did not finish:\n" << status.output;
      absl::SleepFor(absl::Milliseconds(300));
    }
  }
}

// The experiment's trial job ids, as root.
std::vector<std::string> TrialJobs(WebCluster& web, const std::string& experiment) {
  CommandResult listed = web.As("root", "list --all --experiment " + experiment);
  std::vector<std::string> ids;
  std::istringstream lines(listed.output);
  for (std::string line; std::getline(lines, line);) {
    if (absl::StartsWith(line, "j-")) ids.push_back(line.substr(0, 8));
  }
  return ids;
}

TEST(WebBrowserTest, PagesOfARealClusterInChromium) {
  if (RunCommand("command -v chromium && command -v chromedriver").exit_code != 0) {
    GTEST_SKIP()
        << "chromium and chromium-driver are not installed (scripts/test.sh installs them)";
  }
  WebCluster web;
  const std::string d = web.cluster.dir();
  const std::string root = d + "/data";
  std::filesystem::create_directories(root);
  // Fashion-MNIST under short names, the test images raw, and two files named with HTML: one a
  // good copy of the test images, one cut short (a job training on it fails, naming it).
  const std::string fmnist = "/usr/share/datasets/fashion-mnist/";
  CommandResult copied = RunCommand(absl::StrCat(
      "cd ", root, " && cp ", fmnist, "train-images-idx3-ubyte.gz train-images.gz && cp ", fmnist,
      "train-labels-idx1-ubyte.gz train-labels.gz && cp ", fmnist,
      "t10k-images-idx3-ubyte.gz test-images.gz && cp ", fmnist,
      "t10k-labels-idx1-ubyte.gz test-labels.gz && gunzip -c test-images.gz > test-images.idx && ",
      "gunzip -c test-labels.gz > test-labels.idx && cp test-images.idx ",
      "'<img src=x onerror=window.pwned=1>.idx' && head -c 3000000 test-images.idx > ",
      "'bad-<svg onload=window.pwned=2>.idx'"));
  ASSERT_EQ(copied.exit_code, 0) << copied.output;
  ASSERT_NO_FATAL_FAILURE(web.Start({"--data-root", root, "--web-listen", "127.0.0.1:0"}));
  ASSERT_EQ(web.As("root", "worker join-token --token-out " + d + "/join.token").exit_code, 0);
  web.cluster.StartWorker("w-web", {"--join-token-file", d + "/join.token", "--data-root", root});

  // alice: a small CNN that trains for some seconds (so that steps are sampled), a grid of two
  // trials, a job on the cut file and a search whose values are the HTML-named file; dave: a job.
  const std::string cnn =
      "{type: cnn, layers: [{type: conv2d, out_channels: 16, kernel: 3, padding: 1}, "
      "{type: relu}, {type: maxpool2d, kernel: 2}, {type: flatten}, {type: linear, units: 10}]}";
  const std::string job = web.Submit(
      "alice", "curves",
      JobYaml("curves", absl::StrCat(kFmnist, "  train_limit: 30000\n  test_limit: 1000\n"), cnn,
              "{epochs: 4, batch_size: 64, optimizer: {type: sgd, lr: 0.05, momentum: 0.9}}"));
  const std::string experiment = web.Submit(
      "alice", "grid",
      JobYaml("grid", absl::StrCat(kFmnist, "  train_limit: 3000\n  test_limit: 500\n"),
              "{type: mlp, hidden: [32]}", "{epochs: 3, batch_size: 50}",
              "search:\n  method: grid\n  parameters:\n    train.optimizer.lr: {choice: [0.02, "
              "0.1]}\n"));
  const std::string daves = web.Submit(
      "dave", "daves",
      JobYaml("daves-secret-job", absl::StrCat(kFmnist, "  train_limit: 1000\n  test_limit: 200\n"),
              "{type: mlp, hidden: [8]}", "{epochs: 1, batch_size: 50}"));
  const std::string injected =
      web.Submit("alice", "injected",
                 JobYaml("injected",
                         "  train_images: \"bad-<svg onload=window.pwned=2>.idx\"\n"
                         "  train_labels: test-labels.idx\n  test_images: test-images.idx\n"
                         "  test_labels: test-labels.idx\n",
                         "{type: mlp, hidden: [8]}", "{epochs: 1, batch_size: 50}"));
  const std::string injected_search = web.Submit(
      "alice", "injected-search",
      JobYaml("injected-search",
              "  train_images: test-images.idx\n  train_labels: test-labels.idx\n"
              "  test_images: test-images.idx\n  test_labels: test-labels.idx\n"
              "  train_limit: 1000\n  test_limit: 200\n",
              "{type: mlp, hidden: [8]}", "{epochs: 1, batch_size: 50}",
              "search:\n  method: grid\n  parameters:\n    dataset.test_images: {choice: "
              "[\"<img src=x onerror=window.pwned=1>.idx\", test-images.idx]}\n"));
  for (const std::string& id : {job, experiment, daves, injected, injected_search}) {
    ASSERT_EQ(id.size(), 8u) << "a submit failed";
  }
  std::vector<std::string> trials = TrialJobs(web, experiment);
  ASSERT_EQ(trials.size(), 2u);
  std::vector<std::string> all = {job, daves, injected};
  all.insert(all.end(), trials.begin(), trials.end());
  for (const std::string& id : TrialJobs(web, injected_search)) all.push_back(id);
  ASSERT_NO_FATAL_FAILURE(WaitFinal(web, all, absl::Minutes(4)));

  const std::string token = web.Token("root");
  std::vector<std::string> trial_json;
  for (const std::string& id : trials) {
    trial_json.push_back(
        absl::StrCat("\"", id, "\": ", HistoryJson(web.cluster.address(), token, id, true)));
  }
  const std::string expect = WriteFile(
      d + "/expect.json",
      absl::StrCat("{\"base\": \"http://127.0.0.1:", web.cluster.ServerWebPort(),
                   "\", \"token\": \"", web.Token("alice"),
                   "\", \"job\": ", HistoryJson(web.cluster.address(), token, job, false),
                   ", \"experiment\": {\"id\": \"", experiment, "\", \"trials\": {",
                   absl::StrJoin(trial_json, ", "), "}}, \"other_job\": \"", daves,
                   "\", \"other_name\": \"daves-secret-job\", \"injected_job\": \"", injected,
                   "\", \"injected_text\": \"bad-<svg onload=window.pwned=2>.idx\", "
                   "\"injected_experiment\": \"",
                   injected_search,
                   "\", \"injected_value\": \"<img src=x onerror=window.pwned=1>.idx\", "
                   "\"worker\": \"w-web\"}"));
  const char* env = std::getenv("STOKER_WEB_SCREENSHOTS");
  const std::string shots = env != nullptr ? env : STOKER_BINARY_DIR "/web-screenshots";
  CommandResult browser =
      RunCommand(absl::StrCat("timeout 300 python3 ", STOKER_SOURCE_DIR,
                              "/tests/web/browser_check.py ", expect, " ", shots));
  EXPECT_EQ(browser.exit_code, 0) << browser.output;
  std::cout << browser.output << "screenshots in " << shots << "\n";
  for (const char* shot : {"login.png", "jobs.png", "job.png", "experiment.png", "workers.png"}) {
    EXPECT_GT(std::filesystem::exists(shots + "/" + shot)
                  ? std::filesystem::file_size(shots + "/" + shot)
                  : 0,
              10000u)
        << shot;
  }
}

}  // namespace
}  // namespace stoker::testing

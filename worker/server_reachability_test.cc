#include "worker/server_reachability.h"

#include <netdb.h>

#include <iostream>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

TEST(HostToResolveTest, NamesAreResolvedAndLiteralsAndSocketsAreNot) {
  EXPECT_EQ(HostToResolve("server:50051"), "server");
  EXPECT_EQ(HostToResolve("server"), "server");
  EXPECT_EQ(HostToResolve("dns:///server:50051"), "server");
  EXPECT_EQ(HostToResolve("dns://10.0.0.53/stoker.example:443"), "stoker.example");
  EXPECT_EQ(HostToResolve("dns:server:1"), "server");
  EXPECT_EQ(HostToResolve("10.89.0.2:50051"), std::nullopt);
  EXPECT_EQ(HostToResolve("[::1]:50051"), std::nullopt);
  EXPECT_EQ(HostToResolve("::1"), std::nullopt);
  EXPECT_EQ(HostToResolve("ipv4:10.0.0.1:1"), std::nullopt);
  EXPECT_EQ(HostToResolve("unix:/run/stoker.sock"), std::nullopt);
  EXPECT_EQ(HostToResolve("xds://x/y"), std::nullopt);
  EXPECT_EQ(HostToResolve(""), std::nullopt);
  EXPECT_EQ(HostToResolve(":50051"), std::nullopt);
}

TEST(ResolveHostTest, AReservedInvalidNameDoesNotResolveAndLocalhostDoes) {
  // RFC 6761: names under .invalid never resolve.
  const Resolution missing = ResolveHost("stoker-no-such-host.invalid");
  EXPECT_EQ(missing.outcome, Resolution::Outcome::kDoesNotResolve);
  EXPECT_FALSE(missing.error.empty());
  // A freshly bootstrapped root may have no /etc/hosts, where nothing resolves "localhost"; the
  // resolved case needs a name this machine's resolver knows.
  addrinfo* direct = nullptr;
  if (getaddrinfo("localhost", nullptr, nullptr, &direct) != 0) {
    std::cerr << "'localhost' does not resolve on this machine (no /etc/hosts?): only the name "
                 "that must not resolve is checked\n";
    return;
  }
  freeaddrinfo(direct);
  const Resolution local = ResolveHost("localhost");
  ASSERT_EQ(local.outcome, Resolution::Outcome::kResolved) << local.error;
  EXPECT_TRUE(local.address == "127.0.0.1" || local.address == "::1") << local.address;
}

TEST(DescribeUnreachableTest, SaysWhetherTheNameResolvesAndForHowLong) {
  Resolution missing;
  missing.outcome = Resolution::Outcome::kDoesNotResolve;
  missing.error = "Name or service not known";
  const std::string first =
      DescribeUnreachable("server:50051", &missing, "Deadline Exceeded", absl::ZeroDuration());
  EXPECT_NE(first.find("'server' does not resolve (yet)"), std::string::npos) << first;
  EXPECT_NE(first.find("Name or service not known"), std::string::npos) << first;
  EXPECT_NE(first.find("retrying"), std::string::npos) << first;
  EXPECT_EQ(first.find(", for "), std::string::npos) << first;
  EXPECT_EQ(first.find("no answer"), std::string::npos) << first;
  const std::string later =
      DescribeUnreachable("server:50051", &missing, "Deadline Exceeded", absl::Seconds(42));
  EXPECT_NE(later.find("does not resolve (yet)"), std::string::npos) << later;
  EXPECT_NE(later.find(", for 42 s"), std::string::npos) << later;

  Resolution found;
  found.address = "10.89.0.2";
  const std::string silent =
      DescribeUnreachable("server:50051", &found, "Deadline Exceeded", absl::ZeroDuration());
  EXPECT_NE(silent.find("no answer ('server' resolves to 10.89.0.2"), std::string::npos) << silent;
  EXPECT_EQ(silent.find("does not resolve"), std::string::npos) << silent;
  const std::string refused =
      DescribeUnreachable("server:50051", &found, "failed to connect", absl::ZeroDuration());
  EXPECT_EQ(refused, "failed to connect ('server' resolves to 10.89.0.2)");

  Resolution slow;
  slow.outcome = Resolution::Outcome::kTimedOut;
  EXPECT_NE(DescribeUnreachable("server:1", &slow, "Deadline Exceeded", absl::ZeroDuration())
                .find("the host name 'server' does not resolve within 3 s"),
            std::string::npos);
  // A literal address has nothing to resolve.
  EXPECT_EQ(DescribeUnreachable("10.0.0.1:1", nullptr, "Deadline Exceeded", absl::ZeroDuration()),
            "no answer (is it running, and is the address reachable from here?)");
}

TEST(ServerReachabilityTest, CountsHowLongTheNameHasFailedAndForgetsOnceReached) {
  ServerReachability reachability("stoker-no-such-host.invalid:50051");
  const std::string first = reachability.Describe("Deadline Exceeded");
  EXPECT_NE(first.find("does not resolve (yet)"), std::string::npos) << first;
  EXPECT_EQ(first.find(", for "), std::string::npos) << first;
  absl::SleepFor(absl::Milliseconds(1100));
  const std::string second = reachability.Describe("Deadline Exceeded");
  EXPECT_NE(second.find(", for 1 s"), std::string::npos) << second;
  reachability.Reached();
  const std::string after = reachability.Describe("Deadline Exceeded");
  EXPECT_EQ(after.find(", for "), std::string::npos) << after;
}

}  // namespace
}  // namespace stoker

#include "common/trace.h"

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Parses a trace file with protobuf's JSON parser (independent of the
// writer) into its event list.
google::protobuf::ListValue ParseEvents(const std::string& json) {
  google::protobuf::ListValue events;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &events);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json.substr(0, 2000);
  return events;
}

const google::protobuf::Struct& Event(const google::protobuf::ListValue& list,
                                      int i) {
  return list.values(i).struct_value();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

TEST(TraceTest, FileRecorderWritesValidChromeTraceEvents) {
  const std::string path = TempPath("master.trace.json");
  auto recorder = TraceRecorder::ToFile(path, 7, "mpilearn-master \"x\"");
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  const absl::Time start = absl::FromUnixMicros(1'700'000'000'000'000);
  (*recorder)->Complete("apply", "master", start, start + absl::Microseconds(250),
                        {{"version", 42}, {"staleness", 3}});
  std::thread other([&] {
    (*recorder)->NameThread("rpc thread");
    TraceSpan span(recorder->get(), "receive", "master");
    span.Arg("bytes", 1024);
  });
  other.join();
  ASSERT_TRUE((*recorder)->Close().ok());

  const google::protobuf::ListValue events = ParseEvents(ReadFile(path));
  ASSERT_EQ(events.values_size(), 4);
  EXPECT_EQ(Event(events, 0).fields().at("ph").string_value(), "M");
  EXPECT_EQ(Event(events, 0).fields().at("args").struct_value().fields().at(
                "name").string_value(),
            "mpilearn-master \"x\"");
  const auto& apply = Event(events, 1).fields();
  EXPECT_EQ(apply.at("name").string_value(), "apply");
  EXPECT_EQ(apply.at("ph").string_value(), "X");
  EXPECT_EQ(apply.at("ts").number_value(), 1'700'000'000'000'000.0);
  EXPECT_EQ(apply.at("dur").number_value(), 250.0);
  EXPECT_EQ(apply.at("pid").number_value(), 7.0);
  EXPECT_EQ(apply.at("args").struct_value().fields().at("staleness").number_value(), 3.0);
  const auto& receive = Event(events, 3).fields();
  EXPECT_EQ(receive.at("name").string_value(), "receive");
  EXPECT_NE(receive.at("tid").number_value(), apply.at("tid").number_value());
  EXPECT_EQ(receive.at("args").struct_value().fields().at("bytes").number_value(), 1024.0);
}

TEST(TraceTest, InMemoryChunksMergeIntoOneFile) {
  auto rank0 = TraceRecorder::InMemory(0, "group g-1 rank 0");
  auto rank1 = TraceRecorder::InMemory(1, "group g-1 rank 1");
  { TraceSpan span(rank0.get(), "forward_backward", "train"); }
  { TraceSpan span(rank1.get(), "allreduce", "mpi"); }
  const std::string path = TempPath("group.trace.json");
  ASSERT_TRUE(WriteTraceFile(path, {rank0->TakeEvents(), "", rank1->TakeEvents()}).ok());
  const google::protobuf::ListValue events = ParseEvents(ReadFile(path));
  ASSERT_EQ(events.values_size(), 4);
  EXPECT_EQ(Event(events, 1).fields().at("name").string_value(), "forward_backward");
  EXPECT_EQ(Event(events, 3).fields().at("name").string_value(), "allreduce");
  EXPECT_EQ(Event(events, 3).fields().at("pid").number_value(), 1.0);
  EXPECT_EQ(rank0->TakeEvents(), "");  // taken
}

TEST(TraceTest, InMemoryCapDropsAndCounts) {
  auto recorder = TraceRecorder::InMemory(0, "r", /*max_bytes=*/400);
  const absl::Time t = absl::Now();
  for (int i = 0; i < 20; ++i) recorder->Complete("step", "train", t, t);
  EXPECT_GT(recorder->dropped(), 0u);
  EXPECT_EQ(recorder->recorded() + recorder->dropped(), 21u);  // + metadata
  ParseEvents(absl::StrCat("[", recorder->TakeEvents(), "]"));
}

TEST(TraceTest, NullRecorderSpanIsNoOp) {
  TraceSpan span(nullptr, "x", "y");
  span.Arg("a", 1);
  span.End();
}

TEST(TraceTest, UnwritablePathSaysWhatToDo) {
  auto recorder = TraceRecorder::ToFile("/nonexistent-dir/t.json", 0, "m");
  ASSERT_FALSE(recorder.ok());
  EXPECT_NE(recorder.status().message().find("--trace"), std::string::npos);
}

}  // namespace
}  // namespace mpilearn

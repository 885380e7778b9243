#include "common/bounded_text.h"

#include <string>

#include "common/error_reason.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn {
namespace {

TEST(BoundedTextTest, EchoPrefixCutsLongTextAndNotesItsLength) {
  EXPECT_EQ(EchoPrefix("job-000001"), "job-000001");
  const std::string huge(1 << 20, 'x');
  const std::string echoed = EchoPrefix(huge);
  EXPECT_EQ(echoed, std::string(kEchoBytes, 'x') + "...[1048576 bytes]");
}

TEST(BoundedTextTest, EchoPrefixEscapesControlBytesAndQuotes) {
  EXPECT_EQ(EchoPrefix("a\nb'c"), "a\\nb\\'c");
  EXPECT_EQ(EchoPrefix(std::string("\x01\x7f", 2)), "\\x01\\x7f");
}

TEST(BoundedTextTest, SanitizeTextKeepsOneLineAndUtf8) {
  EXPECT_EQ(SanitizeText("line 1\nline 2\t\x02 \xc3\xa9", 100),
            "line 1\\nline 2\\t\\x02 \xc3\xa9");
  EXPECT_EQ(SanitizeText("abcdef", 3), "abc...[6 bytes]");
}

TEST(BoundedTextTest, StringFieldOverTheLimitIsResourceExhausted) {
  const absl::Status status =
      CheckStringField("spec.name", std::string(5000, 'n'), 4096);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_LIMIT);
  EXPECT_NE(status.message().find("spec.name is 5000 bytes"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("--max_string_bytes"), std::string::npos);
  // The message echoes only a prefix.
  EXPECT_LT(status.message().size(), 400u);
  EXPECT_TRUE(CheckStringField("spec.name", std::string(4096, 'n'), 4096).ok());
}

TEST(BoundedTextTest, ControlCharacterIsInvalidArgument) {
  const absl::Status status =
      CheckStringField("host", "node1\n[forged log line]", 4096);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(status), v1::ERROR_REASON_INVALID_REQUEST);
  EXPECT_NE(status.message().find("host holds a control character (byte 5"),
            std::string::npos)
      << status;
  EXPECT_EQ(status.message().find('\n'), std::string::npos);
}

TEST(BoundedTextTest, MessageWalkNamesNestedRepeatedAndMapFields) {
  v1::JobSpec spec;
  spec.set_name("ok");
  spec.mutable_data()->add_train_files("a.h5");
  spec.mutable_data()->add_train_files(std::string(10, 'f'));
  EXPECT_TRUE(CheckStringFields(spec, "spec", 10).ok());
  spec.mutable_data()->add_train_files(std::string(11, 'f'));
  absl::Status status = CheckStringFields(spec, "spec", 10);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("spec.data.train_files[2] is 11 bytes"),
            std::string::npos)
      << status;

  v1::ValidationRecord record;
  record.set_source("pool v-1");
  (*record.mutable_metrics())["val\nloss"] = 1.0;
  status = CheckStringFields(record, "record", 100);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("record.metrics.key"), std::string::npos)
      << status;
}

TEST(BoundedTextTest, BytesFieldsAreNotChecked) {
  v1::TensorChunk chunk;
  chunk.set_data(std::string(100, '\0'));
  EXPECT_TRUE(CheckStringFields(chunk, "", 10).ok());
}

}  // namespace
}  // namespace mpilearn

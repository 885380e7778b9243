// Study specs from JSON and YAML: the same spec from both formats (field
// names as in the .proto or lowerCamelCase), YAML's scalar typing, and each
// refusal (unknown field, bad YAML, size and nesting bounds).
#include "tools/cli/study_spec_file.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/study.pb.h"

namespace mpilearn::opt {
namespace {

using ::google::protobuf::Value;
using ::google::protobuf::util::MessageDifferencer;
using ::testing::AllOf;
using ::testing::HasSubstr;

using ::testing::StartsWith;

constexpr char kJsonSpec[] = R"json({
  "name": "fm-search",
  "base": {
    "model": {"name": "mlp", "hidden": [256, 128]},
    "data": {
      "train_images": "/data/train-images.gz",
      "train_labels": "/data/train-labels.gz",
      "validation_count": 2000
    },
    "optimizer": {"name": "adam", "learning_rate": 0.001},
    "algorithm": "downpour",
    "epochs": 4,
    "batch_size": 64
  },
  "parameters": [
    {"path": "optimizer.learning_rate",
     "real": {"low": 0.0001, "high": 0.03, "log": true}},
    {"path": "batch_size", "int": {"low": 32, "high": 256, "step": 32}},
    {"path": "model.hidden",
     "categorical": {"choices": [[128], [256, 128]]}},
    {"path": "algorithm", "categorical": {"choices": ["downpour", "sync"]}},
    {"path": "data.shuffle", "categorical": {"choices": [true, false]}},
    {"path": "model.name", "categorical": {"choices": ["64", 64]}}
  ],
  "objective": {"metric": "val_accuracy", "direction": "maximize"},
  "sampler": "tpe",
  "tpe": {"startup_trials": 5, "constant_liar": false},
  "trials": 16,
  "parallelism": 2,
  "pruner": {"name": "asha", "min_resource": 1, "reduction_factor": 2},
  "seed": 7,
  "target": 0.9
})json";

// The same spec; lowerCamelCase in places, flow and block styles, comments,
// and the quoting that makes "64" a string and 64 a number.
constexpr char kYamlSpec[] = R"yaml(
# A comment.
name: fm-search
base:
  model: {name: mlp, hidden: [256, 128]}
  data:
    trainImages: /data/train-images.gz
    train_labels: "/data/train-labels.gz"
    validationCount: 2000
  optimizer: {name: adam, learningRate: 1e-3}
  algorithm: downpour
  epochs: 4
  batchSize: 64
parameters:
  - path: optimizer.learning_rate
    real: {low: 0.0001, high: 3.0e-2, log: true}
  - path: batch_size
    int: {low: 32, high: 256, step: 32}
  - path: model.hidden
    categorical:
      choices:
        - [128]
        - [256, 128]
  - path: algorithm
    categorical: {choices: [downpour, 'sync']}
  - path: data.shuffle
    categorical: {choices: [true, False]}
  - path: model.name
    categorical: {choices: ["64", 64]}
objective: {metric: val_accuracy, direction: maximize}
sampler: tpe
tpe: {startupTrials: 5, constant_liar: false}
trials: 16
parallelism: 2
pruner: {name: asha, minResource: 1, reduction_factor: 2}
seed: 7
target: .9
)yaml";

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(testing::TempDir(), "/", name);
  std::ofstream out(path, std::ios::binary);
  out << contents;
  return path;
}

TEST(StudySpecFileTest, JsonAndYamlGiveTheSameSpec) {
  absl::StatusOr<v1::StudySpec> json =
      ParseStudySpec(kJsonSpec, StudySpecFormat::kJson);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<v1::StudySpec> yaml =
      ParseStudySpec(kYamlSpec, StudySpecFormat::kYaml);
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*json, *yaml))
      << "JSON:\n"
      << json->DebugString() << "YAML:\n"
      << yaml->DebugString();

  // Spot checks that the values are the ones written, not merely equal.
  const v1::StudySpec& spec = *yaml;
  EXPECT_EQ(spec.name(), "fm-search");
  EXPECT_EQ(spec.base().data().train_images(), "/data/train-images.gz");
  EXPECT_DOUBLE_EQ(spec.base().optimizer().learning_rate(), 0.001);
  EXPECT_EQ(spec.base().batch_size(), 64);
  ASSERT_EQ(spec.parameters_size(), 6);
  EXPECT_DOUBLE_EQ(spec.parameters(0).real().high(), 0.03);
  EXPECT_TRUE(spec.parameters(0).real().log());
  EXPECT_EQ(spec.parameters(1).int_().step(), 32);
  const auto& hidden = spec.parameters(2).categorical().choices();
  ASSERT_EQ(hidden.size(), 2);
  ASSERT_EQ(hidden[1].kind_case(), Value::kListValue);
  EXPECT_EQ(hidden[1].list_value().values(0).number_value(), 256);
  EXPECT_EQ(spec.parameters(3).categorical().choices(1).string_value(), "sync");
  EXPECT_EQ(spec.parameters(4).categorical().choices(1).kind_case(),
            Value::kBoolValue);
  EXPECT_FALSE(spec.parameters(4).categorical().choices(1).bool_value());
  const auto& names = spec.parameters(5).categorical().choices();
  EXPECT_EQ(names[0].kind_case(), Value::kStringValue);
  EXPECT_EQ(names[0].string_value(), "64");
  EXPECT_EQ(names[1].kind_case(), Value::kNumberValue);
  EXPECT_EQ(spec.tpe().startup_trials(), 5);
  ASSERT_TRUE(spec.tpe().has_constant_liar());
  EXPECT_FALSE(spec.tpe().constant_liar());
  EXPECT_EQ(spec.pruner().min_resource(), 1);
  EXPECT_EQ(spec.seed(), 7u);
  EXPECT_DOUBLE_EQ(spec.target(), 0.9);
}

TEST(StudySpecFileTest, ReadsFilesByTheirExtension) {
  const std::string json = WriteFile("spec.json", kJsonSpec);
  const std::string yaml = WriteFile("spec.YML", kYamlSpec);
  absl::StatusOr<v1::StudySpec> from_json = ReadStudySpecFile(json);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  absl::StatusOr<v1::StudySpec> from_yaml = ReadStudySpecFile(yaml);
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*from_json, *from_yaml));

  // YAML content in a .json file is read as JSON, and fails as such.
  const std::string mislabelled = WriteFile("yaml.json", kYamlSpec);
  absl::StatusOr<v1::StudySpec> wrong = ReadStudySpecFile(mislabelled);
  EXPECT_FALSE(wrong.ok());
  EXPECT_THAT(std::string(wrong.status().message()),
              StartsWith(mislabelled + ": "));

  absl::StatusOr<v1::StudySpec> txt =
      ReadStudySpecFile(WriteFile("spec.txt", kJsonSpec));
  EXPECT_THAT(txt.status().message(), HasSubstr(".json, .yaml or .yml"));

  absl::StatusOr<v1::StudySpec> missing =
      ReadStudySpecFile(absl::StrCat(testing::TempDir(), "/absent.yaml"));
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("absent.yaml: "));

  const std::string directory_path =
      absl::StrCat(testing::TempDir(), "/dir.yaml");
  ASSERT_EQ(mkdir(directory_path.c_str(), 0755), 0);
  EXPECT_THAT(ReadStudySpecFile(directory_path).status().message(),
              HasSubstr("not a regular file"));
}

TEST(StudySpecFileTest, UnknownFieldsAreNamed) {
  absl::StatusOr<v1::StudySpec> json = ParseStudySpec(
      R"({"name": "x", "paramters": []})", StudySpecFormat::kJson);
  ASSERT_FALSE(json.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(json.status()));
  EXPECT_THAT(json.status().message(), HasSubstr("paramters"));

  // Nested in the base job spec, from YAML.
  absl::StatusOr<v1::StudySpec> yaml = ParseStudySpec(
      "base:\n  epochs: 3\n  optimizer: {name: sgd, learnin_rate: 0.1}\n",
      StudySpecFormat::kYaml);
  ASSERT_FALSE(yaml.ok());
  EXPECT_THAT(yaml.status().message(), HasSubstr("learnin_rate"));

  // A value of the wrong type names its field too.
  absl::StatusOr<v1::StudySpec> type =
      ParseStudySpec("trials: many\n", StudySpecFormat::kYaml);
  ASSERT_FALSE(type.ok());
  EXPECT_THAT(type.status().message(), HasSubstr("trials"));
}

TEST(StudySpecFileTest, BadYamlGivesItsLine) {
  absl::StatusOr<v1::StudySpec> spec = ParseStudySpec(
      "name: x\nparameters: [1, 2\ntrials: 3\n", StudySpecFormat::kYaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(spec.status()));
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(StartsWith("invalid YAML at line "), HasSubstr("column")));

  EXPECT_THAT(ParseStudySpec("", StudySpecFormat::kYaml).status().message(),
              HasSubstr("empty"));
  EXPECT_THAT(ParseStudySpec("name: a\n---\nname: b\n", StudySpecFormat::kYaml)
                  .status()
                  .message(),
              HasSubstr("one YAML document expected, found 2"));
  EXPECT_THAT(
      ParseStudySpec("- name: a\n", StudySpecFormat::kYaml).status().message(),
      HasSubstr("a study spec is a mapping"));
  EXPECT_THAT(ParseStudySpec("name: a\nname: b\n", StudySpecFormat::kYaml)
                  .status()
                  .message(),
              HasSubstr("duplicate key 'name' (line 2, column 1)"));
  EXPECT_THAT(ParseStudySpec("name: !custom a\n", StudySpecFormat::kYaml)
                  .status()
                  .message(),
              HasSubstr("unsupported tag '!custom'"));
}

TEST(StudySpecFileTest, FilesOverTheBoundAreRefusedUnread) {
  // Valid YAML of the bound plus one byte: a comment pads it.
  std::string big = "name: x\n#";
  big.resize(kMaxStudySpecBytes + 1, 'x');
  const std::string path = WriteFile("big.yaml", big);
  absl::StatusOr<v1::StudySpec> spec = ReadStudySpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(StartsWith(path + ": "),
                    HasSubstr(absl::StrCat(kMaxStudySpecBytes + 1, " bytes")),
                    HasSubstr(absl::StrCat("at most ", kMaxStudySpecBytes))));
  // At the bound it is read.
  big.resize(kMaxStudySpecBytes);
  EXPECT_TRUE(ReadStudySpecFile(WriteFile("edge.yaml", big)).ok());
}

TEST(YamlToJsonTest, ScalarsKeepTheirYamlTypes) {
  const std::pair<const char*, const char*> cases[] = {
      {"a: 1", R"({"a":1})"},
      {"a: -0012", R"({"a":-12})"},
      {"a: +5", R"({"a":5})"},
      {"a: 0x1F", R"({"a":31})"},
      {"a: 0o17", R"({"a":15})"},
      {"a: 1.5e-3", R"({"a":0.0015})"},
      {"a: 0.1", R"({"a":0.1})"},
      {"a: .5", R"({"a":0.5})"},
      {"a: 2.", R"({"a":2})"},
      {"a: 99999999999999999999", R"({"a":1e+20})"},
      {"a: -.inf", R"({"a":"-Infinity"})"},
      {"a: .NaN", R"({"a":"NaN"})"},
      {"a: True", R"({"a":true})"},
      {"a: false", R"({"a":false})"},
      {"a: yes", R"({"a":"yes"})"},  // YAML 1.2: a string
      {"a: ~", R"({"a":null})"},
      {"a:", R"({"a":null})"},
      {"a: '1'", R"({"a":"1"})"},
      {"a: \"true\"", R"({"a":"true"})"},
      {"a: ''", R"({"a":""})"},
      {"a: !!str 5", R"({"a":"5"})"},
      {"a: !!float 5", R"({"a":5})"},
      {"a: 1.2.3", R"({"a":"1.2.3"})"},
      {"a: 1e", R"({"a":"1e"})"},
      {"a: \"q\\\"t\\\\ \\t\"", R"({"a":"q\"t\\ \t"})"},
      {"a: |\n  two\n  lines\n", R"({"a":"two\nlines\n"})"},
      {"a: [1, x, [true]]\nb: {c: d}", R"({"a":[1,"x",[true]],"b":{"c":"d"}})"},
      {"x: &v [1, 2]\ny: *v", R"({"x":[1,2],"y":[1,2]})"},
  };
  for (const auto& [yaml, json] : cases) {
    absl::StatusOr<std::string> converted = YamlToJson(yaml);
    ASSERT_TRUE(converted.ok()) << yaml << ": " << converted.status();
    EXPECT_EQ(*converted, json) << yaml;
  }
  EXPECT_THAT(YamlToJson("a: !!int x").status().message(),
              HasSubstr("'x' (line 1, column 4) is not a valid !!int"));
}

TEST(YamlToJsonTest, NestingAndAliasExpansionAreBounded) {
  auto nested = [](int levels) {
    return absl::StrCat(std::string(levels, '['), "1",
                        std::string(levels, ']'));
  };
  EXPECT_TRUE(YamlToJson(nested(kMaxYamlDepth)).ok());
  const std::string deep = nested(kMaxYamlDepth + 1);
  EXPECT_THAT(YamlToJson(deep).status().message(),
              HasSubstr(absl::StrCat("nested more than ", kMaxYamlDepth)));

  // Each level repeats the one before ten times: 10^8 leaves from a few
  // hundred bytes of YAML.
  std::string laughs = "a0: &a0 [xxxxxxxx, xxxxxxxx]\n";
  for (int i = 1; i <= 8; ++i) {
    absl::StrAppend(&laughs, "a", i, ": &a", i, " [");
    for (int j = 0; j < 10; ++j)
      absl::StrAppend(&laughs, j ? ", " : "", "*a", i - 1);
    laughs += "]\n";
  }
  EXPECT_THAT(YamlToJson(laughs).status().message(),
              HasSubstr(absl::StrCat("more than ", kMaxYamlJsonBytes)));
}

TEST(StudySpecFileTest, BaseIsCheckedAsTheMasterWill) {
  absl::StatusOr<v1::StudySpec> spec =
      ParseStudySpec(kJsonSpec, StudySpecFormat::kJson);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(CheckBaseJobSpec(*spec).ok()) << CheckBaseJobSpec(*spec);
  spec->mutable_base()->set_epochs(0);
  const absl::Status bad = CheckBaseJobSpec(*spec);
  EXPECT_TRUE(absl::IsInvalidArgument(bad));
  EXPECT_THAT(std::string(bad.message()),
              AllOf(StartsWith("base: "), HasSubstr("epochs")));
  spec->clear_base();
  EXPECT_THAT(std::string(CheckBaseJobSpec(*spec).message()),
              StartsWith("base: missing"));
}

// The documented example (docs/opt.md) reads, and its base is valid.
TEST(StudySpecFileTest, TheDocsExampleReads) {
  absl::StatusOr<v1::StudySpec> spec =
      ReadStudySpecFile("docs/examples/opt_fashion_mnist.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_GT(spec->parameters_size(), 0);
  EXPECT_TRUE(CheckBaseJobSpec(*spec).ok()) << CheckBaseJobSpec(*spec);
}

}  // namespace
}  // namespace mpilearn::opt

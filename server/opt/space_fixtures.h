// Test fixtures shared by the search-space tests: a base job spec that
// passes NormalizeJobSpec, and parameters from their JSON form as a study
// spec file gives them.
#ifndef MPILEARN_SERVER_OPT_SPACE_FIXTURES_H_
#define MPILEARN_SERVER_OPT_SPACE_FIXTURES_H_

#include <string>
#include <vector>

#include "google/protobuf/repeated_field.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"
#include "proto/study.pb.h"

namespace mpilearn::opt::fixtures {

// Only the required data files.
inline v1::JobSpec Base() {
  v1::JobSpec base;
  base.mutable_data()->set_train_images("train-images.gz");
  base.mutable_data()->set_train_labels("train-labels.gz");
  return base;
}

inline google::protobuf::RepeatedPtrField<v1::ParameterSpec> Params(
    const std::vector<std::string>& json) {
  google::protobuf::RepeatedPtrField<v1::ParameterSpec> parameters;
  for (const std::string& one : json) {
    const auto status = google::protobuf::util::JsonStringToMessage(one, parameters.Add());
    EXPECT_TRUE(status.ok()) << one << ": " << status.message();
  }
  return parameters;
}

}  // namespace mpilearn::opt::fixtures

#endif  // MPILEARN_SERVER_OPT_SPACE_FIXTURES_H_

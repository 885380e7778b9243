// StopRules on regression metrics, read from ValidationRecord.metrics by
// name (the val_loss/val_accuracy rules are covered through Job in
// job_test.cc).
#include "server/core/stop_rules.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/mpilearn.pb.h"

namespace mpilearn::server {
namespace {

// A record of `version` with val_loss `loss` and, when `mae` is not NaN,
// metrics {"val_mae": mae}.
v1::ValidationRecord Record(uint64_t version, double loss, double mae) {
  v1::ValidationRecord record;
  record.set_version(version);
  record.set_val_loss(loss);
  if (!std::isnan(mae)) (*record.mutable_metrics())["val_mae"] = mae;
  return record;
}

TEST(StopRulesTest, EarlyStoppingOnValMaeIgnoresValLoss) {
  v1::JobSpec spec;
  spec.mutable_early_stopping()->set_metric("val_mae");
  spec.mutable_early_stopping()->set_patience(2);
  spec.mutable_checkpoint()->set_best_metric("none");
  StopRules rules(spec);
  // val_mae 0.5, 0.25, 0.375, 0.25: best 0.25 at version 2, then two
  // validations without improvement. val_loss falls all along and would
  // never stop the job.
  const std::vector<double> maes = {0.5, 0.25, 0.375, 0.25};
  std::vector<std::string> reasons;
  for (size_t i = 0; i < maes.size(); ++i) {
    reasons.push_back(
        rules.Add(Record(i + 1, 1.0 / static_cast<double>(i + 1), maes[i]))
            .stop_reason);
  }
  EXPECT_EQ(reasons, (std::vector<std::string>{
                         "", "", "",
                         "early stopping: val_mae did not improve by more "
                         "than 0 for 2 validations (best 0.25 at version 2)"}));
}

// val_auc, like val_accuracy, improves upwards.
TEST(StopRulesTest, AucImprovesUpwards) {
  v1::JobSpec spec;
  spec.mutable_early_stopping()->set_metric("val_auc");
  spec.mutable_early_stopping()->set_patience(1);
  spec.mutable_checkpoint()->set_best_metric("val_auc");
  StopRules rules(spec);
  std::vector<std::string> reasons;
  for (const double auc : {0.7, 0.8, 0.75}) {
    v1::ValidationRecord record = Record(reasons.size() + 1, 0.5, std::nan(""));
    (*record.mutable_metrics())["val_auc"] = auc;
    reasons.push_back(rules.Add(record).stop_reason);
  }
  EXPECT_EQ(reasons, (std::vector<std::string>{
                         "", "",
                         "early stopping: val_auc did not improve by more "
                         "than 0 for 1 validations (best 0.8 at version 2)"}));
  EXPECT_EQ(rules.best_value(), 0.8);
}

TEST(StopRulesTest, RecordWithoutTheMetricDoesNotCount) {
  v1::JobSpec spec;
  spec.mutable_early_stopping()->set_metric("val_mae");
  spec.mutable_early_stopping()->set_patience(1);
  spec.mutable_checkpoint()->set_best_metric("val_mae");
  StopRules rules(spec);
  EXPECT_TRUE(rules.Add(Record(1, 1.0, 0.5)).best_improved);
  // No val_mae: neither a best nor a validation without improvement.
  StopRules::Outcome outcome = rules.Add(Record(2, 0.1, std::nan("")));
  EXPECT_FALSE(outcome.best_improved);
  EXPECT_EQ(outcome.stop_reason, "");
  EXPECT_EQ(rules.best_version(), 1u);
  ASSERT_TRUE(rules.best_value().has_value());
  EXPECT_DOUBLE_EQ(*rules.best_value(), 0.5);
  // The next worse val_mae uses up the patience of 1.
  EXPECT_EQ(rules.Add(Record(3, 0.1, 0.75)).stop_reason,
            "early stopping: val_mae did not improve by more than 0 for 1 "
            "validations (best 0.5 at version 1)");
}

TEST(StopRulesTest, ValMaeTargetAndBestAreLowerIsBetter) {
  v1::JobSpec spec;
  spec.mutable_target()->set_metric("val_mae");
  spec.mutable_target()->set_value(0.25);
  spec.mutable_checkpoint()->set_best_metric("val_mae");
  StopRules rules(spec);
  StopRules::Outcome first = rules.Add(Record(1, 9.0, 0.5));
  EXPECT_TRUE(first.best_improved);
  EXPECT_EQ(first.stop_reason, "");
  StopRules::Outcome worse = rules.Add(Record(2, 0.0, 0.75));
  EXPECT_FALSE(worse.best_improved);
  // Equal to the target is not below it (strict, like val_loss).
  StopRules::Outcome equal = rules.Add(Record(3, 9.0, 0.25));
  EXPECT_TRUE(equal.best_improved);
  EXPECT_EQ(equal.stop_reason, "");
  StopRules::Outcome below = rules.Add(Record(4, 9.0, 0.125));
  EXPECT_EQ(below.stop_reason, "target reached: val_mae 0.125 < 0.25");
  EXPECT_EQ(rules.best_version(), 4u);
  // A record without val_mae never reaches the target.
  EXPECT_EQ(rules.Add(Record(5, 0.0, std::nan(""))).stop_reason, "");
}

}  // namespace
}  // namespace mpilearn::server

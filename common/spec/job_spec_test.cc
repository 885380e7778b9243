#include "common/spec/job_spec.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mpilearn {
namespace {

constexpr char kMinimal[] = R"({
  "data": {"train_images": "train-images.gz", "train_labels": "train-labels.gz"}
})";

// Every (spec JSON, message part) pair is refused as InvalidArgument with a
// message containing the part.
void ExpectRefused(const std::vector<std::pair<std::string, std::string>>& bad) {
  for (const auto& [json, message] : bad) {
    auto refused = ParseJobSpecJson(json);
    ASSERT_FALSE(refused.ok()) << json;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(message), std::string::npos)
        << refused.status().message();
  }
}

TEST(JobSpecTest, MinimalSpecGetsDefaults) {
  auto spec = ParseJobSpecJson(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().name(), "mlp");
  EXPECT_EQ(spec->model().hidden_size(), 2);
  EXPECT_EQ(spec->optimizer().name(), "adam");
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 1e-3);
  EXPECT_DOUBLE_EQ(spec->optimizer().beta2(), 0.999);
  EXPECT_EQ(spec->algorithm(), "downpour");
  EXPECT_EQ(spec->epochs(), 5);
  EXPECT_EQ(spec->batch_size(), 64);
  EXPECT_EQ(spec->sync_every(), 1);
  EXPECT_EQ(spec->exchange().updates_in_flight(), 1);
  EXPECT_EQ(spec->seed(), 1u);
  EXPECT_EQ(spec->data().validation_count(), 5000);
}

TEST(JobSpecTest, SharingFieldsGetDefaultsAndRanges) {
  auto spec = ParseJobSpecJson(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->priority(), 0);
  EXPECT_EQ(spec->max_wall_seconds(), 0);
  EXPECT_EQ(spec->owner(), "");
  auto with = [](const std::string& fields) {
    return std::string(kMinimal).substr(0, std::string(kMinimal).rfind('}')) + ", " + fields +
           "}";
  };
  auto set = ParseJobSpecJson(with(R"("priority": -100, "maxWallSeconds": 90.5,
                                      "owner": "alice@lab", "study": "s-3")"));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->priority(), -100);
  EXPECT_EQ(set->max_wall_seconds(), 90.5);
  ExpectRefused({{with(R"("priority": 101)"), "priority"},
                 {with(R"("max_wall_seconds": -1)"), "max_wall_seconds"},
                 {with(R"("max_wall_seconds": 1e9)"), "at most"},
                 {with(R"("owner": "al ice")"), "owner 'al ice' is not a name"},
                 {with(R"("study": "s/3")"), "study 's/3' is not a name"}});
}

TEST(JobSpecTest, FullSpecKeepsValuesAndAcceptsCamelCase) {
  auto spec = ParseJobSpecJson(R"({
    "name": "cnn-run",
    "model": {"name": "cnn", "channels": [8, 16], "dense": 32, "dropout": 0.25},
    "data": {"trainImages": "a", "trainLabels": "b", "train_limit": 1000,
             "validation_count": 100},
    "optimizer": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9,
                  "nesterov": true},
    "algorithm": "sync", "epochs": 2, "batch_size": 32, "sync_every": 4,
    "seed": 7
  })");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().channels(1), 16);
  EXPECT_EQ(spec->model().dense(), 32);
  EXPECT_EQ(spec->data().train_images(), "a");
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
  EXPECT_TRUE(spec->optimizer().nesterov());
  EXPECT_EQ(spec->algorithm(), "sync");
  EXPECT_EQ(spec->sync_every(), 4);
  EXPECT_EQ(spec->seed(), 7u);
}

// Each optimizer's PyTorch defaults are written into the spec; fields the
// optimizer does not use are left out.
// HDF5/NumPy file lists instead of IDX files.
TEST(JobSpecTest, DataFileListsGetDefaultsAndExcludeIdx) {
  auto spec = ParseJobSpecJson(R"({"data": {"train_files": ["/d/a.h5", "/d/b.h5"],
                                            "test_files": ["/d/test.txt"]}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().features_dataset(), "features");
  EXPECT_EQ(spec->data().labels_dataset(), "labels");
  EXPECT_EQ(spec->data().validation_count(), 5000);
  auto separate = ParseJobSpecJson(R"({"data": {"train_files": ["a.npz"],
      "validation_files": ["v.npz"], "features_dataset": "x", "labels_dataset": "y"}})");
  ASSERT_TRUE(separate.ok()) << separate.status();
  EXPECT_EQ(separate->data().validation_count(), 0);
  EXPECT_EQ(separate->data().features_dataset(), "x");

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"data": {"train_files": ["a.h5"], "train_images": "x.gz"}})",
       "not both"},
      {R"({"data": {"train_images": "x.gz", "train_labels": "y.gz",
                    "test_files": ["t.h5"]}})",
       "need data.train_files"},
      {R"({"data": {"train_files": [""]}})", "data.train_files[0]"},
      {R"({"data": {"train_files": ["a.h5"], "features_dataset": "z",
                    "labels_dataset": "z"}})",
       "both 'z'"},
      {R"({"data": {}})", "data.train_files"},
  };
  ExpectRefused(bad);
}

// What a bad value or a failed read of a training unit does.
TEST(JobSpecTest, BadValuesAndUnitFailuresGetDefaultsAndRanges) {
  auto defaults = ParseJobSpecJson(R"({"data": {"train_files": ["a.h5"]}})");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->data().bad_values(), "fail");
  ASSERT_TRUE(defaults->data().has_max_unit_failures());
  EXPECT_EQ(defaults->data().max_unit_failures(), 3);

  auto kept = ParseJobSpecJson(R"({"data": {"train_files": ["a.h5"],
      "bad_values": "skip", "max_unit_failures": 1}})");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->data().bad_values(), "skip");
  EXPECT_EQ(kept->data().max_unit_failures(), 1);
  auto most = ParseJobSpecJson(R"({"data": {"train_files": ["a.h5"],
      "bad_values": "fail", "max_unit_failures": 1000}})");
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ(most->data().max_unit_failures(), 1000);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"data": {"train_files": ["a.h5"], "bad_values": "drop"}})",
       "data.bad_values: unknown policy 'drop'; available: 'fail', 'skip'"},
      {R"({"data": {"train_files": ["a.h5"], "bad_values": "SKIP"}})",
       "data.bad_values"},
      {R"({"data": {"train_files": ["a.h5"], "max_unit_failures": 0}})",
       "data.max_unit_failures must be in [1, 1000], got 0"},
      {R"({"data": {"train_files": ["a.h5"], "max_unit_failures": 1001}})",
       "data.max_unit_failures must be in [1, 1000], got 1001"},
      {R"({"data": {"train_files": ["a.h5"], "max_unit_failures": -2}})",
       "data.max_unit_failures"},
  };
  ExpectRefused(bad);
}

// Cross-validation: data.folds and data.fold choose the held-out rows, so
// validation_count defaults to 0 and nothing else may choose them.
TEST(JobSpecTest, DataFoldsGetDefaultsAndChecks) {
  auto off = ParseJobSpecJson(kMinimal);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->data().folds(), 0);
  EXPECT_FALSE(off->data().has_fold());
  EXPECT_EQ(off->data().validation_count(), 5000);

  auto spec = ParseJobSpecJson(R"({"data": {"train_files": ["a.h5"], "folds": 5, "fold": 2}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().folds(), 5);
  EXPECT_EQ(spec->data().fold(), 2);
  ASSERT_TRUE(spec->data().has_validation_count());
  EXPECT_EQ(spec->data().validation_count(), 0);
  // Normalized again (a resubmitted spec), validation_count 0 still passes.
  v1::JobSpec again = *spec;
  ASSERT_TRUE(NormalizeJobSpec(&again).ok());
  EXPECT_EQ(again.SerializeAsString(), spec->SerializeAsString());

  auto first = ParseJobSpecJson(R"({"data": {"train_images": "a", "train_labels": "b",
                                             "folds": 100, "validation_count": 0}})");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->data().has_fold());
  EXPECT_EQ(first->data().fold(), 0);
  EXPECT_EQ(first->data().validation_count(), 0);

  const std::string idx = R"("train_images": "a", "train_labels": "b")";
  auto data = [&](const std::string& fields) {
    return absl::StrCat(R"({"data": {)", idx, ", ", fields, "}}");
  };
  ExpectRefused({
      {data(R"("folds": 1)"), "data.folds is 1"},
      {data(R"("folds": 1)"), "give 2 or more, or leave it unset"},
      {data(R"("folds": -2)"), "data.folds must be 0 (off) or in [2, 100], got -2"},
      {data(R"("folds": 101)"), "data.folds must be 0 (off) or in [2, 100], got 101"},
      {data(R"("fold": 1)"), "data.fold is 1 but data.folds is not set"},
      {data(R"("folds": 0, "fold": 0)"), "data.fold is 0 but data.folds is not set"},
      {data(R"("folds": 4, "fold": 4)"),
       "data.fold is 4 but data.folds is 4; the held-out block must be in [0, 3]"},
      {data(R"("folds": 4, "fold": -1)"), "data.fold is -1"},
      {data(R"("folds": 3, "validation_images": "c", "validation_labels": "d")"),
       "data.folds holds out each fold in turn; remove data.validation_images and "
       "data.validation_labels"},
      {R"({"data": {"train_files": ["a.h5"], "validation_files": ["v.h5"], "folds": 3}})",
       "data.folds holds out each fold in turn; remove data.validation_files"},
      {data(R"("folds": 3, "validation_count": 10)"),
       "data.validation_count and data.folds both choose the validation rows; give one"},
      {data(R"("folds": 3, "validation_count": -1)"), "data.validation_count must be in"},
  });
}

TEST(JobSpecTest, NormalizationGetsDefaultsAndChecks) {
  auto none = ParseJobSpecJson(R"({"data": {"train_files": ["a.h5"]}})");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->data().normalization().mode(), "none");
  auto scale = ParseJobSpecJson(
      R"({"data": {"train_files": ["a.h5"], "normalization": {"mode": "scale"}}})");
  ASSERT_TRUE(scale.ok()) << scale.status();
  EXPECT_EQ(scale->data().normalization().scale(), 1.0);
  EXPECT_EQ(scale->data().normalization().offset(), 0.0);
  auto standardize = ParseJobSpecJson(R"({"data": {"train_images": "x.gz",
      "train_labels": "y.gz", "normalization": {"mode": "standardize"}}})");
  ASSERT_TRUE(standardize.ok()) << standardize.status();
  EXPECT_EQ(standardize->data().normalization().sample_rows(), 100000);
  ExpectRefused({
      {R"({"data": {"train_files": ["a.h5"], "normalization": {"mode": "minmax"}}})",
       "data.normalization.mode: unknown mode 'minmax'"},
      {R"({"data": {"train_files": ["a.h5"],
          "normalization": {"mode": "scale", "scale": 0}}})",
       "data.normalization.scale must be finite and not 0, got 0"},
      {R"({"data": {"train_files": ["a.h5"],
          "normalization": {"mode": "standardize", "sample_rows": 0}}})",
       "data.normalization.sample_rows must be in [1, 100000000], got 0"},
  });
}

TEST(JobSpecTest, EveryOptimizerGetsItsDefaults) {
  auto with_optimizer = [](const std::string& optimizer) {
    return ParseJobSpecJson(
        absl::StrCat(R"({"optimizer": {"name": ")", optimizer,
                     R"("}, "data": {"train_images": "a", "train_labels": "b"}})"));
  };
  auto sgd = with_optimizer("sgd");
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_DOUBLE_EQ(sgd->optimizer().learning_rate(), 0.01);
  EXPECT_EQ(sgd->optimizer().momentum(), 0.0);
  EXPECT_TRUE(sgd->optimizer().has_nesterov());
  EXPECT_FALSE(sgd->optimizer().has_beta1());

  auto adamw = with_optimizer("adamw");
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_DOUBLE_EQ(adamw->optimizer().learning_rate(), 1e-3);
  EXPECT_DOUBLE_EQ(adamw->optimizer().weight_decay(), 0.01);
  EXPECT_DOUBLE_EQ(adamw->optimizer().beta1(), 0.9);
  EXPECT_DOUBLE_EQ(adamw->optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(adamw->optimizer().epsilon(), 1e-8);

  auto rmsprop = with_optimizer("rmsprop");
  ASSERT_TRUE(rmsprop.ok()) << rmsprop.status();
  EXPECT_DOUBLE_EQ(rmsprop->optimizer().learning_rate(), 0.01);
  EXPECT_DOUBLE_EQ(rmsprop->optimizer().alpha(), 0.99);
  EXPECT_DOUBLE_EQ(rmsprop->optimizer().epsilon(), 1e-8);
  EXPECT_EQ(rmsprop->optimizer().weight_decay(), 0.0);
  EXPECT_TRUE(rmsprop->optimizer().has_momentum());
  EXPECT_TRUE(rmsprop->optimizer().has_centered());
  EXPECT_FALSE(rmsprop->optimizer().centered());

  auto adadelta = with_optimizer("adadelta");
  ASSERT_TRUE(adadelta.ok()) << adadelta.status();
  EXPECT_DOUBLE_EQ(adadelta->optimizer().learning_rate(), 1.0);
  EXPECT_DOUBLE_EQ(adadelta->optimizer().rho(), 0.9);
  EXPECT_DOUBLE_EQ(adadelta->optimizer().epsilon(), 1e-6);

  auto adagrad = with_optimizer("adagrad");
  ASSERT_TRUE(adagrad.ok()) << adagrad.status();
  EXPECT_DOUBLE_EQ(adagrad->optimizer().learning_rate(), 0.01);
  EXPECT_TRUE(adagrad->optimizer().has_lr_decay());
  EXPECT_EQ(adagrad->optimizer().lr_decay(), 0.0);
  EXPECT_TRUE(adagrad->optimizer().has_initial_accumulator_value());
  EXPECT_EQ(adagrad->optimizer().initial_accumulator_value(), 0.0);
  EXPECT_DOUBLE_EQ(adagrad->optimizer().epsilon(), 1e-10);
  EXPECT_FALSE(adagrad->optimizer().has_momentum());
}

TEST(JobSpecTest, NewOptimizerFieldsAreKept) {
  auto spec = ParseJobSpecJson(R"({
    "optimizer": {"name": "rmsprop", "alpha": 0.9, "centered": true,
                  "momentum": 0.5},
    "data": {"train_images": "a", "train_labels": "b"}
  })");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->optimizer().alpha(), 0.9);
  EXPECT_TRUE(spec->optimizer().centered());
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.5);
  auto adagrad = ParseJobSpecJson(R"({
    "optimizer": {"name": "adagrad", "lrDecay": 0.01,
                  "initialAccumulatorValue": 0.1},
    "data": {"train_images": "a", "train_labels": "b"}
  })");
  ASSERT_TRUE(adagrad.ok()) << adagrad.status();
  EXPECT_DOUBLE_EQ(adagrad->optimizer().lr_decay(), 0.01);
  EXPECT_DOUBLE_EQ(adagrad->optimizer().initial_accumulator_value(), 0.1);
}

TEST(JobSpecTest, TrainingAndDataFieldsGetDefaults) {
  auto spec = ParseJobSpecJson(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->has_max_staleness());
  EXPECT_EQ(spec->max_staleness(), 0);
  EXPECT_EQ(spec->staleness_scaling(), "none");
  EXPECT_EQ(spec->data_unit_size(), 2048);
  // Sections of algorithms the job does not use stay empty.
  EXPECT_FALSE(spec->has_easgd());
  EXPECT_FALSE(spec->has_gem());
}

TEST(JobSpecTest, EasgdGetsDefaults) {
  auto spec = ParseJobSpecJson(R"({"algorithm": "easgd", "max_staleness": 4,
      "staleness_scaling": "inverse", "data_unit_size": 100,
      "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_staleness(), 4);
  EXPECT_EQ(spec->staleness_scaling(), "inverse");
  EXPECT_EQ(spec->data_unit_size(), 100);
  EXPECT_DOUBLE_EQ(spec->easgd().alpha(), 0.1);
  const v1::OptimizerSpec& local = spec->easgd().worker_optimizer();
  EXPECT_EQ(local.name(), "sgd");
  EXPECT_DOUBLE_EQ(local.learning_rate(), 0.05);
  EXPECT_DOUBLE_EQ(local.momentum(), 0.9);
  EXPECT_TRUE(local.has_nesterov());
  EXPECT_FALSE(local.nesterov());
  EXPECT_TRUE(local.has_weight_decay());
  EXPECT_EQ(local.weight_decay(), 0.0);
  EXPECT_FALSE(spec->has_gem());
}

TEST(JobSpecTest, EasgdKeepsValues) {
  auto spec = ParseJobSpecJson(R"({"algorithm": "easgd",
      "easgd": {"alpha": 0.3, "worker_optimizer": {"learning_rate": 0.2,
                "momentum": 0.5, "nesterov": true, "weight_decay": 0.001}},
      "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->easgd().alpha(), 0.3);
  EXPECT_DOUBLE_EQ(spec->easgd().worker_optimizer().learning_rate(), 0.2);
  EXPECT_DOUBLE_EQ(spec->easgd().worker_optimizer().momentum(), 0.5);
  EXPECT_TRUE(spec->easgd().worker_optimizer().nesterov());
  EXPECT_DOUBLE_EQ(spec->easgd().worker_optimizer().weight_decay(), 0.001);
}

// The ranks' own optimizer of easgd and gem: adam with PyTorch's defaults;
// gem without one keeps its plain step (no worker_optimizer written).
TEST(JobSpecTest, WorkerOptimizersGetTheirDefaults) {
  auto easgd = ParseJobSpecJson(R"({"algorithm": "easgd",
    "easgd": {"worker_optimizer": {"name": "adam"}},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(easgd.ok()) << easgd.status();
  const v1::OptimizerSpec& adam = easgd->easgd().worker_optimizer();
  EXPECT_DOUBLE_EQ(adam.learning_rate(), 1e-3);
  EXPECT_DOUBLE_EQ(adam.beta1(), 0.9);
  EXPECT_DOUBLE_EQ(adam.beta2(), 0.999);
  EXPECT_DOUBLE_EQ(adam.epsilon(), 1e-8);
  EXPECT_DOUBLE_EQ(adam.weight_decay(), 0.0);
  auto gem = ParseJobSpecJson(R"({"algorithm": "gem", "gem": {"worker_optimizer": {}},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(gem.ok()) << gem.status();
  EXPECT_EQ(gem->gem().worker_optimizer().name(), "sgd");
  EXPECT_DOUBLE_EQ(gem->gem().worker_optimizer().learning_rate(), 0.05);
  EXPECT_DOUBLE_EQ(gem->gem().worker_optimizer().momentum(), 0.0);
  auto plain = ParseJobSpecJson(R"({"algorithm": "gem",
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->gem().has_worker_optimizer());
}

TEST(JobSpecTest, GemGetsDefaults) {
  auto spec = ParseJobSpecJson(R"({"algorithm": "gem", "gem": {"kappa": 2},
      "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->gem().learning_rate(), 0.05);
  EXPECT_DOUBLE_EQ(spec->gem().momentum(), 0.99);
  EXPECT_DOUBLE_EQ(spec->gem().kappa(), 2.0);
  EXPECT_FALSE(spec->has_easgd());
}

// Checkpoints, snapshots and in-band validation are always defaulted; early
// stopping and the target rule stay off (absent) unless given.
TEST(JobSpecTest, StopRulesAndCheckpointsGetDefaults) {
  auto spec = ParseJobSpecJson(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_early_stopping());
  EXPECT_FALSE(spec->has_target());
  EXPECT_EQ(spec->checkpoint().every_updates(), 0);
  EXPECT_DOUBLE_EQ(spec->checkpoint().every_seconds(), 60.0);
  EXPECT_EQ(spec->checkpoint().keep(), 3);
  EXPECT_EQ(spec->checkpoint().best_metric(), "val_loss");
  EXPECT_EQ(spec->snapshots().every_updates(), 0);
  EXPECT_TRUE(spec->snapshots().at_epoch_end());
  EXPECT_TRUE(spec->inband_validation());

  auto rules = ParseJobSpecJson(R"({"early_stopping": {}, "target": {},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(rules.ok()) << rules.status();
  ASSERT_TRUE(rules->has_early_stopping());
  EXPECT_EQ(rules->early_stopping().metric(), "val_loss");
  EXPECT_EQ(rules->early_stopping().patience(), 4);
  EXPECT_EQ(rules->early_stopping().min_delta(), 0.0);
  EXPECT_EQ(rules->early_stopping().smoothing(), 1);
  EXPECT_EQ(rules->target().metric(), "val_accuracy");
  EXPECT_FALSE(rules->target().has_value());  // present but off
}

TEST(JobSpecTest, StopRulesAndCheckpointsKeepValues) {
  auto spec = ParseJobSpecJson(R"({
    "early_stopping": {"metric": "val_accuracy", "patience": 2,
                       "min_delta": 0.01, "smoothing": 3},
    "target": {"metric": "val_loss", "value": 0.25},
    "checkpoint": {"every_updates": 500, "every_seconds": 0, "keep": 1,
                   "best_metric": "none"},
    "snapshots": {"every_updates": 100, "at_epoch_end": false},
    "inband_validation": false,
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->early_stopping().metric(), "val_accuracy");
  EXPECT_EQ(spec->early_stopping().patience(), 2);
  EXPECT_DOUBLE_EQ(spec->early_stopping().min_delta(), 0.01);
  EXPECT_EQ(spec->early_stopping().smoothing(), 3);
  EXPECT_EQ(spec->target().metric(), "val_loss");
  EXPECT_DOUBLE_EQ(spec->target().value(), 0.25);
  EXPECT_EQ(spec->checkpoint().every_updates(), 500);
  EXPECT_EQ(spec->checkpoint().every_seconds(), 0.0);
  EXPECT_EQ(spec->checkpoint().keep(), 1);
  EXPECT_EQ(spec->checkpoint().best_metric(), "none");
  EXPECT_EQ(spec->snapshots().every_updates(), 100);
  EXPECT_FALSE(spec->snapshots().at_epoch_end());
  EXPECT_FALSE(spec->inband_validation());
  // A target loss may be any finite number.
  auto negative = ParseJobSpecJson(R"({"target": {"metric": "val_loss",
    "value": -3}, "data": {"train_images": "a", "train_labels": "b"}})");
  EXPECT_TRUE(negative.ok()) << negative.status();
}

TEST(JobSpecTest, ToJsonRoundTrips) {
  auto spec = ParseJobSpecJson(kMinimal);
  ASSERT_TRUE(spec.ok());
  auto again = ParseJobSpecJson(JobSpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), spec->SerializeAsString());
}

TEST(JobSpecTest, LossDefaultsToCategoricalCrossentropy) {
  auto spec = ParseJobSpecJson(kMinimal);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->loss(), "categorical_crossentropy");
  EXPECT_FALSE(spec->has_huber_delta());  // only huber uses it
  auto huber = ParseJobSpecJson(R"({"loss": "huber",
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(huber.ok()) << huber.status();
  EXPECT_DOUBLE_EQ(huber->huber_delta(), 1.0);
  auto kept = ParseJobSpecJson(R"({"loss": "huber", "huber_delta": 0.25,
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_DOUBLE_EQ(kept->huber_delta(), 0.25);
}

// A regression loss reports val_loss, val_mae and val_mse; the target rule
// defaults to val_loss for it, and to val_accuracy for classification.
TEST(JobSpecTest, MetricsFollowTheLoss) {
  auto regression = ParseJobSpecJson(R"({"loss": "mse",
    "early_stopping": {"metric": "val_mae"}, "target": {},
    "checkpoint": {"best_metric": "val_mse"},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(regression.ok()) << regression.status();
  EXPECT_EQ(regression->early_stopping().metric(), "val_mae");
  EXPECT_EQ(regression->target().metric(), "val_loss");
  EXPECT_EQ(regression->checkpoint().best_metric(), "val_mse");
  auto mae_target = ParseJobSpecJson(R"({"loss": "mae",
    "target": {"metric": "val_mae", "value": 0.05},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(mae_target.ok()) << mae_target.status();
  EXPECT_DOUBLE_EQ(mae_target->target().value(), 0.05);
  auto binary = ParseJobSpecJson(R"({"loss": "binary_crossentropy",
    "target": {"value": 0.75}, "early_stopping": {"metric": "val_accuracy"},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(binary.ok()) << binary.status();
  EXPECT_EQ(binary->target().metric(), "val_accuracy");
}

TEST(JobSpecTest, LossOptionsAreKeptAndCheckedAgainstTheLoss) {
  auto weighted = ParseJobSpecJson(R"({"loss_options": {"class_weights": [1, 0.5, 0],
    "label_smoothing": 0.1, "top_k": 3}, "early_stopping": {"metric": "val_top3_accuracy"},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(weighted.ok()) << weighted.status();
  EXPECT_EQ(weighted->loss_options().class_weights_size(), 3);
  EXPECT_DOUBLE_EQ(weighted->loss_options().label_smoothing(), 0.1);
  EXPECT_EQ(TopKOf(*weighted), 3);
  auto plain = ParseJobSpecJson(kMinimal);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(TopKOf(*plain), 5);
  EXPECT_FALSE(plain->has_loss_options());  // no default written
  auto binary = ParseJobSpecJson(R"({"loss": "binary_crossentropy",
    "loss_options": {"pos_weight": [4]}, "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(binary.ok()) << binary.status();
  auto scripted = ParseJobSpecJson(R"({"loss_options": {"torchscript": "/m/focal.pt"},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(scripted.ok()) << scripted.status();
  const std::string data = R"("data": {"train_images": "a", "train_labels": "b"})";
  ExpectRefused({
      {absl::StrCat(R"({"loss": "mse", "loss_options": {"class_weights": [1]}, )", data, "}"),
       "loss_options.class_weights applies to categorical_crossentropy only; this job's loss "
       "is 'mse'"},
      {absl::StrCat(R"({"loss_options": {"class_weights": [1, -1]}, )", data, "}"),
       "loss_options.class_weights[1] must be a finite number >= 0, got -1"},
      {absl::StrCat(R"({"loss_options": {"class_weights": [0, 0]}, )", data, "}"),
       "loss_options.class_weights are all 0"},
      {absl::StrCat(R"({"loss_options": {"label_smoothing": 1}, )", data, "}"),
       "loss_options.label_smoothing must be in [0, 1), got 1"},
      {absl::StrCat(R"({"loss": "binary_crossentropy", "loss_options": {"label_smoothing": 0.1}, )",
                    data, "}"),
       "loss_options.label_smoothing applies to categorical_crossentropy only"},
      {absl::StrCat(R"({"loss_options": {"pos_weight": [2]}, )", data, "}"),
       "loss_options.pos_weight applies to binary_crossentropy only"},
      {absl::StrCat(R"({"loss": "binary_crossentropy", "loss_options": {"pos_weight": [0]}, )",
                    data, "}"),
       "loss_options.pos_weight[0] must be a finite number > 0, got 0"},
      {absl::StrCat(R"({"loss_options": {"top_k": 1}, )", data, "}"),
       "loss_options.top_k must be in [2, 1000], got 1"},
      {absl::StrCat(R"({"loss": "huber", "loss_options": {"top_k": 3}, )", data, "}"),
       "loss_options.top_k applies to categorical_crossentropy only"},
      {absl::StrCat(R"({"loss_options": {"torchscript": "l.pt", "label_smoothing": 0.1}, )",
                    data, "}"),
       "loss_options.torchscript replaces the built-in loss"},
      {absl::StrCat(R"({"loss_options": {"torchscript": ")", std::string(5000, 'x'), R"("}, )",
                    data, "}"),
       "loss_options.torchscript: a path of at most 4096 bytes, got 5000"},
      {absl::StrCat(R"({"warm_start": {"job_id": "job-000001", "checkpoint": "c.pb"}, )", data,
                    "}"),
       "warm_start names 2 sources; give exactly one"},
      {absl::StrCat(R"({"warm_start": {"optimizer_state": true}, )", data, "}"),
       "warm_start names 0 sources"},
      {absl::StrCat(R"({"warm_start": {"job_id": "j", "torchscript": "m.pt"}, )", data, "}"),
       "warm_start names 2 sources; give exactly one: job_id (a job on this master), checkpoint "
       "(a file the master reads) or torchscript (an exported model the workers read)"},
      {absl::StrCat(R"({"warm_start": {"torchscript": "m.pt", "optimizer_state": true}, )", data,
                    "}"),
       "warm_start.optimizer_state: a TorchScript file holds no optimizer state"},
      // The metric follows the k: top-5 is not reported with top_k 3.
      {absl::StrCat(R"({"loss_options": {"top_k": 3}, "early_stopping": )",
                    R"({"metric": "val_top5_accuracy"}, )", data, "}"),
       "unknown metric 'val_top5_accuracy'; available: 'val_loss', 'val_accuracy', "
       "'val_top3_accuracy' (over 3+ classes)"},
  });
}

// Several inputs and outputs: the data lists, the outputs' defaults, the
// metrics each output reports, and every refusal naming its field.
TEST(JobSpecTest, SeveralInputsAndOutputs) {
  const std::string files =
      R"("train_files": ["t.h5"], "features_datasets": ["jets", "tracks"])";
  auto spec = ParseJobSpecJson(absl::StrCat(R"({"data": {)", files,
                                            R"(, "labels_datasets": ["kind", "energy"]},
      "outputs": [{"name": "kind", "top_k": 2}, {"loss": "huber", "weight": 0.5}],
      "early_stopping": {"metric": "val_out1_mae"}})"));
  EXPECT_FALSE(spec.ok());  // top_k belongs in loss_options
  spec = ParseJobSpecJson(absl::StrCat(R"({"data": {)", files,
                                       R"(, "labels_datasets": ["kind", "energy"]},
      "outputs": [{"name": "kind", "loss_options": {"top_k": 2}},
                  {"loss": "huber", "weight": 0.5}],
      "early_stopping": {"metric": "val_out1_mae"}, "target": {"value": 0.05}})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->loss().empty());  // each output has its own
  EXPECT_EQ(spec->data().features_dataset(), "");
  EXPECT_EQ(spec->outputs(0).loss(), "categorical_crossentropy");
  EXPECT_DOUBLE_EQ(spec->outputs(0).weight(), 1.0);
  EXPECT_EQ(spec->outputs(1).name(), "out1");
  EXPECT_DOUBLE_EQ(spec->outputs(1).huber_delta(), 1.0);
  EXPECT_EQ(spec->target().metric(), "val_loss");
  EXPECT_THAT(ReportedMetrics(*spec),
              ::testing::ElementsAre("val_loss", "val_kind_loss", "val_kind_accuracy",
                                     "val_kind_top2_accuracy", "val_out1_loss", "val_out1_mae",
                                     "val_out1_mse"));
  EXPECT_TRUE(HigherIsBetter("val_kind_top2_accuracy"));
  // One labels dataset with one named output is a job of outputs too.
  auto one = ParseJobSpecJson(
      R"({"data": {"train_files": ["t.h5"]}, "outputs": [{"name": "y", "loss": "mse"}],
          "checkpoint": {"best_metric": "val_y_mse"}})");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->data().labels_dataset(), "labels");

  const std::string two = absl::StrCat(R"("data": {)", files,
                                       R"(, "labels_datasets": ["kind", "energy"]})");
  ExpectRefused({
      {absl::StrCat("{", two, "}"),
       "data.labels_datasets names 2 datasets: give the job one entry in outputs per labels "
       "dataset"},
      {absl::StrCat("{", two, R"(, "outputs": [{"name": "kind"}]})"),
       "outputs has 1 entries but the data has 2 labels datasets"},
      {absl::StrCat("{", two, R"(, "loss": "mse", "outputs": [{}, {}]})"),
       "outputs gives each output its loss: leave loss, huber_delta and loss_options out"},
      {absl::StrCat("{", two, R"(, "outputs": [{"name": "Kind"}, {}]})"),
       "outputs[0].name 'Kind' must be 1 to 32 lowercase letters"},
      {absl::StrCat("{", two, R"(, "outputs": [{"name": "a"}, {"name": "a"}]})"),
       "outputs[1].name 'a' is also an earlier output's"},
      {absl::StrCat("{", two, R"(, "outputs": [{}, {"loss": "l2"}]})"),
       "outputs[1].loss: unknown loss 'l2'"},
      {absl::StrCat("{", two, R"(, "outputs": [{"weight": 0}, {"weight": 0}]})"),
       "outputs: every weight is 0"},
      {absl::StrCat("{", two, R"(, "outputs": [{"weight": -1}, {}]})"),
       "outputs[0].weight must be a finite number >= 0, got -1"},
      {absl::StrCat("{", two, R"(, "outputs": [{}, {"loss": "mse", "huber_delta": 2}]})"),
       "outputs[1].huber_delta applies to the huber loss only"},
      {absl::StrCat("{", two,
                    R"(, "outputs": [{}, {"loss": "mse", "loss_options": {"pos_weight": [2]}}]})"),
       "outputs[1].loss_options.pos_weight applies to binary_crossentropy only; this output's "
       "loss is 'mse'"},
      {absl::StrCat("{", two, R"(, "outputs": [{}, {}], "early_stopping": {"metric": "val_accuracy"}})"),
       "early_stopping.metric: unknown metric 'val_accuracy'; available: 'val_loss', "
       "'val_out0_loss'"},
      {R"({"data": {"train_images": "a", "train_labels": "b"}, "outputs": [{}]})",
       "outputs needs file-list data"},
      {R"({"data": {"train_files": ["t.h5"], "features_dataset": "x",
          "features_datasets": ["a", "b"]}})",
       "data: give features_dataset (one dataset) or features_datasets (several), not both"},
      {R"({"data": {"train_files": ["t.h5"], "features_datasets": ["a", "labels"]}})",
       "data.features_datasets[1] and data.labels_dataset are both 'labels'"},
      {R"({"data": {"train_files": ["t.h5"], "features_datasets": ["a", ""]}})",
       "data.features_datasets[1] must be a name of 1 to 1024 bytes"},
  });
}

TEST(JobSpecTest, HigherIsBetterForAccuraciesAndAuc) {
  // Outputs' metrics too: val_<output>_accuracy (an output may be named
  // "top"), val_<output>_auc.
  for (const char* metric : {"val_accuracy", "val_auc", "val_top5_accuracy", "val_top12_accuracy",
                             "val_top_accuracy", "val_kind_accuracy", "val_kind_auc",
                             "val_kind_top3_accuracy"}) {
    EXPECT_TRUE(HigherIsBetter(metric)) << metric;
  }
  for (const char* metric : {"val_loss", "val_mae", "val_mse", "accuracy", "val_kind_loss",
                             "val_energy_mae", "val_energy_mse", "test_accuracy"}) {
    EXPECT_FALSE(HigherIsBetter(metric)) << metric;
  }
  EXPECT_EQ(TopKMetricName(7), "val_top7_accuracy");
  EXPECT_EQ(TopKOfMetric("val_top12_accuracy"), 12);
  EXPECT_EQ(TopKOfMetric("val_top1_accuracy"), std::nullopt);
  EXPECT_EQ(TopKOfMetric("val_accuracy"), std::nullopt);
}

TEST(JobSpecTest, EveryBuiltInModelGetsItsDefaults) {
  auto with_model = [](const std::string& model) {
    return ParseJobSpecJson(absl::StrCat(
        R"({"model": )", model,
        R"(, "data": {"train_images": "a", "train_labels": "b"}})"));
  };
  for (const std::string name : {"cnn", "cnn1d"}) {
    auto spec = with_model(absl::StrCat(R"({"name": ")", name, R"("})"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    const v1::ModelSpec& model = spec->model();
    EXPECT_EQ(
        std::vector<int>(model.channels().begin(), model.channels().end()),
        (std::vector<int>{32, 64}));
    EXPECT_EQ(model.kernel_size(), 3);
    EXPECT_EQ(model.padding(), "same");
    EXPECT_EQ(model.pool_every(), 1);
    EXPECT_EQ(model.dense(), 128);
    EXPECT_EQ(model.conv_dropout(), 0.0);
    EXPECT_TRUE(model.has_batch_norm());
    EXPECT_FALSE(model.batch_norm());
    EXPECT_EQ(model.dropout(), 0.0);
    EXPECT_TRUE(model.hidden().empty());  // the mlp's field: left alone
    EXPECT_TRUE(model.recurrent().empty());
  }
  for (const std::string name : {"gru", "lstm"}) {
    auto spec = with_model(absl::StrCat(R"({"name": ")", name, R"("})"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    const v1::ModelSpec& model = spec->model();
    EXPECT_EQ(std::vector<int>(model.recurrent().begin(),
                               model.recurrent().end()),
              (std::vector<int>{64}));
    EXPECT_TRUE(model.has_dense());
    EXPECT_EQ(model.dense(), 0);
    EXPECT_FALSE(model.batch_norm());
    EXPECT_FALSE(model.has_kernel_size());  // the cnn's field: left alone
    EXPECT_TRUE(model.channels().empty());
  }
  // Values given are kept, including a single conv layer and no pooling.
  auto cnn = with_model(R"({"name": "cnn1d", "channels": [16], "kernel_size": 5,
    "padding": "valid", "pool_every": 0, "dense": 0, "conv_dropout": 0.25,
    "batch_norm": true, "dropout": 0.5, "hidden": [7]})");
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_EQ(cnn->model().channels_size(), 1);
  EXPECT_EQ(cnn->model().kernel_size(), 5);
  EXPECT_EQ(cnn->model().padding(), "valid");
  EXPECT_EQ(cnn->model().pool_every(), 0);
  EXPECT_EQ(cnn->model().dense(), 0);
  EXPECT_DOUBLE_EQ(cnn->model().conv_dropout(), 0.25);
  EXPECT_TRUE(cnn->model().batch_norm());
  EXPECT_EQ(cnn->model().hidden_size(), 1);  // as given
  auto mlp = with_model(R"({"channels": [5]})");
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_EQ(mlp->model().name(), "mlp");
  EXPECT_EQ(mlp->model().hidden_size(), 2);
  EXPECT_EQ(mlp->model().channels_size(), 1);
  EXPECT_FALSE(mlp->model().has_kernel_size());
}

// A TorchScript path names the model; no built-in field is filled or
// checked.
TEST(JobSpecTest, TorchscriptModelSkipsBuiltInChecks) {
  auto spec = ParseJobSpecJson(R"({"model": {"name": "cnn",
    "torchscript": "/models/net.pt", "channels": [0], "dropout": 3},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().name(), "torchscript");
  EXPECT_EQ(spec->model().torchscript(), "/models/net.pt");
  EXPECT_EQ(spec->model().channels(0), 0);
  EXPECT_FALSE(spec->model().has_kernel_size());
  EXPECT_FALSE(spec->model().has_batch_norm());
  auto named = ParseJobSpecJson(R"({"model": {"name": "torchscript",
    "torchscript": "net.pt"},
    "data": {"train_images": "a", "train_labels": "b"}})");
  ASSERT_TRUE(named.ok()) << named.status();
}

struct Rejection {
  const char* json;
  const char* must_mention;
};

class JobSpecRejectionTest : public ::testing::TestWithParam<Rejection> {};

TEST_P(JobSpecRejectionTest, RejectsWithFieldName) {
  auto spec = ParseJobSpecJson(GetParam().json);
  ASSERT_FALSE(spec.ok()) << GetParam().json;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find(GetParam().must_mention),
            std::string::npos)
      << spec.status();
}

#define DATA R"("data": {"train_images": "a", "train_labels": "b"})"
#define EIGHT "1, 1, 1, 1, 1, 1, 1, 1"
#define SIXTEEN EIGHT ", " EIGHT
#define SIXTY_FOUR SIXTEEN ", " SIXTEEN ", " SIXTEEN ", " SIXTEEN
#define SIXTY_FIVE SIXTY_FOUR ", 1"
#define SEVENTEEN SIXTEEN ", 1"

INSTANTIATE_TEST_SUITE_P(
    AllRejections, JobSpecRejectionTest,
    ::testing::Values(
        Rejection{"{not json", "not valid JSON"},
        Rejection{R"({"epochz": 3, )" DATA "}", "epochz"},
        Rejection{R"({"model": {"name": "resnet"}, )" DATA "}", "model.name"},
        Rejection{R"({"model": {"hidden": [10, 0]}, )" DATA "}",
                  "model.hidden[1]"},
        Rejection{R"({"model": {"name": "cnn", "channels": [8, 0]}, )" DATA
                  "}",
                  "model.channels[1] must be in [1, 4096], got 0"},
        Rejection{R"({"model": {"name": "cnn1d", "channels": [)" SIXTY_FIVE
                  "]}, " DATA "}",
                  "model.channels must list 1 to 64 values, got 65"},
        Rejection{R"({"model": {"name": "cnn", "kernel_size": 0}, )" DATA "}",
                  "model.kernel_size must be in [1, 64], got 0"},
        Rejection{R"({"model": {"name": "cnn", "kernel_size": 65}, )" DATA "}",
                  "model.kernel_size"},
        Rejection{R"({"model": {"name": "cnn", "padding": "full"}, )" DATA "}",
                  "model.padding: unknown padding 'full'; available: 'same', "
                  "'valid'"},
        Rejection{R"({"model": {"name": "cnn1d", "pool_every": 65}, )" DATA "}",
                  "model.pool_every must be in [0, 64], got 65"},
        Rejection{R"({"model": {"name": "cnn", "pool_every": -1}, )" DATA "}",
                  "model.pool_every"},
        Rejection{R"({"model": {"name": "cnn", "dense": -1}, )" DATA "}",
                  "model.dense must be in [0, 1048576], got -1"},
        Rejection{R"({"model": {"name": "cnn", "conv_dropout": 1}, )" DATA "}",
                  "model.conv_dropout must be in [0, 1), got 1"},
        Rejection{R"({"model": {"name": "gru", "recurrent": [)" SEVENTEEN
                  "]}, " DATA "}",
                  "model.recurrent must list 1 to 16 values, got 17"},
        Rejection{R"({"model": {"name": "lstm", "recurrent": [8, 65537]},
                  )" DATA "}",
                  "model.recurrent[1] must be in [1, 65536], got 65537"},
        Rejection{R"({"model": {"name": "lstm", "dense": 1048577}, )" DATA "}",
                  "model.dense"},
        Rejection{R"({"model": {"name": "gru", "dropout": -0.5}, )" DATA "}",
                  "model.dropout must be in [0, 1), got -0.5"},
        Rejection{R"({"model": {"name": "torchscript"}, )" DATA "}",
                  "model.torchscript: path required"},
        Rejection{R"({"model": {"name": "rnn"}, )" DATA "}",
                  "model.name: unknown model 'rnn'; built-in models are "
                  "'mlp', 'cnn', 'cnn1d', 'gru', 'lstm'"},
        Rejection{R"({"loss": "hinge", )" DATA "}",
                  "loss: unknown loss 'hinge'; available: "
                  "'categorical_crossentropy', 'binary_crossentropy', 'mse', "
                  "'mae', 'huber'"},
        Rejection{R"({"loss": "huber", "huber_delta": 0, )" DATA "}",
                  "huber_delta must be a finite number > 0, got 0"},
        Rejection{R"({"loss": "huber", "huber_delta": "Infinity", )" DATA "}",
                  "huber_delta"},
        Rejection{R"({"loss": "mse", "early_stopping": {"metric":
                  "val_accuracy"}, )" DATA "}",
                  "early_stopping.metric: val_accuracy needs a classification "
                  "loss (categorical_crossentropy or binary_crossentropy); "
                  "loss 'mse' reports 'val_loss', 'val_mae', 'val_mse'"},
        Rejection{R"({"loss": "huber", "target": {"value": 0.5}, "checkpoint":
                  {"best_metric": "val_accuracy"}, )" DATA "}",
                  "checkpoint.best_metric: val_accuracy needs a "
                  "classification"},
        Rejection{R"({"target": {"metric": "val_mae", "value": 0.5}, )" DATA
                  "}",
                  "target.metric: val_mae needs a regression loss (mse, mae or "
                  "huber); loss 'categorical_crossentropy' reports 'val_loss', "
                  "'val_accuracy'"},
        Rejection{R"({"loss": "binary_crossentropy", "checkpoint":
                  {"best_metric": "val_mse"}, )" DATA "}",
                  "checkpoint.best_metric: val_mse needs a regression loss"},
        Rejection{R"({"loss": "mae", "early_stopping": {"metric": "mae"}, )"
                  DATA "}",
                  "early_stopping.metric: unknown metric 'mae'; available: "
                  "'val_loss', 'val_mae', 'val_mse' (the metrics loss 'mae' "
                  "reports)"},
        Rejection{R"({"loss": "mse", "target": {"metric": "val_mse", "value":
                  -0.25}, )" DATA "}",
                  "target.value must be >= 0 for val_mse, got -0.25"},
        Rejection{R"({"model": {"dropout": 1.0}, )" DATA "}", "model.dropout"},
        Rejection{R"({"data": {"train_images": "a"}})", "data.train_labels"},
        Rejection{R"({"data": {"train_images": "a", "train_labels": "b",
                      "validation_images": "c"}})",
                  "data.validation_labels"},
        Rejection{R"({"data": {"train_images": "a", "train_labels": "b",
                      "test_labels": "c"}})",
                  "data.test_images"},
        Rejection{R"({"data": {"train_images": "a", "train_labels": "b",
                      "train_limit": -5}})",
                  "data.train_limit"},
        Rejection{R"({"optimizer": {"name": "lbfgs"}, )" DATA "}",
                  "optimizer.name"},
        Rejection{R"({"optimizer": {"learning_rate": -1}, )" DATA "}",
                  "optimizer.learning_rate"},
        Rejection{R"({"optimizer": {"learning_rate": 0}, )" DATA "}",
                  "optimizer.learning_rate"},
        Rejection{R"({"optimizer": {"beta1": 1.5}, )" DATA "}",
                  "optimizer.beta1"},
        Rejection{R"({"optimizer": {"beta2": -0.1}, )" DATA "}",
                  "optimizer.beta2"},
        Rejection{R"({"optimizer": {"epsilon": 0}, )" DATA "}",
                  "optimizer.epsilon"},
        Rejection{R"({"optimizer": {"weight_decay": -1}, )" DATA "}",
                  "optimizer.weight_decay"},
        Rejection{R"({"optimizer": {"name": "sgd", "momentum": 1.0}, )" DATA "}",
                  "optimizer.momentum"},
        Rejection{R"({"optimizer": {"name": "sgd", "nesterov": true}, )" DATA "}",
                  "optimizer.nesterov"},
        Rejection{R"({"optimizer": {"name": "Adam"}, )" DATA "}",
                  "optimizer.name"},
        Rejection{R"({"optimizer": {"name": "adamw", "beta1": 1}, )" DATA "}",
                  "optimizer.beta1"},
        Rejection{R"({"optimizer": {"name": "adamw", "weight_decay": -0.1},
                      )" DATA "}",
                  "optimizer.weight_decay"},
        Rejection{R"({"optimizer": {"name": "rmsprop", "alpha": 2}, )" DATA "}",
                  "optimizer.alpha must be in [0, 1), got 2"},
        Rejection{R"({"optimizer": {"name": "rmsprop", "momentum": -0.5},
                      )" DATA "}",
                  "optimizer.momentum"},
        Rejection{R"({"optimizer": {"name": "rmsprop", "epsilon": 0}, )" DATA "}",
                  "optimizer.epsilon"},
        Rejection{R"({"optimizer": {"name": "adadelta", "rho": 1}, )" DATA "}",
                  "optimizer.rho"},
        Rejection{R"({"optimizer": {"name": "adadelta", "learning_rate": 0},
                      )" DATA "}",
                  "optimizer.learning_rate"},
        Rejection{R"({"optimizer": {"name": "adagrad", "lr_decay": -1},
                      )" DATA "}",
                  "optimizer.lr_decay"},
        Rejection{R"({"optimizer": {"name": "adagrad",
                      "initial_accumulator_value": -0.1}, )" DATA "}",
                  "optimizer.initial_accumulator_value"},
        Rejection{R"({"optimizer": {"name": "adagrad", "epsilon": -1e-10},
                      )" DATA "}",
                  "optimizer.epsilon"},
        Rejection{R"({"optimizer": {"name": "adagrad", "centred": true},
                      )" DATA "}",
                  "centred"},
        Rejection{R"({"algorithm": "allreduce", )" DATA "}",
                  "available: 'downpour', 'sync', 'easgd', 'gem'"},
        Rejection{R"({"max_staleness": -1, )" DATA "}",
                  "max_staleness must be in [0, 1073741824], got -1"},
        Rejection{R"({"max_staleness": 1073741825, )" DATA "}",
                  "max_staleness"},
        Rejection{R"({"staleness_scaling": "sqrt", )" DATA "}",
                  "staleness_scaling: unknown scaling 'sqrt'"},
        Rejection{R"({"data_unit_size": 0, )" DATA "}",
                  "data_unit_size must be in [1, 1099511627776], got 0"},
        Rejection{R"({"algorithm": "easgd", "easgd": {"alpha": 2}, )" DATA "}",
                  "easgd.alpha must be in (0, 1), got 2"},
        Rejection{R"({"algorithm": "easgd", "easgd": {"alpha": 0}, )" DATA "}",
                  "easgd.alpha must be in (0, 1), got 0"},
        Rejection{R"({"algorithm": "easgd", "easgd": {"alpha": 1}, )" DATA "}",
                  "easgd.alpha"},
        Rejection{R"({"algorithm": "easgd",
                      "easgd": {"worker_optimizer": {"name": "rmsprop"}}, )" DATA
                  "}",
                  "easgd.worker_optimizer.name: the ranks step with 'sgd' or 'adam', got "
                  "'rmsprop'"},
        Rejection{R"({"algorithm": "gem",
                      "gem": {"worker_optimizer": {"name": "adam", "beta2": 1}}, )" DATA
                  "}",
                  "gem.worker_optimizer.beta2 must be in [0, 1), got 1"},
        Rejection{R"({"algorithm": "easgd",
                      "easgd": {"worker_optimizer": {"learning_rate": 0}},
                      )" DATA "}",
                  "easgd.worker_optimizer.learning_rate"},
        Rejection{R"({"algorithm": "easgd",
                      "easgd": {"worker_optimizer": {"momentum": 1}}, )" DATA
                  "}",
                  "easgd.worker_optimizer.momentum must be in [0, 1), got 1"},
        Rejection{R"({"algorithm": "easgd",
                      "easgd": {"worker_optimizer": {"momentum": 0,
                                                     "nesterov": true}},
                      )" DATA "}",
                  "easgd.worker_optimizer.nesterov"},
        Rejection{R"({"algorithm": "easgd",
                      "easgd": {"worker_optimizer": {"weight_decay": -1}},
                      )" DATA "}",
                  "easgd.worker_optimizer.weight_decay"},
        Rejection{R"({"algorithm": "gem", "gem": {"learning_rate": 0}, )" DATA
                  "}",
                  "gem.learning_rate"},
        Rejection{R"({"algorithm": "gem", "gem": {"momentum": 1}, )" DATA "}",
                  "gem.momentum must be in [0, 1), got 1"},
        Rejection{R"({"algorithm": "gem", "gem": {"kappa": 0}, )" DATA "}",
                  "gem.kappa"},
        Rejection{R"({"algorithm": "gem", "gem": {"kappa": -1}, )" DATA "}",
                  "gem.kappa must be a finite number > 0, got -1"},
        Rejection{R"({"early_stopping": {"metric": "loss"}, )" DATA "}",
                  "early_stopping.metric: unknown metric 'loss'; available: "
                  "'val_loss', 'val_accuracy'"},
        Rejection{R"({"early_stopping": {"patience": 0}, )" DATA "}",
                  "early_stopping.patience must be in [1, 1000000], got 0"},
        Rejection{R"({"early_stopping": {"patience": 1000001}, )" DATA "}",
                  "early_stopping.patience"},
        Rejection{R"({"early_stopping": {"min_delta": -0.1}, )" DATA "}",
                  "early_stopping.min_delta must be a finite number >= 0, "
                  "got -0.1"},
        Rejection{R"({"early_stopping": {"min_delta": "Infinity"}, )" DATA "}",
                  "early_stopping.min_delta"},
        Rejection{R"({"early_stopping": {"smoothing": 0}, )" DATA "}",
                  "early_stopping.smoothing must be in [1, 1000], got 0"},
        Rejection{R"({"early_stopping": {"smoothing": 1001}, )" DATA "}",
                  "early_stopping.smoothing"},
        Rejection{R"({"target": {"metric": "accuracy", "value": 0.5}, )" DATA
                  "}",
                  "target.metric: unknown metric 'accuracy'"},
        Rejection{R"({"target": {"value": 1.5}, )" DATA "}",
                  "target.value must be in [0, 1] for val_accuracy, got 1.5"},
        Rejection{R"({"target": {"value": -0.1}, )" DATA "}", "target.value"},
        Rejection{R"({"target": {"metric": "val_loss", "value": "NaN"}, )" DATA
                  "}",
                  "target.value must be a finite number, got nan"},
        Rejection{R"({"checkpoint": {"every_updates": -1}, )" DATA "}",
                  "checkpoint.every_updates must be in [0, 1099511627776], "
                  "got -1"},
        Rejection{R"({"checkpoint": {"every_seconds": -1}, )" DATA "}",
                  "checkpoint.every_seconds must be a finite number >= 0"},
        Rejection{R"({"checkpoint": {"every_seconds": "Infinity"}, )" DATA "}",
                  "checkpoint.every_seconds"},
        Rejection{R"({"checkpoint": {"keep": 0}, )" DATA "}",
                  "checkpoint.keep must be in [1, 1000], got 0"},
        Rejection{R"({"checkpoint": {"keep": 1001}, )" DATA "}",
                  "checkpoint.keep"},
        Rejection{R"({"checkpoint": {"best_metric": "train_loss"}, )" DATA "}",
                  "checkpoint.best_metric: unknown metric 'train_loss'; "
                  "available: 'val_loss', 'val_accuracy', 'val_top5_accuracy' (over 5+ "
                  "classes) (the metrics loss 'categorical_crossentropy' reports) or 'none'"},
        Rejection{R"({"snapshots": {"every_updates": -5}, )" DATA "}",
                  "snapshots.every_updates must be in [0, 1099511627776], "
                  "got -5"},
        Rejection{R"({"epochs": 0, )" DATA "}", "epochs"},
        Rejection{R"({"batch_size": 0, )" DATA "}", "batch_size"},
        Rejection{R"({"sync_every": -1, )" DATA "}", "sync_every"},
        Rejection{R"({"exchange": {"updates_in_flight": 0}, )" DATA "}",
                  "exchange.updates_in_flight must be in [1, 4], got 0"},
        Rejection{R"({"exchange": {"updates_in_flight": 5}, )" DATA "}",
                  "exchange.updates_in_flight must be in [1, 4], got 5"},
        Rejection{R"({"algorithm": "easgd", "exchange": {"updates_in_flight": 2}, )" DATA "}",
                  "exchange.updates_in_flight is 2 but algorithm 'easgd' exchanges the "
                  "rank's own weights (only downpour and sync keep several updates in "
                  "flight)"},
        Rejection{R"({"epochs": "many", )" DATA "}", "epochs"}));

TEST(JobSpecTest, ReadMissingFileIsNotFound) {
  auto spec = ReadJobSpecFile("/nonexistent/spec.json");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(spec.status().message().find("/nonexistent/spec.json"),
            std::string::npos);
}

// Every example spec shipped in docs/examples is valid as written.
TEST(JobSpecTest, ShippedExamplesAreValid) {
  const std::filesystem::path dir =
      std::filesystem::path(std::getenv("TEST_SRCDIR")) / "mpilearn/docs/examples";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    auto spec = ReadJobSpecFile(entry.path().string());
    EXPECT_TRUE(spec.ok()) << entry.path() << ": " << spec.status();
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

TEST(JobSpecTest, AlgorithmNamesMapToTheEnum) {
  EXPECT_EQ(AlgorithmFromName("downpour"), v1::ALGORITHM_DOWNPOUR);
  EXPECT_EQ(AlgorithmFromName("sync"), v1::ALGORITHM_SYNC);
  EXPECT_EQ(AlgorithmFromName("easgd"), v1::ALGORITHM_EASGD);
  EXPECT_EQ(AlgorithmFromName("gem"), v1::ALGORITHM_GEM);
  EXPECT_EQ(AlgorithmFromName("Sync"), v1::ALGORITHM_UNSPECIFIED);
  v1::JobSpec spec;
  EXPECT_EQ(AlgorithmOf(spec), v1::ALGORITHM_DOWNPOUR);
  spec.set_algorithm("gem");
  EXPECT_EQ(AlgorithmOf(spec), v1::ALGORITHM_GEM);
  EXPECT_EQ(UpdateKindOf(v1::ALGORITHM_DOWNPOUR), v1::UPDATE_KIND_GRADIENT);
  EXPECT_EQ(UpdateKindOf(v1::ALGORITHM_SYNC), v1::UPDATE_KIND_GRADIENT);
  EXPECT_EQ(UpdateKindOf(v1::ALGORITHM_EASGD), v1::UPDATE_KIND_ELASTIC);
  EXPECT_EQ(UpdateKindOf(v1::ALGORITHM_GEM), v1::UPDATE_KIND_DELTA);
}

}  // namespace
}  // namespace mpilearn

namespace mpilearn {
namespace {

// The bound counts the layers a spec fixes, with one input feature and one
// output: what nn.Linear(1, 256), nn.Linear(256, 128), nn.Linear(128, 1)
// hold (PyTorch's counts, written out).
TEST(JobSpecTest, MinModelParametersOfBuiltInModels) {
  v1::ModelSpec mlp;
  mlp.set_name("mlp");
  mlp.add_hidden(256);
  mlp.add_hidden(128);
  EXPECT_EQ(MinModelParameters(mlp),
            (1 * 256 + 256) + (256 * 128 + 128) + (128 * 1 + 1));
  // nn.GRU(1, 64): weight_ih 192x1, weight_hh 192x64, two biases of 192.
  v1::ModelSpec gru;
  gru.set_name("gru");
  gru.add_recurrent(64);
  EXPECT_EQ(MinModelParameters(gru), (192 + 192 * 64 + 2 * 192) + (64 + 1));
  // nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3), dense 128, one output.
  v1::ModelSpec cnn;
  cnn.set_name("cnn");
  cnn.add_channels(32);
  cnn.add_channels(64);
  cnn.set_kernel_size(3);
  cnn.set_dense(128);
  EXPECT_EQ(MinModelParameters(cnn), (9 * 32 + 32) + (32 * 9 * 64 + 64) +
                                         (64 * 128 + 128) + (128 + 1));
  v1::ModelSpec scripted;
  scripted.set_name("torchscript");
  scripted.set_torchscript("model.pt");
  EXPECT_EQ(MinModelParameters(scripted), 0u);
}

TEST(JobSpecTest, MinModelParametersOfAHugeModelIsAtLeastItsLargestLayer) {
  v1::ModelSpec mlp;
  mlp.set_name("mlp");
  mlp.add_hidden(1 << 20);
  mlp.add_hidden(1 << 20);
  EXPECT_GE(MinModelParameters(mlp), uint64_t{1} << 40);
  // 16 LSTM layers of 2^16 units do not wrap around.
  v1::ModelSpec lstm;
  lstm.set_name("lstm");
  for (int i = 0; i < 16; ++i) lstm.add_recurrent(1 << 16);
  EXPECT_GE(MinModelParameters(lstm), uint64_t{15} * 4 * (1 << 16) * (1 << 17));
}

// A learning-rate schedule in JSON: its defaults, and what the job's
// algorithm and loss allow.
TEST(JobSpecTest, ScheduleGetsDefaultsAndFitsTheJob) {
  auto spec = ParseJobSpecJson(R"({
    "data": {"train_images": "i.gz", "train_labels": "l.gz"},
    "optimizer": {"schedule": {"name": "cosine", "tMax": 500, "warmup": 50}}
  })");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const v1::LrScheduleSpec& schedule = spec->optimizer().schedule();
  EXPECT_EQ(schedule.unit(), "updates");
  EXPECT_EQ(schedule.t_max(), 500);
  EXPECT_DOUBLE_EQ(schedule.warmup_start_factor(), 0.1);
  EXPECT_EQ(schedule.min_lr(), 0);
  const std::string data = R"("data": {"train_images": "i.gz", "train_labels": "l.gz"})";
  ExpectRefused({
      {absl::StrCat("{", data, R"(, "algorithm": "easgd",
          "optimizer": {"schedule": {"name": "step", "step_size": 10}}})"),
       "optimizer.schedule: algorithm 'easgd'"},
      {absl::StrCat("{", data, R"(, "loss": "mse",
          "optimizer": {"schedule": {"name": "plateau", "metric": "val_accuracy"}}})"),
       "optimizer.schedule.metric: val_accuracy needs a classification loss"},
      {absl::StrCat("{", data, R"(, "optimizer": {"schedule": {"name": "exponential"}}})"),
       "gamma is required"},
      {absl::StrCat("{", data, R"(, "early_stopping": {"metric": "val_auc"}})"),
       "early_stopping.metric: unknown metric 'val_auc'"},
  });
  // val_auc is binary_crossentropy's.
  EXPECT_TRUE(ParseJobSpecJson(absl::StrCat(
                  "{", data, R"(, "loss": "binary_crossentropy",
                  "early_stopping": {"metric": "val_auc"}})"))
                  .ok());
}

}  // namespace
}  // namespace mpilearn

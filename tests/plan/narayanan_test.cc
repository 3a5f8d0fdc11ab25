// Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM"), table 1: ten GPT models from 1.7B to 1T parameters on 32 to 3072 A100 GPUs.
// With one efficiency assumption for the whole table (matmul_efficiency of the shipped
// dgx-a100-80gb description), the planner predicts each row's TFLOP/s per GPU within 15%.
//
// The layouts are the paper's: its tensor- and pipeline-parallel sizes and batch, data
// parallelism over the rest, fp16, full activation recomputation, the interleaved schedule with
// the scatter/gather optimisation (section 5.1), micro-batches of one sequence, and (not in the
// table) the smallest number of virtual stages >= 2 that divides each stage's layers.
#include <gtest/gtest.h>

#include <vector>

#include "tessera/plan/planner.h"

namespace tessera::plan {
namespace {

struct Row {
  double billions;
  int heads, hidden, layers, tp, pp, gpus, batch;
  double tflops;  // achieved teraFLOP/s per GPU
};
// s = 2048, V = 51200 for every row.
const std::vector<Row> kTable1 = {{1.7, 24, 2304, 24, 1, 1, 32, 512, 137},
                                  {3.6, 32, 3072, 30, 2, 1, 64, 512, 138},
                                  {7.5, 32, 4096, 36, 4, 1, 128, 512, 142},
                                  {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
                                  {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138},
                                  {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140},
                                  {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148},
                                  {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155},
                                  {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163},
                                  {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163}};

PlanRequest request(const Row& row) {
  PlanRequest r;
  r.model.layers = row.layers;
  r.model.hidden = row.hidden;
  r.model.heads = row.heads;
  r.model.seq = 2048;
  r.model.vocab = 51200;
  r.model.dropout = 0.1;
  r.cluster = with_devices(load_cluster("dgx-a100-80gb"), row.gpus);
  r.global_batch = row.batch;
  r.engine = "megatron";
  r.precision = "fp16";
  return r;
}

Layout layout(const Row& row) {
  Layout l;
  l.tp = row.tp;
  l.pp = row.pp;
  l.dp = row.gpus / (row.tp * row.pp);
  l.micro_batch = 1;
  l.recompute = nn::Recompute::Full;
  if (row.pp > 1) {
    const int per_stage = row.layers / row.pp;
    int v = 2;
    while (per_stage % v != 0) ++v;
    l.schedule = parallel::ScheduleKind::Interleaved;
    l.virtual_stages = v;
  }
  return l;
}

TEST(Narayanan, Table1ParameterCountsFromTheShapes) {
  for (const Row& row : kTable1)
    EXPECT_NEAR(request(row).model.total_params() / 1e9, row.billions, 0.05 + 1e-3 * row.billions)
        << row.hidden;
}

TEST(Narayanan, HardwareFlopsAreTheirFormula) {
  // F = 96 B s l h^2 (1 + s / 6h + V / 16 l h) per iteration with full recomputation.
  for (const Row& row : kTable1) {
    const PlanRequest r = request(row);
    const Prediction p = plan_layout(r, layout(row));
    ASSERT_TRUE(p.ok()) << p.problems.front();
    const double B = row.batch, s = 2048, l = row.layers, h = row.hidden, V = 51200;
    const double F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    EXPECT_NEAR(p.hardware_flops_per_step / F, 1.0, 1e-9) << row.billions << "B";
  }
}

TEST(Narayanan, Table1TflopsPerGpuWithinFifteenPercent) {
  for (const Row& row : kTable1) {
    const PlanRequest r = request(row);
    const Prediction p = plan_layout(r, layout(row));
    ASSERT_TRUE(p.ok()) << p.problems.front();
    EXPECT_TRUE(p.fits) << row.billions << "B: " << p.why_not;
    const double err = p.tflops_per_device / row.tflops - 1;
    std::printf(
        "%7.1fB %-40s predicted %6.1f TFLOP/s per GPU, reported %5.0f (%+5.1f%%), "
        "%.1f GiB per GPU, bubble %.1f%%\n",
        row.billions, p.layout.str().c_str(), p.tflops_per_device, row.tflops, 100 * err,
        p.memory.total() / 1073741824.0, 100 * p.bubble);
    EXPECT_LE(std::abs(err), 0.15) << row.billions << "B";
  }
}

}  // namespace
}  // namespace tessera::plan

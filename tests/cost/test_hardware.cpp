// The one hardware table: the planner's names (--device-memory, auto_fit_memory) and the names CUDA
// reports (the trainer's MFU) reach the same rows, and the kernel choices the memory model takes
// as data follow ops' own rules (train/kernel_choices.cpp).
#include <catch2/catch.hpp>

#include <set>

#include "kiln/cost/hardware.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/train/kernel_choices.h"

TEST_CASE("planner names and CUDA device names find the same hardware rows", "[profile]") {
  // Names as nvidia-smi / cudaGetDeviceProperties report them on the SXM and PCIe parts.
  const std::pair<const char*, const char*> reported[] = {{"V100-16GB", "Tesla V100-SXM2-16GB"},
                                                          {"V100-32GB", "Tesla V100-SXM2-32GB"},
                                                          {"V100-PCIe-16GB", "Tesla V100-PCIE-16GB"},
                                                          {"V100-PCIe-32GB", "Tesla V100-PCIE-32GB"},
                                                          {"A100-40GB", "NVIDIA A100-SXM4-40GB"},
                                                          {"A100-80GB", "NVIDIA A100-SXM4-80GB"},
                                                          {"A100-PCIe-40GB", "NVIDIA A100-PCIE-40GB"},
                                                          {"A100-PCIe-80GB", "NVIDIA A100 80GB PCIe"},
                                                          {"H100-80GB", "NVIDIA H100 80GB HBM3"},
                                                          {"H100-PCIe-80GB", "NVIDIA H100 PCIe"},
                                                          {"H200-141GB", "NVIDIA H200"}};
  std::set<std::string> names;
  for (const auto& spec : kiln::cost::hardware_specs()) names.insert(spec.name);
  CHECK(names.size() == kiln::cost::hardware_specs().size());  // no duplicate row
  for (const auto& [planner, cuda] : reported) {
    CAPTURE(planner, cuda);
    const auto by_name = kiln::cost::hardware_spec(planner);
    const auto by_device = kiln::cost::hardware_for_device_name(cuda);
    REQUIRE(by_name);
    REQUIRE(by_device);
    CHECK(by_device->name == by_name->name);  // the part: its memory and bandwidth
    CHECK(by_device->memory_bandwidth == by_name->memory_bandwidth);
    // Peaks depend on the family and form factor; memory and bandwidth on the part.
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
      CHECK(by_device->peak_tflops(dtype) == by_name->peak_tflops(dtype));
      const auto peak = kiln::cost::gpu_peak(cuda, dtype);
      REQUIRE(peak);
      CHECK(peak->tflops == by_name->peak_tflops(dtype));
      CHECK(peak->source == "datasheet");
    }
    CHECK(by_name->memory_bandwidth > 0);
    CHECK(by_name->memory_bytes > 0);
  }
  // The size in the name picks the part (PCIe names put it elsewhere); without one, the memory
  // the device reports (a little under the nominal size) does; with neither, the family's first row.
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA A100 80GB PCIe")->name == "A100-PCIe-80GB");
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA H100 PCIe", 85.0e9)->memory_bandwidth == 2000e9);
  // A PCIe card is slower than the SXM module of its chip (lower clocks), never faster.
  for (const auto& pcie : kiln::cost::hardware_specs()) {
    if (!pcie.pcie) continue;
    CAPTURE(pcie.name);
    const auto sxm =
        kiln::cost::hardware_for_device_name(pcie.family + " " + pcie.name.substr(pcie.name.rfind('-') + 1));
    REQUIRE(sxm);
    CHECK_FALSE(sxm->pcie);
    CHECK(sxm->memory_bytes == pcie.memory_bytes);
    for (const char* dtype : {"bf16", "fp16", "fp32"}) CHECK(pcie.peak_tflops(dtype) <= sxm->peak_tflops(dtype));
    CHECK(pcie.memory_bandwidth <= sxm->memory_bandwidth);
  }
  // A form factor the table lacks for a family (it has no H200 PCIe row) takes the family's others.
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA H200 NVL PCIe")->name == "H200-141GB");
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA A100-SXM4-80GB", 42.4e9)->name == "A100-80GB");
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA A100", 85.1e9)->name == "A100-80GB");
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA A100", 42.4e9)->name == "A100-40GB");
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA A100")->name == "A100-40GB");
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA H200", 150.1e9)->name == "H200-141GB");
  CHECK(kiln::cost::hardware_for_device_name("Tesla V100-SXM2", 34.1e9)->name == "V100-32GB");
  CHECK(kiln::cost::hardware_for_device_name("NVIDIA A100-SXM4-80GB")->memory_bandwidth == 2039e9);
  // Lower case is the same name; a GPU the table does not know has no peak.
  CHECK(kiln::cost::hardware_spec("a100-80gb"));
  CHECK_FALSE(kiln::cost::hardware_spec("A100"));
  CHECK_FALSE(kiln::cost::gpu_peak("NVIDIA GeForce RTX 4090", at::kBFloat16));
  // V100 has no bf16 tensor cores: its bf16 peak is its fp32 one, fp16 is the tensor cores'.
  const auto v100 = *kiln::cost::hardware_spec("V100-32GB");
  CHECK(v100.peak_tflops("bf16") == v100.peak_tflops("fp32"));
  CHECK(v100.peak_tflops("fp16") > 4 * v100.peak_tflops("fp32"));
}

TEST_CASE("kernel choices for the memory model follow ops' rules", "[profile]") {
  namespace ops = kiln::ops;
  const auto aten = kiln::train::kernel_choices("aten", "bf16", false);
  CHECK_FALSE(aten.fused_rmsnorm);
  CHECK_FALSE(aten.fused_swiglu);
  CHECK_FALSE(aten.fused_loss_head);
  CHECK_FALSE(aten.projections_fp32);
  const auto mixed = kiln::train::kernel_choices("kiln,rmsnorm=aten", "bf16", true);
  CHECK_FALSE(mixed.fused_rmsnorm);
  CHECK(mixed.fused_swiglu);
  CHECK(mixed.fused_loss_head);
  CHECK_FALSE(mixed.projections_fp32);  // a GPU: no CPU rule
  CHECK_FALSE(mixed.cpu_loss_loop);
  // Each CPU rule, forced both ways, reaches the choices.
  for (const int forced : {0, 1}) {
    CAPTURE(forced);
    ops::testing::force_cpu_head_fp32(forced);
    ops::testing::force_cpu_linear_fp32(forced);
    const auto cpu = kiln::train::kernel_choices("kiln", "bf16", false);
    CHECK(cpu.loss_head_low_precision == (ops::linear_cross_entropy_matmul_dtype(at::kBFloat16, true) != at::kFloat));
    CHECK(cpu.loss_head_low_precision == (forced == 0));
    CHECK(cpu.projections_fp32 == ops::cpu_linear_uses_fp32_gemm(at::kBFloat16));
    CHECK(cpu.projections_fp32 == (forced == 1));
  }
  ops::testing::force_cpu_head_fp32(-1);
  ops::testing::force_cpu_linear_fp32(-1);
  const auto cpu = kiln::train::kernel_choices("kiln", "fp32", false);
  REQUIRE(cpu.loss_chunk_tokens);
  for (const int64_t tokens : {1, 100, 8192, 1 << 20}) {
    CHECK(cpu.loss_chunk_tokens(tokens, 128256, 2048) == ops::auto_chunk_tokens(tokens, 128256, 2048, true));
    CHECK(mixed.loss_chunk_tokens(tokens, 128256, 2048) == ops::auto_chunk_tokens(tokens, 128256, 2048, false));
  }
}

TEST_CASE("kernel choices: RoPE and attention from the spec and the device", "[profile]") {
  const auto a100 = kiln::cost::hardware_spec("A100-80GB"), v100 = kiln::cost::hardware_spec("V100-32GB");
  REQUIRE(a100);
  REQUIRE(v100);
  using kiln::train::kernel_choices;
  // RoPE: kiln's kernel where the spec chooses it; the mixed-dtype Function on a GPU, on the CPU in bf16 only.
  CHECK(kernel_choices("kiln", "bf16", true, &*a100, 64).fused_rope);
  CHECK_FALSE(kernel_choices("kiln,rope=aten", "bf16", true, &*a100, 64).fused_rope);
  CHECK(kernel_choices("kiln", "fp16", true).mixed_rope_fused);
  CHECK(kernel_choices("kiln", "bf16", false).mixed_rope_fused);
  CHECK_FALSE(kernel_choices("kiln", "fp16", false).mixed_rope_fused);
  // Attention: kiln's flash kernels only where chosen and where cost::kiln_attention_path runs them.
  CHECK(kernel_choices("kiln", "bf16", true, &*a100, 64).attention == "flash");
  CHECK(kernel_choices("kiln,attention=aten", "bf16", true, &*a100, 64).attention == "sdpa");
  CHECK(kernel_choices("kiln", "fp32", true, &*a100, 64).attention == "sdpa");
  CHECK(kernel_choices("kiln", "bf16", true, &*a100, 96).attention == "sdpa");
  CHECK(kernel_choices("kiln", "bf16", true, &*v100, 64).attention == "sdpa");
  CHECK(kernel_choices("kiln", "fp16", true, &*v100, 64).attention == "flash");
  CHECK(kernel_choices("kiln", "bf16", true, nullptr, 64).attention == "sdpa");  // a GPU the table lacks
  CHECK(kernel_choices("kiln", "bf16", false, &*a100, 64).attention == "sdpa");  // the CPU
  CHECK_THROWS_WITH(kernel_choices("kiln", "int8", false), Catch::Matchers::Contains("'int8'"));
}

TEST_CASE("hardware rows carry the datasheet L2 per family, the CPU's none", "[profile][traffic]") {
  // The architecture whitepapers' L2 sizes, counted in MiB: Volta 6,144 KB, A100 40 MB, H100
  // (SXM5 and PCIe) and H200 (the same GH100) 50 MB.
  const double mib = 1024.0 * 1024.0;
  const std::pair<const char*, double> l2[] = {
      {"V100", 6 * mib}, {"A100", 40 * mib}, {"H100", 50 * mib}, {"H200", 50 * mib}};
  std::set<std::string> families;
  for (const auto& spec : kiln::cost::hardware_specs()) {
    families.insert(spec.family);
    bool known = false;
    for (const auto& [family, bytes] : l2) {
      if (spec.family == family) {
        CHECK(spec.l2_bytes == bytes);
        known = true;
      }
    }
    CHECK(known);  // every row's family has its L2 here
  }
  CHECK(families == std::set<std::string>{"V100", "A100", "H100", "H200"});
  CHECK(kiln::cost::hardware_spec("V100-PCIe-16GB")->l2_bytes == 6291456);
  CHECK(kiln::cost::hardware_spec("A100-80GB")->l2_bytes == 41943040);
  CHECK(kiln::cost::hardware_spec("H100-PCIe-80GB")->l2_bytes == 52428800);
  CHECK(kiln::cost::hardware_spec("H200-141GB")->l2_bytes == 52428800);
  // A row built elsewhere (the CPU's, cost/cpu_peak.h) keeps the default: no GEMM re-read term.
  CHECK(kiln::cost::HardwareSpec{}.l2_bytes == 0);
  // SMs, the same whitepapers: V100 80, A100 108, H100 SXM5 132 and PCIe 114, H200 132.
  CHECK(kiln::cost::hardware_spec("V100-32GB")->sms == 80);
  CHECK(kiln::cost::hardware_spec("A100-PCIe-40GB")->sms == 108);
  CHECK(kiln::cost::hardware_spec("H100-80GB")->sms == 132);
  CHECK(kiln::cost::hardware_spec("H100-PCIe-80GB")->sms == 114);
  CHECK(kiln::cost::hardware_spec("H200-141GB")->sms == 132);
  CHECK(kiln::cost::HardwareSpec{}.sms == 0);
}

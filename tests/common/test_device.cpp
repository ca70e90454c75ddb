// common/device.h on CUDA devices that CUDA cannot serve: every query and synchronisation must
// throw a line naming the device and CUDA's error, where it used to return "unknown", 0 or
// nothing. The first case runs on every machine: index device_count() never exists (0 on a
// machine without a GPU or driver, where the CUDA runtime answers cudaErrorInsufficientDriver or
// cudaErrorNoDevice; past the last GPU on a machine with GPUs: cudaErrorInvalidDevice).
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <torch/cuda.h>

#include "kiln/common/device.h"

#include "support.h"

using Catch::Matchers::Contains;

namespace {}  // namespace

TEST_CASE("CUDA queries and synchronisation on a device CUDA does not have throw naming it", "[device]") {
  const auto missing = static_cast<c10::DeviceIndex>(torch::cuda::device_count());
  const at::Device gpu(at::kCUDA, missing);
  const std::string index = "CUDA device " + std::to_string(missing);
  const std::string name = "cuda:" + std::to_string(missing);
  // Built with CUDA: CUDA's own error, naming the device; built without: says so, naming it too.
  for (const std::string& err : {kiln::test::error_of([&] { kiln::device::synchronize(gpu); }),
                                 kiln::test::error_of([&] { kiln::device::set_device_memory_cap(gpu, 1 << 30); }),
                                 kiln::test::error_of([&] { (void)kiln::device::device_memory_bytes(gpu); })}) {
    INFO(err);
    CHECK(!err.empty());
    CHECK((err.find(index) != std::string::npos || err.find(name) != std::string::npos));
  }
#ifdef KILN_WITH_CUDA
  const std::string err = kiln::test::error_of([&] { (void)kiln::device::name(gpu); });
  CHECK_THAT(err, Contains("cudaGetDeviceProperties on " + index + " failed"));
  if (missing == 0) {
    // No GPU here: the runtime's reason is the driver or the device count, whichever it finds first.
    const std::string sync = kiln::test::error_of([&] { kiln::device::synchronize(gpu); });
    CHECK((sync.find("driver") != std::string::npos || sync.find("no CUDA-capable device") != std::string::npos));
  }
#endif
}

TEST_CASE("synchronize on another GPU leaves the current device as it was, also when it fails", "[device][cuda]") {
  REQUIRE(torch::cuda::is_available());
  const int count = static_cast<int>(torch::cuda::device_count());
  const c10::DeviceIndex last = static_cast<c10::DeviceIndex>(count - 1);
  at::accelerator::setDeviceIndex(0);
  const at::Tensor x = at::ones({1 << 20}, at::TensorOptions().device(at::Device(at::kCUDA, last)));
  const at::Tensor y = (x * 3).sum();
  kiln::device::synchronize(at::Device(at::kCUDA, last));
  CHECK(at::accelerator::getDeviceIndex() == 0);
  CHECK(y.item<float>() == static_cast<float>(3 << 20));
  // A device past the last one: throws, and the current device is still the one set before.
  at::accelerator::setDeviceIndex(last);
  CHECK_THAT(kiln::test::error_of(
                 [&] { kiln::device::synchronize(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(count))); }),
             Contains("CUDA device " + std::to_string(count)));
  CHECK(at::accelerator::getDeviceIndex() == last);
  at::accelerator::setDeviceIndex(0);
  CHECK(kiln::device::device_memory_bytes(at::Device(at::kCUDA, 0)) > 1e9);
  CHECK(!kiln::device::name(at::Device(at::kCUDA, 0)).empty());
}

TEST_CASE("auto, cpu and cuda resolve to this machine's devices, one resolver for every program", "[device]") {
  const bool gpu = torch::cuda::is_available();
  CHECK(kiln::device::resolve("cpu") == at::Device(at::kCPU));
  if (gpu) {
    CHECK(kiln::device::resolve("auto") == at::Device(at::kCUDA, 0));
    CHECK(kiln::device::resolve("cuda") == at::Device(at::kCUDA, 0));
  } else {
    // A machine without a GPU (this one in CI): auto is the CPU, and cuda is a clear error,
    // never a device that fails later. kiln-profile plan once read auto as CUDA here.
    CHECK(kiln::device::resolve("auto") == at::Device(at::kCPU));
    CHECK(kiln::test::error_of([] { (void)kiln::device::resolve("cuda"); }) == "'cuda' but no CUDA device is present");
  }
  // Another word is refused by the resolver and by the check that needs no GPU alike.
  for (const std::string word : {"gpu", "CUDA", "", "cuda:1"}) {
    INFO(word);
    CHECK(kiln::test::error_of([&] { (void)kiln::device::resolve(word); }) ==
          "'" + word + "' is not auto, cpu or cuda");
    CHECK(kiln::test::error_of([&] { kiln::device::check_spec(word); }) == "'" + word + "' is not auto, cpu or cuda");
  }
  for (const std::string word : {"auto", "cpu", "cuda"})
    CHECK(kiln::test::error_of([&] { kiln::device::check_spec(word); }).empty());
}

// LoraResidency: under a limit, the adapters a step names become resident and the least
// recently used others leave; their host parts stay and are placed again when named.
#include "worker/lora_residency.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace tessera {
namespace {

// A rank-2 adapter on one linear of 4 inputs and 3 outputs, its factors filled with `value`.
LoraWeights adapter(const std::string& name, float value) {
  LoraWeights a;
  a.name = name;
  a.rank = 2;
  LoraPart p;
  p.shrink = Tensor::zeros({4, 2}, DType::kF32);
  p.expand = Tensor::zeros({2, 3}, DType::kF32);
  for (int64_t i = 0; i < p.shrink.numel(); ++i) p.shrink.data<float>()[i] = value;
  for (int64_t i = 0; i < p.expand.numel(); ++i) p.expand.data<float>()[i] = value;
  a.bytes = static_cast<int64_t>(p.shrink.nbytes() + p.expand.nbytes());
  a.host.push_back({});  // site 0 not adapted
  a.host.push_back({std::move(p)});
  return a;
}

std::unique_ptr<Backend> cpu() {
  StatusOr<std::unique_ptr<Backend>> b = make_backend("cpu");
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  return std::move(b).value();
}

bool resident(const LoraResidency& r, const std::string& name) { return r.find(name)->resident; }

TEST(LoraResidency, TheLeastRecentlyUsedLeaveAndComeBackWithTheirFactors) {
  std::unique_ptr<Backend> backend = cpu();
  LoraResidency r(*backend);
  r.set_max_resident(2);
  r.add(adapter("a", 1));
  r.add(adapter("b", 2));
  r.add(adapter("c", 3));  // no room: held in host memory only
  EXPECT_TRUE(resident(r, "a"));
  EXPECT_TRUE(resident(r, "b"));
  EXPECT_FALSE(resident(r, "c"));
  EXPECT_TRUE(r.find("c")->sites.empty());
  EXPECT_EQ(r.resident_count(), 2);

  ASSERT_TRUE(r.make_resident({"a"}).is_ok());
  ASSERT_TRUE(r.make_resident({"b"}).is_ok());
  ASSERT_TRUE(r.make_resident({"c", "b"}).is_ok());  // a is the least recently used
  EXPECT_FALSE(resident(r, "a"));
  EXPECT_TRUE(resident(r, "b"));
  EXPECT_TRUE(resident(r, "c"));
  EXPECT_EQ(r.reloads(), 0);  // c had never been resident
  const LoraWeights& c = *r.find("c");
  ASSERT_EQ(c.sites.size(), 2u);
  EXPECT_TRUE(c.sites[0].empty());
  ASSERT_EQ(c.sites[1].size(), 1u);
  EXPECT_EQ(c.sites[1][0].expand.data<float>()[5], 3.0f);

  ASSERT_TRUE(r.make_resident({"a", "c"}).is_ok());  // b leaves, a comes back
  EXPECT_TRUE(resident(r, "a"));
  EXPECT_FALSE(resident(r, "b"));
  EXPECT_EQ(r.reloads(), 1);
  EXPECT_EQ(r.find("a")->sites[1][0].shrink.data<float>()[7], 1.0f);
  EXPECT_EQ(r.resident_count(), 2);
}

TEST(LoraResidency, AStepNamingTooManyOrAnUnknownAdapterIsRefused) {
  std::unique_ptr<Backend> backend = cpu();
  LoraResidency r(*backend);
  r.set_max_resident(1);
  r.add(adapter("a", 1));
  r.add(adapter("b", 2));
  const Status two = r.make_resident({"a", "b"});
  EXPECT_FALSE(two.is_ok());
  EXPECT_NE(two.message().find("names 2 LoRA adapters, more than lora.max_loras 1"), std::string::npos) << two.message();
  const Status unknown = r.make_resident({"psalms"});
  EXPECT_NE(unknown.message().find("\"psalms\" is not loaded here"), std::string::npos) << unknown.message();
  EXPECT_TRUE(r.remove("a"));
  EXPECT_FALSE(r.remove("a"));
  ASSERT_TRUE(r.make_resident({"b"}).is_ok());
  EXPECT_TRUE(resident(r, "b"));
}

TEST(LoraResidency, WithoutALimitEveryAdapterIsResidentAndLoweringItEvicts) {
  std::unique_ptr<Backend> backend = cpu();
  LoraResidency r(*backend);
  for (const char* name : {"a", "b", "c"}) r.add(adapter(name, 1));
  EXPECT_EQ(r.resident_count(), 3);
  ASSERT_TRUE(r.make_resident({"a", "b", "c"}).is_ok());
  ASSERT_TRUE(r.make_resident({"c"}).is_ok());
  r.set_max_resident(1);
  EXPECT_EQ(r.resident_count(), 1);
  EXPECT_TRUE(resident(r, "c"));  // the most recently used stays
}

}  // namespace
}  // namespace tessera

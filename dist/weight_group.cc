#include "dist/weight_group.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace kappa::dist {
namespace {

const std::string kClosedKey = "kappa/weights/closed";

std::string ManifestKey(int64_t sequence) {
  return "kappa/weights/manifest/" + std::to_string(sequence);
}
// How many receivers have read the manifest of `sequence` (Store::add).
std::string ReadCountKey(int64_t sequence) {
  return "kappa/weights/read/" + std::to_string(sequence);
}
std::string LeftKey(int rank) { return "kappa/weights/left/" + std::to_string(rank); }

std::vector<uint8_t> Bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// The tensors as the collective moves them: the bytes of each, as a flat
// uint8 view of the same storage (Gloo in libtorch 1.13 has no bfloat16 or
// int16; a broadcast only copies bytes, so this is exact for every dtype).
// REQUIRES: contiguous tensors.
std::vector<torch::Tensor> AsBytes(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  out.reserve(tensors.size());
  for (const torch::Tensor& tensor : tensors) {
    if (!tensor.is_contiguous())
      throw std::invalid_argument("weight group: a tensor is not contiguous");
    out.push_back(tensor.view({-1}).view(torch::kUInt8));
  }
  return out;
}

void RequireRank(bool ok, const char* call) {
  if (!ok) throw std::logic_error(std::string("weight group: ") + call + " on the wrong rank");
}

}  // namespace

std::unique_ptr<WeightGroup> WeightGroup::Connect(const WeightGroupOptions& options) {
  if (options.store.rfind("tcp://", 0) != 0) {
    throw std::invalid_argument("weight group: store '" + options.store +
                                "' must be tcp://HOST:PORT");
  }
  return Form(ConnectStore(options), options);
}

std::unique_ptr<WeightGroup> WeightGroup::Form(c10::intrusive_ptr<::c10d::Store> store,
                                               const WeightGroupOptions& options) {
  std::unique_ptr<Collectives> collectives = CollectivesOverStore(store, options);
  return std::unique_ptr<WeightGroup>(new WeightGroup(
      std::move(store), std::move(collectives), options.rank, options.world_size, options.device));
}

WeightGroup::WeightGroup(c10::intrusive_ptr<::c10d::Store> store,
                         std::unique_ptr<Collectives> collectives, int rank, int world_size,
                         torch::Device device)
    : store_(std::move(store)),
      collectives_(std::move(collectives)),
      rank_(rank),
      world_size_(world_size),
      device_(device) {}

void WeightGroup::Send(int64_t sequence, const std::string& manifest,
                       const std::vector<torch::Tensor>& tensors) {
  RequireRank(rank_ == 0, "Send");
  // A manifest is dropped only once every receiver has counted its read:
  // a receiver still polling for it must find it.
  const auto read_by_all = [this](int64_t announced) {
    if (store_->add(ReadCountKey(announced), 0) < world_size_ - 1) return false;
    store_->deleteKey(ManifestKey(announced));
    store_->deleteKey(ReadCountKey(announced));
    return true;
  };
  unread_.erase(std::remove_if(unread_.begin(), unread_.end(), read_by_all), unread_.end());
  store_->set(ManifestKey(sequence), Bytes(manifest));
  unread_.push_back(sequence);
  collectives_->Broadcast(AsBytes(tensors), /*root=*/0);
}

bool WeightGroup::AnyoneLeft() {
  RequireRank(rank_ == 0, "AnyoneLeft");
  for (int rank = 1; rank < world_size_; ++rank) {
    if (store_->check({LeftKey(rank)})) return true;
  }
  return false;
}

void WeightGroup::Close() {
  RequireRank(rank_ == 0, "Close");
  store_->set(kClosedKey, Bytes("1"));
}

WeightGroup::Poll WeightGroup::PollManifest(int64_t sequence, std::string* manifest) {
  RequireRank(rank_ > 0, "PollManifest");
  if (store_->check({ManifestKey(sequence)})) {
    const std::vector<uint8_t> bytes = store_->get(ManifestKey(sequence));
    manifest->assign(bytes.begin(), bytes.end());
    store_->add(ReadCountKey(sequence), 1);
    return Poll::kReady;
  }
  // Closed after announcing `sequence` would have been kReady above.
  return store_->check({kClosedKey}) ? Poll::kClosed : Poll::kNotYet;
}

void WeightGroup::Receive(const std::vector<torch::Tensor>& tensors) {
  RequireRank(rank_ > 0, "Receive");
  collectives_->Broadcast(AsBytes(tensors), /*root=*/0);
}

void WeightGroup::Leave() {
  RequireRank(rank_ > 0, "Leave");
  store_->set(LeftKey(rank_), Bytes("1"));
}

}  // namespace kappa::dist

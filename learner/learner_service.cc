#include "learner/learner_service.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/stable_hash.h"
#include "services/grpc_util.h"
#include "services/torch_tensor_codec.h"

namespace kappa::learner {
namespace {

// Large parameters are split so no message approaches gRPC's size limit.
constexpr int64_t kPolicyChunkBytes = 1 << 20;
// Blocking waits wake this often to notice cancellation and shutdown.
constexpr absl::Duration kWakeInterval = absl::Milliseconds(500);

// Why the coordinator refused a well-formed group, as a status for the log.
absl::Status SubmitError(SubmitVerdict verdict, const std::string& lease_id) {
  if (verdict == SubmitVerdict::kWrongWorker) {
    return absl::FailedPreconditionError(
        absl::StrCat("lease_id: lease '", lease_id, "' is held by another worker stream"));
  }
  if (verdict == SubmitVerdict::kDuplicate) {
    return absl::AlreadyExistsError(absl::StrCat(
        "lease_id: lease '", lease_id, "' already returned its group; this copy is dropped"));
  }
  return absl::NotFoundError(absl::StrCat("lease_id: lease '", lease_id,
                                          "' is not open (expired, re-issued or never issued)"));
}

// A request's weights_dtype: DTYPE_UNSPECIFIED means float32.
absl::StatusOr<torch::ScalarType> PolicyWeightsDtype(kappa::v1::DType dtype) {
  switch (dtype) {
    case kappa::v1::DTYPE_UNSPECIFIED:
    case kappa::v1::DTYPE_FLOAT32:
      return torch::kFloat32;
    case kappa::v1::DTYPE_BFLOAT16:
      return torch::kBFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "weights_dtype: ", kappa::v1::DType_Name(dtype), " (", static_cast<int>(dtype),
          ") is not a policy weight dtype (DTYPE_FLOAT32 or DTYPE_BFLOAT16)"));
  }
}

}  // namespace

LearnerService::LearnerService(const tasks::Dataset& train, Tokenize tokenize,
                               const WorkTemplate& work, GroupExpectations expectations,
                               Coordinator* coordinator, PolicyPublisher* publisher)
    : train_(train),
      tokenize_(std::move(tokenize)),
      work_(work),
      expectations_(expectations),
      coordinator_(coordinator),
      publisher_(publisher) {}

kappa::v1::WorkItem LearnerService::MakeWorkItem(const Lease& lease) const {
  const tasks::Example& example = train_.at(lease.example_index);
  kappa::v1::WorkItem item;
  item.set_lease_id(lease.lease_id);
  item.set_prompt_id(example.id);
  item.set_prompt_text(example.prompt);
  for (int32_t token : tokenize_(lease.example_index)) item.add_prompt_tokens(token);
  item.set_reference_answer(example.answer);
  item.set_task(example.task);
  item.set_policy_version(std::max<int64_t>(publisher_->version(), 0));
  item.set_group_size(work_.group_size);
  item.set_max_new_tokens(work_.max_new_tokens);
  item.set_temperature(work_.temperature);
  item.set_top_p(work_.top_p);
  item.set_top_k(work_.top_k);
  item.set_min_p(work_.min_p);
  // Reproducible per lease, whichever worker samples it.
  item.set_sampling_seed(base::StableHash(absl::StrCat(work_.sampling_seed, ":", lease.lease_id)) |
                         1);
  item.set_teacher_form(work_.teacher_form);
  item.set_teacher_top_k(work_.teacher_top_k);
  item.set_teacher_value_dtype(static_cast<kappa::v1::DType>(work_.teacher_value_dtype));
  item.set_teacher_demonstrations(work_.teacher_demonstrations);
  item.set_teacher_temperature(work_.teacher_temperature);
  item.set_lease_deadline_unix_ms(absl::ToUnixMillis(lease.deadline));
  for (int32_t id : work_.stop_token_ids) item.add_stop_token_ids(id);
  item.set_vocab_limit(work_.vocab_limit);
  for (const std::string& stop : work_.stop_strings) item.add_stop_strings(stop);
  return item;
}

absl::Status LearnerService::CheckLeasedPrompt(const kappa::v1::ScoredGroup& wire,
                                               const std::string& stream_id) const {
  const std::optional<size_t> example = coordinator_->LeasedExample(wire.lease_id(), stream_id);
  if (!example.has_value()) return absl::OkStatus();  // Submit drops it by its lease
  const std::vector<int32_t> leased = tokenize_(*example);
  if (std::equal(leased.begin(), leased.end(), wire.prompt_tokens().begin(),
                 wire.prompt_tokens().end())) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "prompt_tokens: not the prompt of the example lease ", wire.lease_id(), " handed out (",
      wire.prompt_tokens_size(), " tokens sent, ", leased.size(), " leased)"));
}

absl::StatusOr<ScoredGroup> LearnerService::CheckedGroup(const kappa::v1::ScoredGroup& wire,
                                                         const std::string& stream_id) {
  const auto refuse = [this](std::atomic<int64_t>& reason, absl::Status why) {
    ++counters_.groups_invalid;
    ++reason;
    return why;
  };
  absl::StatusOr<ScoredGroup> group = DecodeScoredGroup(wire, expectations_);
  if (!group.ok()) return refuse(counters_.refused_malformed, group.status());
  if (absl::Status fits = CheckPositions(wire, expectations_); !fits.ok()) {
    return refuse(counters_.refused_positions, fits);
  }
  if (absl::Status prompt = CheckLeasedPrompt(wire, stream_id); !prompt.ok()) {
    return refuse(counters_.refused_prompt, prompt);
  }
  if (absl::Status version = CheckPolicyVersion(wire.policy_version(), publisher_->version());
      !version.ok()) {
    return refuse(counters_.refused_policy_version, version);
  }
  return group;
}

bool LearnerService::AnswerRenewal(
    const kappa::v1::RenewLeases& renew, const std::string& stream_id,
    const std::function<bool(const kappa::v1::LearnerMessage&)>& write) {
  const std::vector<std::string> ids(renew.lease_ids().begin(), renew.lease_ids().end());
  const Coordinator::Renewal renewal = coordinator_->Renew(ids, stream_id);
  kappa::v1::LearnerMessage answer;
  kappa::v1::LeasesRenewed* renewed = answer.mutable_renewed();
  for (const std::string& id : renewal.lease_ids) renewed->add_lease_ids(id);
  renewed->set_lease_deadline_unix_ms(absl::ToUnixMillis(renewal.deadline));
  return write(answer);
}

grpc::Status LearnerService::Rollout(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<kappa::v1::LearnerMessage, kappa::v1::WorkerMessage>* stream) {
  kappa::v1::WorkerMessage first;
  if (!stream->Read(&first)) return grpc::Status::OK;  // client left before saying hello
  if (!first.has_hello()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "hello: the first message must be a Hello"};
  }
  const kappa::v1::Hello& hello = first.hello();
  if (hello.worker_id().empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "hello.worker_id: empty"};
  }
  if (hello.max_outstanding() <= 0 || hello.max_outstanding() > work_.max_outstanding_limit) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("hello.max_outstanding: ", hello.max_outstanding(), " outside [1, ",
                         work_.max_outstanding_limit, "]")};
  }
  // A reconnecting worker gets a fresh identity: its old stream's leases must
  // not be closable through the new one after they were re-issued.
  const std::string stream_id = absl::StrCat(hello.worker_id(), "#", next_stream_++);
  const int max_outstanding = hello.max_outstanding();
  ++counters_.streams_opened;
  spdlog::info("worker {} connected (max_outstanding={})", stream_id, max_outstanding);

  std::atomic<bool> reader_done{false};
  std::atomic<int64_t> credits_granted{0};
  // Work and credits go out from the writer thread, renewal answers from
  // this one: one Write at a time.
  absl::Mutex write_mu;
  auto write = [&](const kappa::v1::LearnerMessage& message) {
    absl::MutexLock lock(&write_mu);
    return stream->Write(message);
  };
  std::thread writer([&] {
    while (!reader_done && !shutting_down_ && !context->IsCancelled()) {
      std::optional<Lease> lease =
          coordinator_->LeaseNext(stream_id, max_outstanding, absl::Now() + kWakeInterval);
      if (!lease) continue;
      kappa::v1::LearnerMessage work;
      *work.mutable_work() = MakeWorkItem(*lease);
      kappa::v1::LearnerMessage credit;
      credit.mutable_credit()->set_groups(1);
      // Grant the credit before the worker can possibly answer.
      credits_granted += 1;
      if (!write(work) || !write(credit)) break;
    }
  });

  grpc::Status result = grpc::Status::OK;
  int64_t groups_received = 0;
  kappa::v1::WorkerMessage message;
  while (stream->Read(&message)) {
    if (message.has_renew()) {
      if (!AnswerRenewal(message.renew(), stream_id, write)) break;
      continue;
    }
    if (!message.has_group()) {
      result = {grpc::StatusCode::INVALID_ARGUMENT,
                "kind: only groups and lease renewals may follow the hello"};
      break;
    }
    if (++groups_received > credits_granted) {
      result = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                absl::StrCat("group: sent ", groups_received, " groups with only ",
                             credits_granted.load(), " credits")};
      break;
    }
    ++counters_.groups_received;
    const kappa::v1::ScoredGroup& wire = message.group();
    absl::StatusOr<ScoredGroup> group = CheckedGroup(wire, stream_id);
    if (!group.ok()) {
      // The prompt is leased again at once; the stream stays up so the
      // worker's other groups are not lost.
      coordinator_->ReissueRefused(wire.lease_id(), stream_id);
      spdlog::warn("worker {}: rejected group for lease {}: {}", stream_id, wire.lease_id(),
                   group.status().ToString());
      continue;
    }
    const SubmitVerdict verdict = coordinator_->Submit(wire.lease_id(), stream_id,
                                                       *std::move(group));
    if (verdict != SubmitVerdict::kAccepted) {
      spdlog::warn("worker {}: dropped group for lease {}: {}", stream_id, wire.lease_id(),
                   SubmitError(verdict, wire.lease_id()).ToString());
    }
  }
  reader_done = true;
  writer.join();
  coordinator_->ReleaseWorker(stream_id);
  spdlog::info("worker {} disconnected after {} groups", stream_id, groups_received);
  return result;
}

namespace {

// A chunk of `policy`'s parameter `name` with its header filled in: the
// version, the parameter's name, dtype and shape, and (on the version's
// first chunk, when *first) the model config.
kappa::v1::PolicyChunk ChunkOf(const EncodedPolicy& policy, const std::string& name,
                               const torch::Tensor& tensor, int num_parameters, bool* first) {
  kappa::v1::PolicyChunk chunk;
  chunk.set_version(policy.version);
  chunk.set_policy_id(policy.policy_id);
  if (*first) {
    chunk.set_model_config_json(policy.model_config_json);
    chunk.set_adapter_config_json(policy.adapter_config_json);
  }
  *first = false;
  chunk.set_name(name);
  chunk.set_dtype(services::ToWireDType(policy.dtype));
  for (int64_t dim : tensor.sizes()) chunk.add_shape(dim);
  chunk.set_num_parameters(num_parameters);
  return chunk;
}

}  // namespace

bool LearnerService::SendPolicy(const EncodedPolicy& encoded,
                                grpc::ServerWriter<kappa::v1::PolicyChunk>* writer) {
  const int num_parameters = static_cast<int>(encoded.weights.size());
  bool first = true;
  int64_t sent = 0;
  for (int p = 0; p < num_parameters; ++p) {
    const auto& [name, tensor] = encoded.weights[p];
    const auto* bytes = static_cast<const char*>(tensor.data_ptr());
    const int64_t total = tensor.numel() * static_cast<int64_t>(tensor.element_size());
    int64_t offset = 0;
    do {
      const int64_t size = std::min(kPolicyChunkBytes, total - offset);
      kappa::v1::PolicyChunk chunk = ChunkOf(encoded, name, tensor, num_parameters, &first);
      chunk.set_byte_offset(offset);
      chunk.set_data(bytes + offset, static_cast<size_t>(size));
      offset += size;
      chunk.set_last_of_version(p == num_parameters - 1 && offset == total);
      if (!writer->Write(chunk)) return false;
      sent += size;
      counters_.policy_bytes_full += size;
    } while (offset < total);
  }
  ++counters_.policy_versions_full;
  if (encoded.dtype == torch::kBFloat16) counters_.policy_bytes_saved_bfloat16 += sent;
  return true;
}

bool LearnerService::SendPolicyDelta(const EncodedDelta& delta,
                                     grpc::ServerWriter<kappa::v1::PolicyChunk>* writer) {
  const EncodedPolicy& target = *delta.target;
  const int num_parameters = static_cast<int>(target.weights.size());
  bool first = true;
  int64_t sent = 0;
  for (int p = 0; p < num_parameters; ++p) {
    const auto& [name, tensor] = target.weights[p];
    const EncodedDelta::Parameter& parameter = delta.parameters[p];
    const auto* bytes = static_cast<const char*>(tensor.data_ptr());
    const int64_t total = tensor.numel() * static_cast<int64_t>(tensor.element_size());
    // Whole parameters (the base lacks them) as raw 1 MiB chunks; an empty
    // one as a single empty chunk, so its name and shape arrive.
    std::vector<EncodedDelta::Segment> raw;
    if (parameter.raw || total == 0) {
      for (int64_t offset = 0; offset < total; offset += kPolicyChunkBytes) {
        raw.push_back({offset, std::min(kPolicyChunkBytes, total - offset), false, 0});
      }
      if (raw.empty()) raw.push_back({0, 0, false, 0});
    }
    const std::vector<EncodedDelta::Segment>& segments = raw.empty() ? parameter.segments : raw;
    for (size_t s = 0; s < segments.size(); ++s) {
      const EncodedDelta::Segment& segment = segments[s];
      kappa::v1::PolicyChunk chunk = ChunkOf(target, name, tensor, num_parameters, &first);
      chunk.set_byte_offset(segment.offset);
      chunk.set_base_version(delta.base_version);
      chunk.set_base_policy_id(delta.base_policy_id);
      if (!raw.empty()) {
        chunk.set_data(bytes + segment.offset, static_cast<size_t>(segment.size));
      } else if (segment.unchanged) {
        chunk.set_encoding(kappa::v1::PolicyChunk::UNCHANGED);
        chunk.set_span_bytes(segment.size);
      } else {
        chunk.set_encoding(kappa::v1::PolicyChunk::XOR);
        chunk.set_data(parameter.xor_bytes.data() + segment.xor_offset,
                       static_cast<size_t>(segment.size));
      }
      chunk.set_last_of_version(p == num_parameters - 1 && s + 1 == segments.size());
      if (!writer->Write(chunk)) return false;
      sent += static_cast<int64_t>(chunk.data().size());
    }
  }
  ++counters_.policy_versions_delta;
  counters_.policy_bytes_delta += sent;
  counters_.policy_bytes_saved_delta += target.bytes - sent;
  if (target.dtype == torch::kBFloat16) counters_.policy_bytes_saved_bfloat16 += target.bytes;
  return true;
}

bool LearnerService::SendPolicyShm(const PolicySnapshot& snapshot, torch::ScalarType dtype,
                                   const dist::ShmSegment& segment,
                                   grpc::ServerWriter<kappa::v1::PolicyChunk>* writer) {
  kappa::v1::PolicyChunk chunk;
  chunk.set_version(snapshot.version);
  chunk.set_policy_id(publisher_->PolicyId(snapshot.version));
  chunk.set_dtype(services::ToWireDType(dtype));
  chunk.set_num_parameters(static_cast<int>(snapshot.weights.size()));
  chunk.set_encoding(kappa::v1::PolicyChunk::SHARED_MEMORY);
  chunk.set_shm_path(segment.path());
  chunk.set_shm_bytes(segment.bytes());
  chunk.set_shm_token(segment.token());
  chunk.set_adapter_config_json(snapshot.adapter_config_json);
  chunk.set_last_of_version(true);
  if (!writer->Write(chunk)) return false;
  ++counters_.policy_versions_shm;
  return true;
}

absl::StatusOr<bool> LearnerService::StreamUsesShm(
    const kappa::v1::WatchPolicyRequest& request) const {
  if (!request.accept_shm() && !request.require_shm()) return false;
  const std::string& mine = publisher_->shm_host_key();
  if (!mine.empty() && request.host_key() == mine) return true;
  if (!request.require_shm()) return false;
  return absl::FailedPreconditionError(absl::StrCat(
      "rollout.weight_transport: shm, but this worker does not share the learner's host and "
      "/dev/shm (learner host key '",
      mine, "', worker's '", request.host_key(),
      "'); use auto (shared memory when possible, else gRPC) or grpc, or give both the same "
      "/dev/shm (deploy/)"));
}

grpc::Status LearnerService::WatchPolicy(grpc::ServerContext* context,
                                         const kappa::v1::WatchPolicyRequest* request,
                                         grpc::ServerWriter<kappa::v1::PolicyChunk>* writer) {
  absl::StatusOr<torch::ScalarType> wire = PolicyWeightsDtype(request->weights_dtype());
  if (!wire.ok()) return services::ToGrpcStatus(wire.status());
  const torch::ScalarType dtype = *wire;
  // The version (and its identity) the worker holds, as this stream knows it.
  int64_t known = request->known_version();
  uint64_t known_id = request->known_policy_id();
  const bool delta = request->accept_delta() && publisher_->keeps_delta_bases();
  const absl::StatusOr<bool> shm = StreamUsesShm(*request);
  if (!shm.ok()) return services::ToGrpcStatus(shm.status());
  while (!shutting_down_ && !context->IsCancelled()) {
    std::shared_ptr<const PolicySnapshot> snapshot =
        publisher_->WaitNewer(known, absl::Now() + kWakeInterval);
    if (snapshot == nullptr) continue;
    if (dtype == torch::kFloat32 && snapshot->dtype == torch::kBFloat16) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "weights_dtype: FLOAT32 asked of a learner that keeps bfloat16 snapshots (its "
              "rollout.weights_dtype or student.dtype is bfloat16); set the worker's "
              "rollout.weights_dtype to bfloat16, or the learner's to float32"};
    }
    if (*shm) {
      // One segment per (version, dtype) for every same-host stream; the
      // worker copies it into its model. Chunks when it cannot be written.
      absl::StatusOr<std::shared_ptr<const dist::ShmSegment>> segment =
          publisher_->Shm(snapshot, dtype);
      if (segment.ok()) {
        if (!SendPolicyShm(*snapshot, dtype, **segment, writer)) break;
        known = snapshot->version;
        known_id = publisher_->PolicyId(known);
        continue;
      }
      ++counters_.policy_shm_fallbacks;
      if (!shm_failure_logged_.exchange(true)) {
        spdlog::warn(
            "policy version {}: no shared-memory segment ({}); same-host workers get gRPC "
            "chunks instead (logged once; Docker's default /dev/shm is 64 MiB: see deploy/ "
            "for shm_size and a Memory emptyDir)",
            snapshot->version, segment.status().ToString());
      }
    }
    std::shared_ptr<const EncodedDelta> encoded_delta =
        delta && known >= 0 ? publisher_->Delta(snapshot, dtype, known, known_id) : nullptr;
    const bool sent = encoded_delta != nullptr
                          ? SendPolicyDelta(*encoded_delta, writer)
                          : SendPolicy(*publisher_->Encode(snapshot, dtype), writer);
    if (!sent) break;
    known = snapshot->version;
    known_id = publisher_->PolicyId(known);
  }
  return grpc::Status::OK;
}

grpc::Status LearnerService::JoinWeightGroup(grpc::ServerContext* /*context*/,
                                             const kappa::v1::JoinWeightGroupRequest* request,
                                             kappa::v1::JoinWeightGroupResponse* response) {
  if (broadcaster_ == nullptr) {
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "this learner offers no weight group (learner.weight_group_workers is 0); use "
            "rollout.weight_transport: grpc"};
  }
  absl::StatusOr<torch::ScalarType> dtype = PolicyWeightsDtype(request->weights_dtype());
  if (!dtype.ok()) return services::ToGrpcStatus(dtype.status());
  const torch::Device device =
      request->cuda()
          ? torch::Device(torch::kCUDA,
                          static_cast<c10::DeviceIndex>(std::max(request->cuda_index(), 0)))
          : torch::Device(torch::kCPU);
  absl::StatusOr<kappa::v1::JoinWeightGroupResponse> joined =
      broadcaster_->Join(request->worker_id(), device, *dtype);
  if (!joined.ok()) return services::ToGrpcStatus(joined.status());
  *response = *std::move(joined);
  return grpc::Status::OK;
}

}  // namespace kappa::learner

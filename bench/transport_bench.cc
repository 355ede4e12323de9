// What the gRPC path costs for one large tensor, against the floor of the
// same bytes copied in memory and sent over a raw loopback TCP socket.
//
// Modes, timed in one process and interleaved round-robin so drift hits each
// alike; each reports its median and its ratio to memcpy and to raw TCP:
//   memcpy    one memcpy of the payload into a preallocated buffer
//   tcp       write() of the payload over a loopback TCP connection, read()
//             into a preallocated buffer on another thread, 1-byte ack back
//   grpc      the tensor as the services send it: EncodeTensor (torch ->
//             kappa.v1.Tensor), a unary call over loopback TCP to a server
//             (services::GrpcServer, services::MakeChannel) that runs
//             DecodeTensor (validation, finiteness check, copy into a
//             torch::Tensor) and answers with the byte count
//   grpc_wire the same call with the message encoded once beforehand: the
//             transport alone (serialize, send, parse, decode)
//   codec     no network: EncodeTensor, SerializeToString, ParseFromString,
//             DecodeTensor; what of `grpc` is our codec and protobuf's copies
// Usage: kappa_bench_transport [--mib N] [--reps N]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kappa/bench/tensor_sink.grpc.pb.h"
#include "services/grpc_util.h"
#include "services/server.h"
#include "services/torch_tensor_codec.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

class TensorSink final : public kappa::bench::TensorSink::Service {
  grpc::Status Put(grpc::ServerContext*, const kappa::v1::Tensor* request,
                   kappa::bench::PutReply* reply) override {
    absl::StatusOr<torch::Tensor> tensor = kappa::services::DecodeTensor(*request, "tensor");
    if (!tensor.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad tensor");
    reply->set_bytes(tensor->numel() * tensor->element_size());
    return grpc::Status::OK;
  }
};

// A loopback TCP pair: the receiver thread reads exactly `bytes` per round
// into its buffer and acknowledges with one byte.
class LoopbackTcp {
 public:
  explicit LoopbackTcp(size_t bytes) : buffer_(bytes) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::perror("loopback listener");
      std::exit(1);
    }
    sender_ = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(sender_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      std::perror("connect");
      std::exit(1);
    }
    receiver_ = accept(listener, nullptr, nullptr);
    close(listener);
    const int one = 1;
    setsockopt(sender_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    thread_ = std::thread([this] { Receive(); });
  }
  ~LoopbackTcp() {
    shutdown(sender_, SHUT_RDWR);
    thread_.join();
    close(sender_);
    close(receiver_);
  }

  void Send(const char* data, size_t bytes) {
    for (size_t sent = 0; sent < bytes;) {
      const ssize_t n = write(sender_, data + sent, bytes - sent);
      if (n <= 0) std::exit(1);
      sent += static_cast<size_t>(n);
    }
    char ack = 0;
    if (read(sender_, &ack, 1) != 1) std::exit(1);
  }

 private:
  void Receive() {
    for (;;) {
      for (size_t got = 0; got < buffer_.size();) {
        const ssize_t n = read(receiver_, buffer_.data() + got, buffer_.size() - got);
        if (n <= 0) return;  // the sender shut down
        got += static_cast<size_t>(n);
      }
      const char ack = 1;
      if (write(receiver_, &ack, 1) != 1) return;
    }
  }

  std::vector<char> buffer_;
  int sender_ = -1, receiver_ = -1;
  std::thread thread_;
};

struct Mode {
  std::string name;
  std::function<void()> run;
  std::vector<double> seconds;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int mib = 16, reps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mib") mib = std::atoi(argv[i + 1]);
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const size_t bytes = static_cast<size_t>(mib) << 20;
  torch::manual_seed(1);
  const torch::Tensor payload = torch::randn({static_cast<int64_t>(bytes / sizeof(float))});
  const char* data = static_cast<const char*>(payload.data_ptr());

  std::vector<char> copy(bytes);
  LoopbackTcp tcp(bytes);

  TensorSink sink;
  kappa::services::ServerOptions options;
  options.max_message_bytes = static_cast<int>(bytes + (1 << 20));
  auto server = kappa::services::GrpcServer::Start("127.0.0.1:0", {&sink}, options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  auto stub = kappa::bench::TensorSink::NewStub(kappa::services::MakeChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()), {}, options.max_message_bytes));
  auto put = [&](const kappa::v1::Tensor& message) {
    grpc::ClientContext context;
    kappa::bench::PutReply reply;
    const grpc::Status status = stub->Put(&context, message, &reply);
    if (!status.ok() || reply.bytes() != static_cast<int64_t>(bytes)) {
      std::fprintf(stderr, "Put failed: %s\n", status.error_message().c_str());
      std::exit(1);
    }
  };
  kappa::v1::Tensor encoded_once;
  kappa::services::EncodeTensor(payload, &encoded_once);

  std::vector<Mode> modes = {
      {"memcpy", [&] { std::memcpy(copy.data(), data, bytes); }, {}},
      {"tcp", [&] { tcp.Send(data, bytes); }, {}},
      {"codec", [&] {
         kappa::v1::Tensor message, parsed;
         kappa::services::EncodeTensor(payload, &message);
         std::string wire;
         message.SerializeToString(&wire);
         if (!parsed.ParseFromString(wire) ||
             !kappa::services::DecodeTensor(parsed, "tensor").ok()) {
           std::exit(1);
         }
       }, {}},
      {"grpc_wire", [&] { put(encoded_once); }, {}},
      {"grpc", [&] {
         kappa::v1::Tensor message;
         kappa::services::EncodeTensor(payload, &message);
         put(message);
       }, {}},
  };
  for (Mode& mode : modes) mode.run();  // warm up: connections, page faults
  for (int rep = 0; rep < reps; ++rep) {
    for (Mode& mode : modes) {
      const auto start = Clock::now();
      mode.run();
      mode.seconds.push_back(Seconds(Clock::now() - start));
    }
  }

  const double memcpy_s = Median(modes[0].seconds), tcp_s = Median(modes[1].seconds);
  std::printf("payload %d MiB float32, %d rounds, medians\n", mib, reps);
  std::printf("| mode | median ms | GB/s | × memcpy | × tcp |\n|---|---|---|---|---|\n");
  for (const Mode& mode : modes) {
    const double s = Median(mode.seconds);
    std::printf("| %s | %.2f | %.2f | %.1f | %.2f |\n", mode.name.c_str(), s * 1e3,
                static_cast<double>(bytes) / s / 1e9, s / memcpy_s, s / tcp_s);
  }
  (*server)->Shutdown();
  return 0;
}

#include "cli/termination_signal.h"

#include <signal.h>

#include <csignal>
#include <initializer_list>

namespace kappa::cli {
namespace {

volatile std::sig_atomic_t g_signal = 0;

void OnSignal(int signo) {
  if (g_signal == 0) g_signal = signo;
}

}  // namespace

void InstallTerminationHandlers() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;
  for (int signo : {SIGINT, SIGTERM, SIGHUP}) sigaction(signo, &action, nullptr);
  // A closed terminal or pipe must not kill the supervisor before it has
  // stopped its children.
  signal(SIGPIPE, SIG_IGN);
}

int TerminationSignal() { return g_signal; }

}  // namespace kappa::cli

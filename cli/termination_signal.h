// Ctrl-C / SIGTERM / SIGHUP for `kappa run`: recorded, not acted on in the
// handler, so the supervising loop can forward SIGTERM to the children and
// reap them before exiting.
#pragma once

namespace kappa::cli {

// Installs the handlers (idempotent). Before this, the signals keep their
// default action (so an interrupted bootstrap SFT simply ends the process).
void InstallTerminationHandlers();
// The signal that arrived (SIGINT, SIGTERM or SIGHUP), or 0.
int TerminationSignal();

}  // namespace kappa::cli

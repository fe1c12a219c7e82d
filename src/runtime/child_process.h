// Signalling and reaping child processes. Every kill()/waitpid() on a pid that a
// spawn returned goes through here, because a failed spawn leaves -1 or 0 behind:
// kill(-1, sig) reaches every process the user may signal and kill(0, sig) the
// caller's whole process group, and neither is ever what a caller holding "its
// child" means. A pid <= 0 is refused (false, nothing signalled).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cerrno>

namespace dpukv {

// Sends sig to the child pid; false if pid <= 0 or the signal could not be sent.
inline bool signal_child(pid_t pid, int sig) {
  return pid > 0 && ::kill(pid, sig) == 0;
}

// Waits for the child pid to exit (retrying on EINTR); false if pid <= 0 or it is
// not our child. status may be null.
inline bool reap_child(pid_t pid, int* status) {
  if (pid <= 0) return false;
  int st = 0;
  pid_t r;
  do r = ::waitpid(pid, &st, 0);
  while (r < 0 && errno == EINTR);
  if (status != nullptr) *status = st;
  return r == pid;
}

}  // namespace dpukv

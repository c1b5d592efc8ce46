// Test helper: a tensor-parallel `snapserve generate` job under mpirun, run in the background,
// one of its ranks SIGSTOPped once rank 0 streams text, and how the job ended. For the tests
// that check that a hung rank ends the job within --collective-timeout, naming it
// (tests/tp/test_tp_cli.cpp on the CPU, tests/cuda/test_device_tp_cli.cpp on the device path).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace snap::testing {

inline std::string read_whole_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The pid of the process whose environment says OMPI_COMM_WORLD_RANK=<rank> and whose command
// line holds both `marker` and "snapserve generate", or -1.
inline pid_t find_mpi_rank(int rank, const std::string& marker) {
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_whole_file(e.path() / "cmdline");
    for (char& ch : cmdline) ch = ch == '\0' ? ' ' : ch;
    if (cmdline.find(marker) == std::string::npos || cmdline.find("snapserve generate") == std::string::npos) continue;
    const std::string env = read_whole_file(e.path() / "environ");
    if (env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos) {
      return static_cast<pid_t>(std::stol(name));
    }
  }
  return -1;
}

struct StoppedJob {
  std::string setup_error;  // non-empty: nothing was stopped (no text streamed, rank not found)
  int exit_code = -1;       // the job's (mpirun's); -1: still running 150 s after its start
  double seconds = 0;       // from the stop to the job's end
  std::string log;          // its stderr
};

// Runs `job` (a shell command; its stdout and stderr go to dir/stop.out and dir/stop.err) in
// the background, waits until its stdout holds 20 bytes (ranks decoding together), SIGSTOPs
// rank `rank` of it (found by `marker`, e.g. the prompt file's path), and waits for the job's
// exit code. A stopped rank still there at the end is killed.
inline StoppedJob stop_rank_of_job(const std::string& job, const std::filesystem::path& dir, const std::string& marker,
                                   int rank) {
  namespace fs = std::filesystem;
  using Clock = std::chrono::steady_clock;
  const fs::path out = dir / "stop.out", err = dir / "stop.err", rc = dir / "stop.rc";
  fs::remove(out);
  fs::remove(rc);
  StoppedJob r;
  const std::string cmd = "(" + job + " > " + out.string() + " 2> " + err.string() + "; echo $? > " + rc.string() + ") &";
  if (std::system(cmd.c_str()) != 0) {
    r.setup_error = "could not start: " + cmd;
    return r;
  }
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  auto done = [&] { return !read_whole_file(rc).empty(); };
  while (read_whole_file(out).size() < 20 && elapsed() < 90 && !done()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t victim = read_whole_file(out).size() < 20 ? -1 : find_mpi_rank(rank, marker);
  if (victim <= 0 || ::kill(victim, SIGSTOP) != 0) {
    r.setup_error = victim <= 0 ? "generation never started or rank " + std::to_string(rank) + " not found\n" + read_whole_file(err)
                                : "kill(SIGSTOP) failed";
    while (!done() && elapsed() < 150) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return r;
  }
  const auto stopped = Clock::now();
  while (!done() && elapsed() < 150) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  r.seconds = std::chrono::duration<double>(Clock::now() - stopped).count();
  if (::kill(victim, 0) == 0 && !done()) {  // left behind: clean up (the caller fails on exit_code -1)
    ::kill(victim, SIGKILL);
    ::kill(victim, SIGCONT);
  }
  const std::string code = read_whole_file(rc);
  r.exit_code = code.empty() ? -1 : std::atoi(code.c_str());
  r.log = read_whole_file(err);
  return r;
}

}  // namespace snap::testing

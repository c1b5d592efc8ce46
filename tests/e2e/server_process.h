// A `snapserve serve` child process for end-to-end tests: started from a whole command
// line (the binary, or a launcher such as mpirun in front of it), stderr captured to a
// file, its port read from the "snapserve: serving NAME on http://127.0.0.1:PORT" line.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace snap::testing {

inline std::string slurp_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class ServerProcess {
 public:
  // argv: the whole command; argv[0] is looked up on PATH unless it contains a '/'.
  explicit ServerProcess(std::vector<std::string> argv) {
    namespace fs = std::filesystem;
    using Clock = std::chrono::steady_clock;
    err_path_ = (fs::temp_directory_path() /
                 ("snap_serve_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".err"))
                    .string();
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      FILE* err = std::fopen(err_path_.c_str(), "w");
      if (err) ::dup2(::fileno(err), 2);
      FILE* out = std::fopen("/dev/null", "w");
      if (out) ::dup2(::fileno(out), 1);
      ::execvp(args[0], args.data());
      std::_Exit(127);
    }
    const std::regex serving(R"(snapserve: serving (\S+) on http://127\.0\.0\.1:(\d+))");
    const auto until = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < until) {
      std::smatch m;
      const std::string err = slurp_file(err_path_);
      if (std::regex_search(err, m, serving)) {
        model_name_ = m[1];
        port_ = std::stoi(m[2]);
        return;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "snapserve serve exited before serving: " << err;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "snapserve serve did not report its port: " << slurp_file(err_path_);
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove(err_path_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Sends SIGTERM and waits up to `wait_seconds`; the exit code (the kept one once reaped), or -1
  // when still running.
  int terminate(double wait_seconds) {
    if (pid_ <= 0) return exit_code_;
    ::kill(pid_, SIGTERM);
    return wait(wait_seconds);
  }
  // Waits up to `wait_seconds` (0: looks once) for the process to end by itself: its exit
  // code (128 + signal when killed), or -1 when still running. Once reaped, the code is kept.
  int wait(double wait_seconds) {
    using Clock = std::chrono::steady_clock;
    if (pid_ <= 0) return exit_code_;
    const auto until = Clock::now() + std::chrono::duration<double>(wait_seconds);
    while (true) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_code_;
      }
      if (Clock::now() >= until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  const std::string& model_name() const { return model_name_; }
  std::string log() const { return slurp_file(err_path_); }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int exit_code_ = -1;  // once wait() reaped the process
  int port_ = 0;
  std::string model_name_;
  std::string err_path_;
};

}  // namespace snap::testing

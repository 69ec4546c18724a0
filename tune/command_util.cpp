#include "tune/command_util.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <iostream>

#include "store/io/file_io.hpp"
#include "toolkit/bounded_input.hpp"
#include "toolkit/cli_flags.hpp"
#include "tune/commands.hpp"

namespace strata::tune {

Result<int> parse_ranks(const std::string& text, int max) {
  const Result<std::int64_t> v = bench::parse_integer(text, 1, max);
  if (!v)
    return Status::invalid_argument("--ranks '" + bench::quote_prefix(text) + "' (expected an integer in [1, " +
                                    std::to_string(max) + "])");
  return static_cast<int>(*v);
}

int fail(const std::string& message, int code) {
  std::cerr << "strata-tune: " << message << "\n";
  return code;
}

Result<HardwareProfile> load_profile_file(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(const std::string text, bench::read_input_file(path, "profile file"));
  STRATA_RETURN_IF_ERROR(bench::parse_json_limited(text, "profile '" + path + "'").status());
  return parse_hardware_profile(text, path);
}

Status check_output(const std::string& path, const std::string& flag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return Status::invalid_argument(flag + " " + path + ": not a regular file (expected a file path)");
  auto probe = detail::AtomicFileWriter::create(path);  // its temporary file goes with `probe`
  if (!probe)
    return Status::invalid_argument(flag + " " + path + ": cannot write there (" + probe.status().message() + ")");
  return Status::ok();
}

Status write_output(const std::string& path, const std::string& text) {
  STRATA_ASSIGN_OR_RETURN(detail::AtomicFileWriter w, detail::AtomicFileWriter::create(path));
  STRATA_RETURN_IF_ERROR(w.append(text.data(), text.size()));
  return w.commit();
}

ProgressFn progress_printer(bool enabled) {
  if (!enabled || ::isatty(STDERR_FILENO) == 0) return {};
  return [](const std::string& line) { std::cerr << "strata-tune: " << line << "\n"; };
}

}  // namespace strata::tune

#include "toolkit/profiles.hpp"

#include <sys/stat.h>
#include <unistd.h>

// Both set by toolkit/CMakeLists.txt: the source tree's profiles, and the installed profiles'
// folder relative to the installed programs' (../share/strata/profiles in the GNU layout).
#ifndef STRATA_PROFILE_DIR
#define STRATA_PROFILE_DIR "bench/profiles"
#endif
#ifndef STRATA_INSTALLED_PROFILE_DIR
#define STRATA_INSTALLED_PROFILE_DIR "../share/strata/profiles"
#endif

namespace strata::bench {

std::string program_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  const std::string self(buf, static_cast<std::size_t>(n));
  return self.substr(0, self.find_last_of('/') + 1);
}

std::string profile_dir() {
  const std::string dir = program_dir();
  if (!dir.empty()) {
    std::string installed = dir + STRATA_INSTALLED_PROFILE_DIR;
    struct stat st {};
    if (::stat(installed.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return installed;
  }
  return STRATA_PROFILE_DIR;
}

std::string profile_path(const std::string& name_or_path) {
  struct stat st {};
  if (::stat(name_or_path.c_str(), &st) == 0) return name_or_path;
  return profile_dir() + "/" + name_or_path + ".json";
}

}  // namespace strata::bench

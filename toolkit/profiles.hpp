#pragma once
// Where strata-bench and strata-tune find a hardware profile named on their command line
// (`--profile h200-pcie5`, `--from dgx-h100`): NAME.json in the profiles folder. An installed
// program finds the profiles `cmake --install` put beside it (<prefix>/share/strata/profiles, found
// from its own folder <prefix>/bin, so a moved prefix still works); a program run from the build
// tree finds them in the source tree's bench/profiles.

#include <string>

namespace strata::bench {

/// The folder of the running program (from /proc/self/exe), ending in '/'; "" when it cannot be read.
std::string program_dir();

/// The folder of the named profiles: program_dir() + the installed layout's relative path when that
/// folder exists, else the source tree's bench/profiles this program was compiled with.
std::string profile_dir();

/// A --profile value: an existing file as it is, else profile_dir() + "/" + name_or_path + ".json".
std::string profile_path(const std::string& name_or_path);

}  // namespace strata::bench

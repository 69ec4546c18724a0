#include "cache/prefetcher.hpp"

namespace strata::cache {

template class BasicPrefetcher<PartitionedPlanner>;

}  // namespace strata::cache

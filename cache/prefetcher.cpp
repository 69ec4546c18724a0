#include "cache/prefetcher.hpp"

namespace strata::cache {

template class BasicPrefetcher<ShardedPool>;

}  // namespace strata::cache

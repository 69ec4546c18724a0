#pragma once
// The CPU grid: runs launches of the shared kernels (gpu/kernels/bodies.hpp) on the host, the way
// a GPU runs their grids (warps as oneTBB tasks, the lanes of a warp in turn, the kernels of one
// launch one after the other, as on one stream). The `emu` backend runs its device operations
// through these, so every test on a machine without a GPU executes the logic of the `cuda`
// backend's kernels. Each call blocks until the launch is done and runs in the caller's
// tbb::task_arena.

#include "gpu/kernels/launch_args.hpp"

namespace strata::gpu::kernels {

/// Runs a gather launch (rows read through a.source; outputs fully overwritten).
void run_gather(const GatherArgs& a);
/// Runs a backward launch: the hot rows' segments (with a.partials), then every unique row.
void run_update(const UpdateArgs& a);
/// Runs a gradient reduction launch: the hot rows' segments (with a.partials), then every unique row.
void run_reduce(const UpdateArgs& a);
/// Runs a pack (pool -> a.packed) or, with `unpack`, an unpack (a.packed -> pool) of a.n records.
void run_records(const RecordArgs& a, bool unpack);
/// Runs a zero-copy record move between slots and host records (to_host: slot -> host).
void run_host_records(const HostRecordArgs& a, bool to_host);
/// Runs a record initialization.
void run_init(const InitArgs& a);
/// Runs a finiteness count: the chunks, then the per-feature sums.
void run_nonfinite(const FiniteArgs& a);

}  // namespace strata::gpu::kernels

#pragma once
// Low-level file utilities for checkpoints: crash-safe whole-file writes (temp file, fsync, rename,
// fsync of the directory), whole-file and positional reads, mkdir -p, and a fault-injection hook
// that lets tests simulate a crash in the middle of a save. POSIX only. Public (installed): the
// tools write their outputs with AtomicFileWriter and write_file_atomic too.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.hpp"

namespace strata::detail {

/// Writes a file so that `final_path` holds either its old contents or the complete new ones, never
/// a mix: bytes go to a temp file next to it ("<final_path>.tmp-<pid>-<counter>") that commit()
/// renames into place. An uncommitted writer removes its temp file when destroyed. Keeps the
/// CRC-32C and the count of the bytes appended. Move-only; one thread at a time.
class AtomicFileWriter {
 public:
  /// Creates (truncates) the temp file for `final_path`; its directory must exist. kIoError naming
  /// the temp path and the OS error; kInvalidArgument for an empty path.
  static Result<AtomicFileWriter> create(const std::string& final_path);

  AtomicFileWriter() = default;  ///< an empty writer: append() and commit() fail
  AtomicFileWriter(AtomicFileWriter&& o) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& o) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  /// Closes and unlinks the temp file unless commit() succeeded in renaming it. Never throws.
  ~AtomicFileWriter();

  /// Appends `n` bytes at `data` (host memory). Small appends are buffered; large ones are written
  /// directly. Partial writes and EINTR are retried. kIoError on an OS failure or an injected fault
  /// (see set_fault_after_bytes), after which the writer is failed: every later append() and
  /// commit() returns that same error. kFailedPrecondition after commit() or on an empty writer.
  Status append(const void* data, std::size_t n);

  /// Flushes, fsyncs and closes the temp file, renames it to the final path and fsyncs the
  /// directory, so the new contents survive a power loss. kIoError naming the path on failure: before
  /// the rename the temp file is removed and the old file at the final path left alone; when only the
  /// directory fsync fails, the new file is in place but may not be durable. kFailedPrecondition when
  /// called twice. Returns the earlier error of a failed writer.
  Status commit();

  /// CRC-32C of all bytes appended so far (crc32c() convention: 0 for none).
  std::uint32_t crc() const noexcept { return crc_; }
  /// Number of bytes appended so far.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// The path the file ends up at.
  const std::string& final_path() const noexcept { return final_path_; }
  /// The temp path being written (empty once committed or failed, and for an empty writer).
  const std::string& temp_path() const noexcept { return temp_path_; }

 private:
  AtomicFileWriter(std::string final_path, std::string temp_path, int fd) noexcept;
  Status flush_buffer();
  Status write_fd(const void* data, std::size_t n);
  Status fail(Status s);
  void abandon() noexcept;

  std::string final_path_;
  std::string temp_path_;  // non-empty while the temp file exists and is ours
  int fd_ = -1;            // open temp file; -1 when closed
  bool committed_ = false;
  Status error_;                             // first error; sticky
  std::unique_ptr<unsigned char[]> buffer_;  // allocated at the first small append
  std::size_t buffered_ = 0;
  std::uint32_t crc_ = 0;
  std::uint64_t bytes_ = 0;
};

/// Writes `contents` to `path` with an AtomicFileWriter (create, append, commit). Errors as there.
Status write_file_atomic(const std::string& path, const std::string& contents);

/// Reads the whole file at `path`. kNotFound when it does not exist, kResourceExhausted when it
/// does not fit in memory, kIoError otherwise; messages start with the path. Thread-safe.
Result<std::string> read_file(const std::string& path);

/// A file opened for reading at explicit offsets, straight into caller memory (no intermediate
/// copy, for multi-GB tables). Move-only; read_at() may be called from several threads at once.
class FileReader {
 public:
  /// Opens `path` read-only and records its size. kNotFound when missing, kIoError otherwise. The
  /// reader keeps reading the file it opened even when the path is later removed or renamed over.
  static Result<FileReader> open(const std::string& path);

  FileReader() = default;  ///< a closed reader: read_at() fails
  FileReader(FileReader&& o) noexcept;
  FileReader& operator=(FileReader&& o) noexcept;
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  ~FileReader();  ///< closes the file; never throws

  /// Size of the file in bytes when it was opened.
  std::uint64_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

  /// Reads exactly `n` bytes at `offset` into `dst` (host memory, n bytes). kDataLoss naming the
  /// byte counts when the file ends first, kIoError on an OS failure.
  Status read_at(std::uint64_t offset, void* dst, std::size_t n) const;

 private:
  FileReader(std::string path, int fd, std::uint64_t size) noexcept;
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// An exclusive advisory lock (flock) on a directory, held from acquire() until destruction (or
/// until the process exits, whatever way), so that the processes and threads that each take it
/// take turns: checkpoint savers sharing a directory. Processes that do not take it (readers) are
/// not held up. Move-only.
class DirLock {
 public:
  /// Blocks until this caller holds the lock of `dir` (which must exist). Locks the directory
  /// itself; where the file system refuses to lock a directory (NFS emulates flock with byte-range
  /// locks, which need a file open for writing) it locks the file `<dir>/<fallback_name>` instead,
  /// creating it (every process on that file system then does the same). kIoError naming the
  /// path and the OS error.
  static Result<DirLock> acquire(const std::string& dir, const std::string& fallback_name);
  /// As acquire(), without waiting: a DirLock that is held() when this caller took the lock, or that holds nothing
  /// when another holder has it (so a caller can poll, e.g. a world's rank 0 that must keep its peers' collectives
  /// from timing out while it waits). kIoError as acquire().
  static Result<DirLock> try_acquire(const std::string& dir, const std::string& fallback_name);

  DirLock() = default;  ///< holds nothing
  DirLock(DirLock&& o) noexcept;
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();  ///< releases the lock; never throws

  /// Whether the lock is held.
  bool held() const noexcept { return fd_ >= 0; }

 private:
  explicit DirLock(int fd) noexcept : fd_(fd) {}
  void release() noexcept;
  int fd_ = -1;
};

/// fsyncs the directory `dir` so that entries created or renamed in it survive a power loss.
/// kIoError naming the directory on failure. Thread-safe.
Status fsync_dir(const std::string& dir);

/// Creates `dir` and any missing parents (mkdir -p, mode 0777 & ~umask). Succeeds when it already
/// exists as a directory; kIoError naming the component that could not be created or is not a
/// directory; kInvalidArgument for an empty path. Thread-safe (tolerates concurrent creators).
Status make_dirs(const std::string& dir);

/// Test-only fault injection: when `n` >= 0, AtomicFileWriter::append() accepts (and writes) only
/// `n` more bytes in total, across all writers and threads, counted from this call; the append
/// that would go past that writes the bytes up to the limit and returns
/// kIoError("injected fault ..."), and so does every later non-empty append. `n` = -1 disables
/// (the default). Thread-safe (atomic).
void set_fault_after_bytes(std::int64_t n) noexcept;

/// Test-only: when set, FileReader::open() calls `hook(path)` just before it opens `path`, so a
/// test can change the directory at that moment (e.g. save a new checkpoint over the one being
/// loaded). An empty function removes it (the default). Set it only while no FileReader is being
/// opened; the hook itself may not open a FileReader.
void set_before_open_hook(std::function<void(const std::string& path)> hook);

}  // namespace strata::detail

#include "store/io/file_io.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "store/io/detail/crc32c.hpp"

namespace strata::detail {
namespace {

// Appends below this size are gathered so that writing a checkpoint row by row costs few syscalls.
constexpr std::size_t kBufferSize = std::size_t{1} << 20;
// Linux transfers at most ~2 GiB per write(); stay well below so every call makes full progress.
constexpr std::size_t kMaxIo = std::size_t{1} << 30;

std::atomic<std::int64_t> g_fault_budget{-1};
std::atomic<std::uint64_t> g_temp_counter{0};
std::function<void(const std::string&)> g_before_open;  // see set_before_open_hook

std::string os_error(const std::string& path, const char* what, int err) {
  return path + ": " + what + ": " + std::strerror(err);
}

std::string parent_dir(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Closes without losing the fd to EINTR (Linux always releases it) and without masking errors.
int close_fd(int fd) noexcept {
  const int rc = ::close(fd);
  return (rc != 0 && errno == EINTR) ? 0 : rc;
}

// Takes up to `n` bytes from the fault budget; returns how many the caller may write.
std::size_t take_fault_budget(std::size_t n) noexcept {
  std::int64_t budget = g_fault_budget.load(std::memory_order_relaxed);
  while (budget >= 0) {
    const std::int64_t take = static_cast<std::int64_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(budget), n));
    if (g_fault_budget.compare_exchange_weak(budget, budget - take, std::memory_order_relaxed)) {
      return static_cast<std::size_t>(take);
    }
  }
  return n;  // disabled (possibly concurrently with this call)
}

}  // namespace

void set_before_open_hook(std::function<void(const std::string& path)> hook) { g_before_open = std::move(hook); }

void set_fault_after_bytes(std::int64_t n) noexcept { g_fault_budget.store(n < 0 ? -1 : n, std::memory_order_relaxed); }

// ---------------------------------------------------------------------------------------------
// AtomicFileWriter

AtomicFileWriter::AtomicFileWriter(std::string final_path, std::string temp_path, int fd) noexcept
    : final_path_(std::move(final_path)), temp_path_(std::move(temp_path)), fd_(fd) {}

Result<AtomicFileWriter> AtomicFileWriter::create(const std::string& final_path) {
  if (final_path.empty()) return Status::invalid_argument("AtomicFileWriter: empty path");
  std::string temp_path = final_path + ".tmp-" + std::to_string(::getpid()) + "-" +
                          std::to_string(g_temp_counter.fetch_add(1, std::memory_order_relaxed));
  int fd;
  do {
    fd = ::open(temp_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0666);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Status::io_error(os_error(temp_path, "cannot create", errno));
  return AtomicFileWriter(final_path, std::move(temp_path), fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : final_path_(std::move(o.final_path_)),
      temp_path_(std::exchange(o.temp_path_, std::string())),
      fd_(std::exchange(o.fd_, -1)),
      committed_(std::exchange(o.committed_, false)),
      error_(std::move(o.error_)),
      buffer_(std::move(o.buffer_)),
      buffered_(std::exchange(o.buffered_, 0)),
      crc_(std::exchange(o.crc_, 0)),
      bytes_(std::exchange(o.bytes_, 0)) {
  o.error_ = Status::ok();
}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& o) noexcept {
  if (this != &o) {
    abandon();
    final_path_ = std::move(o.final_path_);
    temp_path_ = std::exchange(o.temp_path_, std::string());
    fd_ = std::exchange(o.fd_, -1);
    committed_ = std::exchange(o.committed_, false);
    error_ = std::exchange(o.error_, Status::ok());
    buffer_ = std::move(o.buffer_);
    buffered_ = std::exchange(o.buffered_, 0);
    crc_ = std::exchange(o.crc_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { abandon(); }

void AtomicFileWriter::abandon() noexcept {
  if (fd_ >= 0) {
    (void)close_fd(fd_);
    fd_ = -1;
  }
  if (!temp_path_.empty()) {
    (void)::unlink(temp_path_.c_str());
    temp_path_.clear();
  }
  buffer_.reset();
  buffered_ = 0;
}

Status AtomicFileWriter::fail(Status s) {
  error_ = s;
  abandon();  // a failed writer can never commit: drop the temp file now rather than at destruction
  return s;
}

Status AtomicFileWriter::write_fd(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min(n, kMaxIo));
    if (w < 0) {
      if (errno == EINTR) continue;
      return fail(Status::io_error(os_error(temp_path_, "write failed", errno)));
    }
    if (w == 0) return fail(Status::io_error(temp_path_ + ": write made no progress"));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return Status::ok();
}

Status AtomicFileWriter::flush_buffer() {
  if (buffered_ == 0) return Status::ok();
  const std::size_t n = buffered_;
  buffered_ = 0;
  return write_fd(buffer_.get(), n);
}

Status AtomicFileWriter::append(const void* data, std::size_t n) {
  if (!error_.is_ok()) return error_;
  if (committed_) return Status::failed_precondition(final_path_ + ": append after commit");
  if (fd_ < 0) return Status::failed_precondition("append on an empty AtomicFileWriter");
  if (n == 0) return Status::ok();

  const std::size_t allowed = take_fault_budget(n);
  const auto* p = static_cast<const unsigned char*>(data);
  crc_ = crc32c(p, allowed, crc_);
  bytes_ += allowed;
  if (allowed >= kBufferSize) {
    STRATA_RETURN_IF_ERROR(flush_buffer());
    STRATA_RETURN_IF_ERROR(write_fd(p, allowed));
  } else if (allowed > 0) {
    if (!buffer_) {
      try {
        buffer_ = std::make_unique<unsigned char[]>(kBufferSize);
      } catch (const std::bad_alloc&) {
        return fail(Status::resource_exhausted(temp_path_ + ": cannot allocate the write buffer"));
      }
    }
    if (buffered_ + allowed > kBufferSize) STRATA_RETURN_IF_ERROR(flush_buffer());
    std::memcpy(buffer_.get() + buffered_, p, allowed);
    buffered_ += allowed;
  }
  if (allowed < n) {
    // Make the bytes before the fault reach the file, like a process that dies mid-save.
    STRATA_RETURN_IF_ERROR(flush_buffer());
    return fail(Status::io_error("injected fault after " + std::to_string(bytes_) + " bytes of '" + final_path_ +
                                 "' (set_fault_after_bytes)"));
  }
  return Status::ok();
}

Status AtomicFileWriter::commit() {
  if (!error_.is_ok()) return error_;
  if (committed_) return Status::failed_precondition(final_path_ + ": commit called twice");
  if (fd_ < 0) return Status::failed_precondition("commit on an empty AtomicFileWriter");

  STRATA_RETURN_IF_ERROR(flush_buffer());
  buffer_.reset();
  if (::fsync(fd_) != 0) return fail(Status::io_error(os_error(temp_path_, "fsync failed", errno)));
  const int fd = std::exchange(fd_, -1);
  if (close_fd(fd) != 0) return fail(Status::io_error(os_error(temp_path_, "close failed", errno)));
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    const int err = errno;
    const std::string what = "rename to '" + final_path_ + "' failed";
    return fail(Status::io_error(os_error(temp_path_, what.c_str(), err)));
  }
  temp_path_.clear();  // it is the final file now: never unlink it
  committed_ = true;
  // The rename is only durable once the directory entry is; a failure here is reported, but the
  // new file is already in place.
  return fsync_dir(parent_dir(final_path_)).with_context(final_path_);
}

Status write_file_atomic(const std::string& path, const std::string& contents) {
  STRATA_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::create(path));
  STRATA_RETURN_IF_ERROR(writer.append(contents.data(), contents.size()));
  return writer.commit();
}

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

Result<int> open_for_read(const std::string& path, std::uint64_t* size) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::not_found(os_error(path, "cannot open", err));
    return Status::io_error(os_error(path, "cannot open", err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    (void)close_fd(fd);
    return Status::io_error(os_error(path, "fstat failed", err));
  }
  if (S_ISDIR(st.st_mode)) {
    (void)close_fd(fd);
    return Status::io_error(path + ": is a directory, not a file");
  }
  *size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

// Reads until `n` bytes or end of file; returns the count read, or -1 with errno set.
ssize_t pread_full(int fd, void* dst, std::size_t n, std::uint64_t offset) {
  auto* p = static_cast<unsigned char*>(dst);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, std::min(n - done, kMaxIo), static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace

Result<std::string> read_file(const std::string& path) {
  std::uint64_t size = 0;
  STRATA_ASSIGN_OR_RETURN(const int fd, open_for_read(path, &size));
  std::string out;
  Status status;
  try {
    // Read what fstat promised, then keep going in case the file grew in between.
    out.resize(static_cast<std::size_t>(size));
    std::size_t have = 0;
    for (;;) {
      if (have == out.size()) out.resize(out.size() + std::max<std::size_t>(out.size() / 2, 4096));
      const ssize_t r = pread_full(fd, &out[have], out.size() - have, have);
      if (r < 0) {
        status = Status::io_error(os_error(path, "read failed", errno));
        break;
      }
      have += static_cast<std::size_t>(r);
      if (have < out.size()) break;  // end of file
    }
    out.resize(have);
  } catch (const std::bad_alloc&) {
    status = Status::resource_exhausted(path + ": cannot allocate " + std::to_string(size) + " bytes to read the file");
  }
  (void)close_fd(fd);
  if (!status.is_ok()) return status;
  return out;
}

FileReader::FileReader(std::string path, int fd, std::uint64_t size) noexcept
    : path_(std::move(path)), fd_(fd), size_(size) {}

Result<FileReader> FileReader::open(const std::string& path) {
  if (g_before_open) g_before_open(path);
  std::uint64_t size = 0;
  STRATA_ASSIGN_OR_RETURN(const int fd, open_for_read(path, &size));
  return FileReader(path, fd, size);
}

FileReader::FileReader(FileReader&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), size_(std::exchange(o.size_, 0)) {}

FileReader& FileReader::operator=(FileReader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) (void)close_fd(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

FileReader::~FileReader() {
  if (fd_ >= 0) (void)close_fd(fd_);
}

Status FileReader::read_at(std::uint64_t offset, void* dst, std::size_t n) const {
  if (fd_ < 0) return Status::failed_precondition("read_at on a closed FileReader");
  const ssize_t r = pread_full(fd_, dst, n, offset);
  if (r < 0) return Status::io_error(os_error(path_, "read failed", errno));
  if (static_cast<std::size_t>(r) < n) {
    return Status::data_loss(path_ + ": unexpected end of file: read " + std::to_string(r) + " of " +
                             std::to_string(n) + " bytes at offset " + std::to_string(offset) + " (file is " +
                             std::to_string(size_) + " bytes)");
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Directories

namespace {

// Takes an exclusive flock on `fd`, waiting for it unless `wait` is false; 0, or errno (EWOULDBLOCK: held by another).
int lock_fd(int fd, bool wait) noexcept {
  while (::flock(fd, wait ? LOCK_EX : LOCK_EX | LOCK_NB) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

// acquire (`wait`) and try_acquire: a DirLock holding nothing when `wait` is false and another holder has the lock.
Result<DirLock> lock_dir(const std::string& dir, const std::string& fallback_name, bool wait, DirLock (*held)(int fd)) {
  int fd;
  do {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Status::io_error(os_error(dir, "cannot open directory to lock it", errno));
  int err = lock_fd(fd, wait);
  if (err == 0) return held(fd);
  (void)close_fd(fd);
  if (err == EWOULDBLOCK) return DirLock();
  // EBADF: NFS wants a file open for writing; EINVAL/EOPNOTSUPP/ENOLCK: no flock on directories.
  if (err != EBADF && err != EINVAL && err != EOPNOTSUPP && err != ENOLCK)
    return Status::io_error(os_error(dir, "cannot lock directory", err));
  const std::string path = dir + "/" + fallback_name;
  do {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Status::io_error(os_error(path, "cannot create lock file", errno));
  err = lock_fd(fd, wait);
  if (err == 0) return held(fd);
  (void)close_fd(fd);
  if (err == EWOULDBLOCK) return DirLock();
  return Status::io_error(os_error(path, "cannot lock", err));
}

}  // namespace

Result<DirLock> DirLock::acquire(const std::string& dir, const std::string& fallback_name) {
  return lock_dir(dir, fallback_name, true, [](int fd) { return DirLock(fd); });
}

Result<DirLock> DirLock::try_acquire(const std::string& dir, const std::string& fallback_name) {
  return lock_dir(dir, fallback_name, false, [](int fd) { return DirLock(fd); });
}

DirLock::DirLock(DirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

DirLock::~DirLock() { release(); }

void DirLock::release() noexcept {
  if (fd_ < 0) return;
  // Closing the only descriptor of the open file description drops its flock.
  (void)close_fd(fd_);
  fd_ = -1;
}

Status fsync_dir(const std::string& dir) {
  int fd;
  do {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Status::io_error(os_error(dir, "cannot open directory", errno));
  Status status;
  // EINVAL: the file system does not support syncing directories; there is nothing more to do.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    status = Status::io_error(os_error(dir, "fsync of directory failed", errno));
  }
  (void)close_fd(fd);
  return status;
}

Status make_dirs(const std::string& dir) {
  if (dir.empty()) return Status::invalid_argument("make_dirs: empty path");
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return Status::ok();
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    const std::string prefix = dir.substr(0, pos);
    if (prefix.empty() || prefix.back() == '/') continue;  // "//" runs
    if (::mkdir(prefix.c_str(), 0777) == 0) continue;
    const int err = errno;
    // EEXIST also covers a concurrent creator winning the race.
    if (err == EEXIST || err == EACCES || err == EROFS) {
      if (::stat(prefix.c_str(), &st) == 0) {
        if (S_ISDIR(st.st_mode)) continue;
        return Status::io_error(prefix + ": exists and is not a directory (creating '" + dir + "')");
      }
    }
    return Status::io_error(os_error(prefix, ("mkdir failed (creating '" + dir + "')").c_str(), err));
  }
  return Status::ok();
}

}  // namespace strata::detail

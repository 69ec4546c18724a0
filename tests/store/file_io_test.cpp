#include "store/io/file_io.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "store/io/detail/crc32c.hpp"

namespace strata::detail {
namespace {

namespace fs = std::filesystem;

// The file's contents, or the error text (so a failed read shows up in the comparison).
std::string contents_of(const std::string& p) {
  auto r = read_file(p);
  return r.is_ok() ? *r : "<" + r.status().to_string() + ">";
}

// Disables fault injection however the test ends.
struct FaultGuard {
  explicit FaultGuard(std::int64_t n) { set_fault_after_bytes(n); }
  ~FaultGuard() { set_fault_after_bytes(-1); }
};

class FileIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "strata_file_io_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    set_fault_after_bytes(-1);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // Names of everything in the test directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  static std::string pattern(std::size_t n, unsigned seed) {
    std::string s(n, '\0');
    for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 9)) & 0xFF);
    return s;
  }

  std::string dir_;
};

TEST_F(FileIoTest, CommitWritesTheFileAndLeavesNoTemp) {
  const std::string target = path("a.bin");
  auto writer = AtomicFileWriter::create(target);
  ASSERT_TRUE(writer.is_ok()) << writer.status().to_string();
  EXPECT_EQ(writer->final_path(), target);
  EXPECT_EQ(writer->temp_path().rfind(target + ".tmp-", 0), 0u) << writer->temp_path();
  EXPECT_FALSE(fs::exists(target));  // nothing visible before commit

  ASSERT_TRUE(writer->append("hello, ", 7).is_ok());
  ASSERT_TRUE(writer->append("world", 5).is_ok());
  ASSERT_TRUE(writer->append(nullptr, 0).is_ok());
  EXPECT_EQ(writer->bytes(), 12u);
  EXPECT_EQ(writer->crc(), crc32c("hello, world", 12));
  ASSERT_TRUE(writer->commit().is_ok());

  auto contents = read_file(target);
  ASSERT_TRUE(contents.is_ok()) << contents.status().to_string();
  EXPECT_EQ(*contents, "hello, world");
  EXPECT_EQ(entries(), std::vector<std::string>{"a.bin"});
}

TEST_F(FileIoTest, CommitReplacesAnExistingFile) {
  const std::string target = path("a.bin");
  ASSERT_TRUE(write_file_atomic(target, "old contents that are longer").is_ok());
  ASSERT_TRUE(write_file_atomic(target, "new").is_ok());
  EXPECT_EQ(contents_of(target), "new");
  EXPECT_EQ(entries(), std::vector<std::string>{"a.bin"});
}

TEST_F(FileIoTest, EmptyFileRoundTrips) {
  const std::string target = path("empty");
  ASSERT_TRUE(write_file_atomic(target, "").is_ok());
  auto contents = read_file(target);
  ASSERT_TRUE(contents.is_ok());
  EXPECT_EQ(*contents, "");
}

TEST_F(FileIoTest, LargeAndMixedAppendsKeepOrderAndChecksum) {
  // Small appends (buffered), one that overflows the buffer, and ones bigger than the buffer.
  const std::string data = pattern((std::size_t{5} << 20) + 12345, 1);
  const std::size_t sizes[] = {1, 100, 4096, (1u << 20) - 3, 7, (2u << 20) + 1, 333};
  const std::string target = path("big.bin");
  auto writer = AtomicFileWriter::create(target);
  ASSERT_TRUE(writer.is_ok());
  std::size_t off = 0;
  for (std::size_t i = 0; off < data.size(); ++i) {
    const std::size_t n = std::min(sizes[i % std::size(sizes)], data.size() - off);
    ASSERT_TRUE(writer->append(data.data() + off, n).is_ok());
    off += n;
  }
  EXPECT_EQ(writer->bytes(), data.size());
  EXPECT_EQ(writer->crc(), crc32c(data.data(), data.size()));
  ASSERT_TRUE(writer->commit().is_ok());
  auto contents = read_file(target);
  ASSERT_TRUE(contents.is_ok());
  EXPECT_TRUE(*contents == data);
}

TEST_F(FileIoTest, AbandonedWriterLeavesNothing) {
  const std::string target = path("a.bin");
  {
    auto writer = AtomicFileWriter::create(target);
    ASSERT_TRUE(writer.is_ok());
    ASSERT_TRUE(writer->append("partial", 7).is_ok());
    ASSERT_TRUE(writer->append(pattern(3 << 20, 2).data(), 3 << 20).is_ok());  // some on disk already
    EXPECT_TRUE(fs::exists(writer->temp_path()));
  }
  EXPECT_TRUE(entries().empty());
}

TEST_F(FileIoTest, AbandonedWriterKeepsThePreviousFile) {
  const std::string target = path("a.bin");
  ASSERT_TRUE(write_file_atomic(target, "version 1").is_ok());
  {
    auto writer = AtomicFileWriter::create(target);
    ASSERT_TRUE(writer.is_ok());
    ASSERT_TRUE(writer->append("version 2", 9).is_ok());
  }
  EXPECT_EQ(contents_of(target), "version 1");
  EXPECT_EQ(entries(), std::vector<std::string>{"a.bin"});
}

TEST_F(FileIoTest, MovedWriterOwnsTheTempFile) {
  const std::string target = path("a.bin");
  auto created = AtomicFileWriter::create(target);
  ASSERT_TRUE(created.is_ok());
  AtomicFileWriter a = std::move(created).value();
  ASSERT_TRUE(a.append("abc", 3).is_ok());
  AtomicFileWriter b(std::move(a));
  EXPECT_EQ(a.append("x", 1).code(), StatusCode::kFailedPrecondition);  // NOLINT(bugprone-use-after-move)
  { AtomicFileWriter destroyed_empty = std::move(a); }                  // must not unlink b's file
  ASSERT_TRUE(b.append("def", 3).is_ok());
  AtomicFileWriter c;
  c = std::move(b);
  EXPECT_EQ(c.bytes(), 6u);
  ASSERT_TRUE(c.commit().is_ok());
  EXPECT_EQ(contents_of(target), "abcdef");
}

TEST_F(FileIoTest, MoveAssignmentAbandonsTheOverwrittenWriter) {
  auto first = AtomicFileWriter::create(path("first"));
  auto second = AtomicFileWriter::create(path("second"));
  ASSERT_TRUE(first.is_ok() && second.is_ok());
  ASSERT_TRUE(first->append("1", 1).is_ok());
  *first = std::move(*second);
  EXPECT_EQ(first->final_path(), path("second"));
  ASSERT_TRUE(first->commit().is_ok());
  EXPECT_EQ(entries(), std::vector<std::string>{"second"});
}

TEST_F(FileIoTest, UseAfterCommitIsAPreconditionError) {
  auto writer = AtomicFileWriter::create(path("a.bin"));
  ASSERT_TRUE(writer.is_ok());
  ASSERT_TRUE(writer->commit().is_ok());
  EXPECT_EQ(writer->append("x", 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(writer->commit().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(entries(), std::vector<std::string>{"a.bin"});  // the destructor leaves the file alone
  AtomicFileWriter empty;
  EXPECT_EQ(empty.append("x", 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(empty.commit().code(), StatusCode::kFailedPrecondition);
}

TEST_F(FileIoTest, CreateInAMissingDirectoryNamesThePath) {
  const std::string target = path("no/such/dir/a.bin");
  auto writer = AtomicFileWriter::create(target);
  ASSERT_FALSE(writer.is_ok());
  EXPECT_EQ(writer.status().code(), StatusCode::kIoError);
  EXPECT_NE(writer.status().message().find(target), std::string::npos) << writer.status().to_string();
  EXPECT_NE(writer.status().message().find("No such file or directory"), std::string::npos);
}

TEST_F(FileIoTest, CommitOverADirectoryFailsAndCleansUp) {
  const std::string target = path("sub");
  ASSERT_TRUE(make_dirs(target + "/child").is_ok());
  auto writer = AtomicFileWriter::create(target);
  ASSERT_TRUE(writer.is_ok());
  ASSERT_TRUE(writer->append("x", 1).is_ok());
  const Status s = writer->commit();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("rename"), std::string::npos) << s.to_string();
  EXPECT_EQ(entries(), std::vector<std::string>{"sub"});
  EXPECT_EQ(writer->commit().message(), s.message());  // sticky
}

TEST_F(FileIoTest, InjectedFaultLeavesThePreviousFileIntact) {
  const std::string target = path("table.bin");
  const std::string v1 = pattern(10000, 1);
  ASSERT_TRUE(write_file_atomic(target, v1).is_ok());
  {
    FaultGuard fault(2500);
    auto writer = AtomicFileWriter::create(target);
    ASSERT_TRUE(writer.is_ok());
    const std::string v2 = pattern(10000, 2);
    Status s;
    std::size_t off = 0;
    for (; off < v2.size() && s.is_ok(); off += 1000) s = writer->append(v2.data() + off, 1000);
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_EQ(s.message().rfind("injected fault", 0), 0u) << s.to_string();
    EXPECT_NE(s.message().find(target), std::string::npos) << s.to_string();
    EXPECT_EQ(off, 3000u);  // the third append crosses 2500
    EXPECT_EQ(writer->bytes(), 2500u);
    EXPECT_EQ(writer->commit().code(), StatusCode::kIoError);  // a failed writer cannot commit
    EXPECT_EQ(writer->append("x", 1).code(), StatusCode::kIoError);
  }
  EXPECT_TRUE(contents_of(target) == v1);
  EXPECT_EQ(entries(), std::vector<std::string>{"table.bin"});
}

TEST_F(FileIoTest, FaultBudgetIsSharedAcrossWritersAndCanBeDisabled) {
  FaultGuard fault(10);
  auto a = AtomicFileWriter::create(path("a"));
  auto b = AtomicFileWriter::create(path("b"));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_TRUE(a->append("123456", 6).is_ok());
  EXPECT_TRUE(b->append("1234", 4).is_ok());  // exactly at the limit: still fine
  EXPECT_TRUE(b->append(nullptr, 0).is_ok());
  EXPECT_EQ(a->append("7", 1).code(), StatusCode::kIoError);
  EXPECT_TRUE(b->commit().is_ok());
  // Every later writer fails too, as after a crash, until the hook is disabled.
  auto c = AtomicFileWriter::create(path("c"));
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->append("x", 1).code(), StatusCode::kIoError);
  set_fault_after_bytes(-1);
  EXPECT_TRUE(write_file_atomic(path("d"), "fine").is_ok());
  EXPECT_EQ(entries(), (std::vector<std::string>{"b", "d"}));
}

TEST_F(FileIoTest, FaultBudgetIsExactUnderConcurrency) {
  constexpr int kThreads = 4;
  constexpr std::int64_t kBudget = 100000;
  FaultGuard fault(kBudget);
  std::atomic<std::uint64_t> accepted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto w = AtomicFileWriter::create(path("t" + std::to_string(t)));
      ASSERT_TRUE(w.is_ok());
      const std::string chunk(97, static_cast<char>('a' + t));
      while (w->append(chunk.data(), chunk.size()).is_ok()) {
      }
      accepted += w->bytes();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(accepted.load(), static_cast<std::uint64_t>(kBudget));
  EXPECT_TRUE(entries().empty());
}

TEST_F(FileIoTest, ReadFileErrors) {
  auto missing = read_file(path("missing"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message().rfind(path("missing"), 0), 0u) << missing.status().to_string();

  auto dir = read_file(dir_);
  ASSERT_FALSE(dir.is_ok());
  EXPECT_EQ(dir.status().code(), StatusCode::kIoError);
  EXPECT_EQ(dir.status().message().rfind(dir_, 0), 0u) << dir.status().to_string();
}

TEST_F(FileIoTest, FileReaderReadsAtOffsetsAndReportsShortFiles) {
  const std::string data = pattern(5000, 3);
  ASSERT_TRUE(write_file_atomic(path("f"), data).is_ok());
  auto reader = FileReader::open(path("f"));
  ASSERT_TRUE(reader.is_ok());
  EXPECT_EQ(reader->size(), 5000u);
  std::string buf(100, '\0');
  ASSERT_TRUE(reader->read_at(4900, buf.data(), 100).is_ok());
  EXPECT_EQ(buf, data.substr(4900));
  const Status s = reader->read_at(4950, buf.data(), 100);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("read 50 of 100 bytes"), std::string::npos) << s.to_string();
  EXPECT_EQ(FileReader::open(path("none")).status().code(), StatusCode::kNotFound);
  FileReader moved = std::move(reader).value();
  EXPECT_TRUE(moved.read_at(0, buf.data(), 1).is_ok());
  FileReader closed;
  EXPECT_EQ(closed.read_at(0, buf.data(), 1).code(), StatusCode::kFailedPrecondition);
}

// An open reader keeps reading the file it opened after the path is removed or renamed over:
// load relies on this while a concurrent save replaces a checkpoint.
TEST_F(FileIoTest, FileReaderKeepsItsFileWhenThePathIsReplacedOrRemoved) {
  const std::string first = pattern(3000, 1), second = pattern(3000, 2);
  ASSERT_TRUE(write_file_atomic(path("f"), first).is_ok());
  auto reader = FileReader::open(path("f"));
  ASSERT_TRUE(reader.is_ok());
  ASSERT_TRUE(write_file_atomic(path("f"), second).is_ok());
  std::string buf(3000, '\0');
  ASSERT_TRUE(reader->read_at(0, buf.data(), buf.size()).is_ok());
  EXPECT_EQ(buf, first);
  ASSERT_EQ(::unlink(path("f").c_str()), 0);
  ASSERT_TRUE(reader->read_at(0, buf.data(), buf.size()).is_ok());
  EXPECT_EQ(buf, first);
}

// Whether another open file description could take the flock of `dir` now (it is released again).
bool lockable(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return ok;
}

TEST_F(FileIoTest, DirLockHoldsTheDirectoryUntilReleased) {
  {
    auto lock = DirLock::acquire(dir_, "LOCK");
    ASSERT_TRUE(lock.is_ok()) << lock.status().to_string();
    EXPECT_TRUE(lock->held());
    EXPECT_FALSE(lockable(dir_));
    DirLock moved = std::move(lock).value();  // the lock moves with the object
    EXPECT_TRUE(moved.held());
    EXPECT_FALSE(lockable(dir_));
  }
  EXPECT_TRUE(lockable(dir_));
  EXPECT_TRUE(entries().empty());  // the directory itself is locked: no lock file
  // A second acquirer waits for the first to let go.
  auto first = DirLock::acquire(dir_, "LOCK");
  ASSERT_TRUE(first.is_ok());
  std::atomic<bool> second_held{false};
  std::thread t([&] {
    auto second = DirLock::acquire(dir_, "LOCK");
    second_held = second.is_ok();
  });
  EXPECT_FALSE(second_held.load());
  first = DirLock();
  t.join();
  EXPECT_TRUE(second_held.load());
  const Status missing = DirLock::acquire(path("none"), "LOCK").status();
  EXPECT_EQ(missing.code(), StatusCode::kIoError);
  EXPECT_NE(missing.message().find(path("none")), std::string::npos) << missing.to_string();
}

// try_acquire never waits: it holds the lock when it is free and nothing while another holds it (a world's rank 0
// polls it between collectives).
TEST_F(FileIoTest, DirLockTryAcquireTakesAFreeLockAndNeverWaits) {
  auto first = DirLock::try_acquire(dir_, "LOCK");
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_TRUE(first->held());
  EXPECT_FALSE(lockable(dir_));
  std::atomic<bool> second_held{true};
  std::thread t([&] {  // another holder, as another thread or process sees it
    auto second = DirLock::try_acquire(dir_, "LOCK");
    second_held = !second.is_ok() || second->held();
  });
  t.join();
  EXPECT_FALSE(second_held.load());
  first = DirLock();
  auto third = DirLock::try_acquire(dir_, "LOCK");
  ASSERT_TRUE(third.is_ok());
  EXPECT_TRUE(third->held());
  const Status missing = DirLock::try_acquire(path("none"), "LOCK").status();
  EXPECT_EQ(missing.code(), StatusCode::kIoError);
  EXPECT_NE(missing.message().find(path("none")), std::string::npos) << missing.to_string();
}

TEST_F(FileIoTest, MakeDirsCreatesParentsAndIsIdempotent) {
  const std::string nested = path("a/b//c/d/");
  ASSERT_TRUE(make_dirs(nested).is_ok());
  EXPECT_TRUE(fs::is_directory(path("a/b/c/d")));
  EXPECT_TRUE(make_dirs(nested).is_ok());
  EXPECT_TRUE(make_dirs(path("a/b")).is_ok());
  EXPECT_TRUE(fsync_dir(path("a/b/c")).is_ok());
  EXPECT_TRUE(fsync_dir(".").is_ok());
  EXPECT_EQ(make_dirs("").code(), StatusCode::kInvalidArgument);
}

TEST_F(FileIoTest, MakeDirsThroughAFileFails) {
  ASSERT_TRUE(write_file_atomic(path("file"), "x").is_ok());
  const Status s = make_dirs(path("file/sub"));
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(path("file")), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("not a directory"), std::string::npos) << s.to_string();
}

TEST_F(FileIoTest, FsyncDirOfAMissingDirectoryFails) {
  const Status s = fsync_dir(path("missing"));
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message().rfind(path("missing"), 0), 0u) << s.to_string();
}

TEST_F(FileIoTest, TempNamesAreUniquePerWriter) {
  auto a = AtomicFileWriter::create(path("x"));
  auto b = AtomicFileWriter::create(path("x"));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_NE(a->temp_path(), b->temp_path());
  EXPECT_NE(a->temp_path().find(".tmp-" + std::to_string(::getpid()) + "-"), std::string::npos);
  ASSERT_TRUE(a->append("A", 1).is_ok());
  ASSERT_TRUE(b->append("B", 1).is_ok());
  ASSERT_TRUE(b->commit().is_ok());
  ASSERT_TRUE(a->commit().is_ok());  // last commit wins, whole
  EXPECT_EQ(contents_of(path("x")), "A");
}

}  // namespace
}  // namespace strata::detail

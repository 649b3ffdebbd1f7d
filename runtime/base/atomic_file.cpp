// Atomic whole-file writes (see atomic_file.h).
#include "runtime/base/atomic_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mt::rt {

namespace {
std::string dir_of(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
std::string os_error(const std::string &what, const std::string &path) {
  return what + " '" + path + "': " + std::strerror(errno);
}
} // namespace

std::string write_file_atomically(const std::string &path, std::string_view bytes) {
  return write_pieces_atomically(path, {bytes});
}

bool write_all(int fd, const void *data, size_t n) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    // At most 1 GiB per call: Linux writes no more than about 2 GiB at once.
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Writes straight into an existing non-regular file (`-o /dev/null`, a FIFO):
// renaming a temporary over it would replace the device with a plain file.
static std::string write_pieces_in_place(const std::string &path,
                                         const std::vector<std::string_view> &pieces) {
  int fd = ::open(path.c_str(), O_WRONLY);
  if (fd < 0)
    return os_error("cannot open", path);
  for (std::string_view bytes : pieces)
    if (!write_all(fd, bytes.data(), bytes.size())) {
      std::string err = os_error("cannot write", path);
      ::close(fd);
      return err;
    }
  ::close(fd);
  return "";
}

std::string write_pieces_atomically(const std::string &path,
                                    const std::vector<std::string_view> &pieces) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    return write_pieces_in_place(path, pieces);
  std::string tmpl = path + ".tmp.XXXXXX";
  int fd = mkstemp(tmpl.data());
  if (fd < 0)
    return os_error("cannot create a temporary file for", path);
  for (std::string_view bytes : pieces)
    if (!write_all(fd, bytes.data(), bytes.size())) {
      std::string err = os_error("cannot write", tmpl);
      ::close(fd);
      ::unlink(tmpl.c_str());
      return err;
    }
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0) {
    std::string err = os_error("cannot flush", tmpl);
    ::close(fd);
    ::unlink(tmpl.c_str());
    return err;
  }
  ::close(fd);
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    std::string err = os_error("cannot rename the temporary file onto", path);
    ::unlink(tmpl.c_str());
    return err;
  }
  // Persist the rename itself.
  int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return "";
}

bool make_directories(const std::string &dir, std::string *failed, int *error_number) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/')
      continue;
    std::string part = dir.substr(0, i);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      *failed = part;
      *error_number = errno;
      return false;
    }
  }
  struct stat st;
  if (!dir.empty() && (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
    *failed = dir;
    *error_number = ENOTDIR;
    return false;
  }
  return true;
}

} // namespace mt::rt
